//! The claims journal (`fail_open.claims_file`): the single-use claims a replica took while its
//! store was down, appended and synced to disk before the request they belong to is forwarded,
//! so a replica that is killed and restarted from the same file still refuses those tokens and
//! still writes them to the store.
//!
//! One line per event, `+ TYPE:ID TOKENID UNTIL` (a claim) or `- TYPE:ID TOKENID` (given back);
//! the file is emptied once every claim in it reached the store. A line that does not parse (a
//! write cut short by a crash) is skipped.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::queue::QueueTarget;

#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Arc<std::sync::Mutex<std::fs::File>>,
    /// What the file held when it was opened.
    loaded: Vec<(QueueTarget, String, u64)>,
}

/// One journal event.
pub enum Line<'a> {
    Claim(QueueTarget, &'a str, u64),
    Release(QueueTarget, &'a str),
}

impl Journal {
    /// Opens (or creates) the journal at `path` and reads the claims it holds.
    pub fn open(path: &Path) -> std::io::Result<Journal> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Journal {
            path: path.to_path_buf(),
            file: Arc::new(std::sync::Mutex::new(file)),
            loaded: parse(&text),
        })
    }

    /// The claims the file held at opening that still hold at `now_s`.
    pub fn loaded(&self, now_s: u64) -> Vec<(QueueTarget, String, u64)> {
        self.loaded
            .iter()
            .filter(|(_, _, until)| *until > now_s)
            .cloned()
            .collect()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event and syncs it to disk (on the blocking pool).
    pub async fn append(&self, line: Line<'_>) -> std::io::Result<()> {
        let text = match line {
            Line::Claim(t, id, until) => format!("+ {t} {id} {until}\n"),
            Line::Release(t, id) => format!("- {t} {id}\n"),
        };
        let file = self.file.clone();
        blocking(move || {
            let mut f = file
                .lock()
                .map_err(|_| std::io::Error::other("journal lock"))?;
            f.write_all(text.as_bytes())?;
            f.sync_data()
        })
        .await
    }

    /// Empties the file.
    pub async fn truncate(&self) -> std::io::Result<()> {
        let file = self.file.clone();
        blocking(move || {
            let f = file
                .lock()
                .map_err(|_| std::io::Error::other("journal lock"))?;
            f.set_len(0)?;
            f.sync_data()
        })
        .await
    }
}

async fn blocking(f: impl FnOnce() -> std::io::Result<()> + Send + 'static) -> std::io::Result<()> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
}

/// The claims a journal's text leaves standing: every `+` not followed by its `-`.
fn parse(text: &str) -> Vec<(QueueTarget, String, u64)> {
    let mut claims: Vec<(QueueTarget, String, u64)> = Vec::new();
    for line in text.lines() {
        let mut parts = line.split(' ');
        let (op, target, id) = (parts.next(), parts.next(), parts.next());
        let (Some(op), Some(target), Some(id)) = (op, target.and_then(QueueTarget::parse_key), id)
        else {
            continue;
        };
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        match (op, parts.next().and_then(|u| u.parse::<u64>().ok())) {
            ("+", Some(until)) => {
                claims.retain(|(t, i, _)| !(*t == target && i == id));
                claims.push((target, id.to_string(), until));
            }
            ("-", None) => claims.retain(|(t, i, _)| !(*t == target && i == id)),
            _ => {}
        }
    }
    claims
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TargetType;

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn lines_leave_the_claims_not_given_back() {
        let t = QueueTarget::new(TargetType::LimitedDrop, 42);
        let text = format!(
            "+ LIMITED_DROP:42 {A} 100\n+ LIMITED_DROP:42 {B} 200\n- LIMITED_DROP:42 {A}\n+ LIMITED_DROP:4"
        );
        assert_eq!(parse(&text), vec![(t, B.to_string(), 200)]);
        assert!(parse("garbage\n+ X:1 y 2\n").is_empty());
    }

    #[test]
    fn a_journal_reopened_holds_what_was_written() {
        let dir = std::env::temp_dir().join(format!("vq-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("claims.log");
        let _ = std::fs::remove_file(&path);
        let t = QueueTarget::new(TargetType::TicketingEvent, 7);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let j = Journal::open(&path).unwrap();
            j.append(Line::Claim(t, A, 500)).await.unwrap();
            j.append(Line::Claim(t, B, 500)).await.unwrap();
            j.append(Line::Release(t, B)).await.unwrap();
        });
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.loaded(10), vec![(t, A.to_string(), 500)]);
        assert!(j.loaded(600).is_empty(), "expired");
        rt.block_on(j.truncate()).unwrap();
        assert!(Journal::open(&path).unwrap().loaded(10).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The claims journal (`fail_open.claims_file`): every single-use claim a replica takes, so that
//! a replica killed and started again from the same file still knows the tokens it let through.
//!
//! - A claim taken while the store is down is appended and synced to disk before the request
//!   it belongs to is forwarded (`+ TYPE:ID TOKENID UNTIL`); the purchase waits at most
//!   `SYNC_WITHIN` for it, and is answered 503 otherwise.
//! - A claim the store recorded is appended without waiting (`= TYPE:ID TOKENID UNTIL`): a killed
//!   process loses nothing the kernel has, a crashed machine may lose the last of them.
//! - A claim given back is appended the same way as it was taken (`- TYPE:ID TOKENID`).
//!
//! One thread owns the file and writes in order; the file is rewritten from what the replica
//! remembers when it has grown well past that (`compact`). A line that does not parse (a write
//! cut short by a crash) is skipped when the file is read.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::time::Duration;

use crate::queue::QueueTarget;

/// How long a purchase waits for its claim to reach the disk.
const SYNC_WITHIN: Duration = Duration::from_secs(1);

/// Lines queued for the writer at most; past it, unsynced lines are dropped and synced ones
/// refused (the purchase waits).
const QUEUED_LINES: usize = 65_536;

/// A claim the file holds: the sale, the token id, until when (epoch seconds), and whether it
/// was taken without the store (still to be written to it).
pub type Entry = (QueueTarget, String, u64, bool);

#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    jobs: SyncSender<Job>,
    /// Lines written since the file was last rewritten.
    lines: AtomicU64,
    /// What the file held when it was opened.
    loaded: Vec<Entry>,
}

enum Job {
    /// A line, and where to say that it is on disk (synced) when that is awaited.
    Line(
        String,
        Option<tokio::sync::oneshot::Sender<std::io::Result<()>>>,
    ),
    /// The whole file again, from these lines.
    Rewrite(Vec<String>),
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

/// One journal event.
pub enum Line<'a> {
    /// Taken without the store: synced before the purchase is forwarded.
    Local(QueueTarget, &'a str, u64),
    /// Recorded by the store.
    Stored(QueueTarget, &'a str, u64),
    Release(QueueTarget, &'a str),
}

impl Line<'_> {
    fn text(&self) -> String {
        match self {
            Line::Local(t, id, until) => format!("+ {t} {id} {until}\n"),
            Line::Stored(t, id, until) => format!("= {t} {id} {until}\n"),
            Line::Release(t, id) => format!("- {t} {id}\n"),
        }
    }
}

impl Journal {
    /// Opens (or creates) the journal at `path`, reads the claims it holds and starts its
    /// writer thread.
    pub fn open(path: &Path) -> std::io::Result<Journal> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let file = open_append(path)?;
        let (jobs, queue) = sync_channel(QUEUED_LINES);
        let owned = path.to_path_buf();
        std::thread::Builder::new()
            .name("claims-journal".into())
            .spawn(move || writer(owned, file, queue))?;
        Ok(Journal {
            path: path.to_path_buf(),
            jobs,
            lines: AtomicU64::new(text.lines().count() as u64),
            loaded: parse(&text),
        })
    }

    /// The claims the file held at opening that still hold at `now_s`.
    pub fn loaded(&self, now_s: u64) -> Vec<Entry> {
        self.loaded
            .iter()
            .filter(|(_, _, until, _)| *until > now_s)
            .cloned()
            .collect()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a local claim and waits until it is on disk (at most `SYNC_WITHIN`).
    pub async fn append_synced(&self, line: Line<'_>) -> std::io::Result<()> {
        let (done, synced) = tokio::sync::oneshot::channel();
        self.send(Job::Line(line.text(), Some(done)))?;
        match tokio::time::timeout(SYNC_WITHIN, synced).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(std::io::Error::other("the journal's writer stopped")),
            Err(_) => Err(std::io::Error::other(
                "the disk did not take the claim in time",
            )),
        }
    }

    /// Appends a line without waiting for it (dropped if the writer is far behind).
    pub fn append(&self, line: Line<'_>) {
        let _ = self.send(Job::Line(line.text(), None));
    }

    /// Whether the file has grown well past the `remembered` claims it needs.
    pub fn due_for_rewrite(&self, remembered: usize) -> bool {
        let lines = self.lines.load(Ordering::Relaxed);
        lines > 4096 && lines > 2 * remembered as u64
    }

    /// Rewrites the file with these claims only.
    pub fn rewrite(&self, claims: &[Entry]) {
        let lines = claims
            .iter()
            .map(|(t, id, until, local)| {
                if *local {
                    Line::Local(*t, id, *until).text()
                } else {
                    Line::Stored(*t, id, *until).text()
                }
            })
            .collect::<Vec<_>>();
        self.lines.store(lines.len() as u64, Ordering::Relaxed);
        let _ = self.send(Job::Rewrite(lines));
    }

    fn send(&self, job: Job) -> std::io::Result<()> {
        if matches!(job, Job::Line(..)) {
            self.lines.fetch_add(1, Ordering::Relaxed);
        }
        self.jobs.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => std::io::Error::other("the journal's writer is behind"),
            TrySendError::Disconnected(_) => std::io::Error::other("the journal's writer stopped"),
        })
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// The writer thread: lines in order, flushed whenever the queue runs empty; a synced line is
/// flushed and synced before its sender hears back; a rewrite goes to a new file that replaces
/// the old one.
fn writer(path: PathBuf, file: std::fs::File, jobs: std::sync::mpsc::Receiver<Job>) {
    let mut out = std::io::BufWriter::new(file);
    while let Ok(first) = jobs.recv() {
        let mut next = Some(first);
        while let Some(job) = next {
            out = handle(&path, out, job);
            next = jobs.try_recv().ok();
        }
        let _ = out.flush();
    }
}

fn handle(
    path: &Path,
    mut out: std::io::BufWriter<std::fs::File>,
    job: Job,
) -> std::io::BufWriter<std::fs::File> {
    match job {
        Job::Line(text, done) => {
            let written = out.write_all(text.as_bytes());
            if let Some(done) = done {
                let synced = written
                    .and_then(|()| out.flush())
                    .and_then(|()| out.get_ref().sync_data());
                let _ = done.send(synced);
            }
            out
        }
        Job::Rewrite(lines) => {
            let _ = out.flush();
            let fresh = path.with_extension("rewrite");
            let rewritten = std::fs::File::create(&fresh).and_then(|mut f| {
                for l in &lines {
                    f.write_all(l.as_bytes())?;
                }
                f.sync_data()
            });
            match rewritten
                .and_then(|()| std::fs::rename(&fresh, path))
                .and_then(|()| open_append(path))
            {
                Ok(f) => std::io::BufWriter::new(f),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot rewrite the claims journal");
                    out
                }
            }
        }
    }
}

/// The claims a journal's text leaves standing: every `+` or `=` not followed by its `-`.
fn parse(text: &str) -> Vec<Entry> {
    let mut claims: Vec<Entry> = Vec::new();
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
        let until = parts.next().and_then(|u| u.parse::<u64>().ok());
        match (op, until) {
            ("+" | "=", Some(until)) => {
                claims.retain(|(t, i, ..)| !(*t == target && i == id));
                claims.push((target, id.to_string(), until, op == "+"));
            }
            ("-", None) => claims.retain(|(t, i, ..)| !(*t == target && i == id)),
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
            "+ LIMITED_DROP:42 {A} 100\n= LIMITED_DROP:42 {B} 200\n- LIMITED_DROP:42 {A}\n+ LIMITED_DROP:4"
        );
        assert_eq!(parse(&text), vec![(t, B.to_string(), 200, false)]);
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
            j.append_synced(Line::Local(t, A, 500)).await.unwrap();
            j.append(Line::Stored(t, B, 500));
            j.append(Line::Release(t, B));
            // A synced line after them: everything before it is on disk too.
            j.append_synced(Line::Local(t, A, 500)).await.unwrap();
        });
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.loaded(10), vec![(t, A.to_string(), 500, true)]);
        assert!(j.loaded(600).is_empty(), "expired");
        j.rewrite(&[(t, B.to_string(), 700, false)]);
        rt.block_on(async {
            // The rewrite is done once a later synced line is.
            j.append_synced(Line::Release(t, A)).await.unwrap();
        });
        assert_eq!(
            Journal::open(&path).unwrap().loaded(10),
            vec![(t, B.to_string(), 700, false)]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

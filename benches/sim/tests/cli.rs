//! The `vq-sim` binary as an operator runs it: `record-backend` on a free port answers purchases
//! and its record, and `simulate` refuses unusable arguments (exit 64, or clap's 2) saying
//! what it expects, before sending anything. (Sales played through real gateways are the
//! gateway's tests: `tests/topology.rs`, `tests/sales.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_vq-sim");

struct Backend {
    child: Child,
    addr: SocketAddr,
}

impl Backend {
    fn start() -> Backend {
        let mut child = Command::new(BIN)
            .args(["record-backend", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("record-backend listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .parse()
            .unwrap();
        Backend { child, addr }
    }

    /// One request on its own connection: (status, body).
    fn call(&self, method: &str, path: &str, user: Option<u64>) -> (u16, String) {
        let mut conn = TcpStream::connect(self.addr).unwrap();
        let user = user.map_or(String::new(), |u| format!("X-User-Id: {u}\r\n"));
        write!(
            conn,
            "{method} {path} HTTP/1.1\r\nHost: x\r\n{user}Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        conn.read_to_string(&mut raw).unwrap();
        let status = raw[9..12].parse().unwrap();
        let body = raw.split_once("\r\n\r\n").unwrap().1.to_string();
        (status, body)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn record_backend_records_one_purchase_per_user_and_sale() {
    let backend = Backend::start();
    assert_eq!(
        backend.call("POST", "/limited-drops/42/orders", Some(7)).0,
        200
    );
    assert_eq!(
        backend.call("POST", "/limited-drops/42/orders", Some(7)).0,
        409
    );
    assert_eq!(
        backend.call("POST", "/events/3/seats/select", Some(7)).0,
        200
    );
    assert_eq!(
        backend.call("POST", "/limited-drops/42/orders", None).0,
        400
    );
    assert_eq!(backend.call("GET", "/anything", None).0, 200);
    let (status, body) = backend.call("GET", "/_record", None);
    assert_eq!(status, 200);
    let record: vq_sim::backend::Record = serde_json::from_str(&body).unwrap();
    let bought: Vec<(&str, u64)> = record
        .purchases
        .iter()
        .map(|p| (p.sale.as_str(), p.user))
        .collect();
    assert_eq!(
        bought,
        [("limited-drop:42", 7), ("ticketing-event:3", 7)],
        "{body}"
    );
    assert_eq!(record.duplicates.len(), 1);
    assert_eq!(record.unidentified, 1);
    assert_eq!(record.other, 1);
}

#[test]
fn simulate_refuses_unusable_arguments_and_says_why_before_sending_anything() {
    let out = std::env::temp_dir().join(format!("vq-sim-cli-{}", std::process::id()));
    let cases: [(&[&str], &str); 4] = [
        (
            &["--url", "ftp://x", "--sale", "limited-drop:1"],
            "--url must be",
        ),
        (
            &["--url", "http://127.0.0.1:9", "--sale", "drop:1"],
            "a sale is",
        ),
        (
            &[
                "--url",
                "http://127.0.0.1:9",
                "--sale",
                "limited-drop:1",
                "--backend-record",
                "http://127.0.0.1:9/orders",
            ],
            "_record",
        ),
        (
            &[
                "--url",
                "http://127.0.0.1:9",
                "--sale",
                "limited-drop:1",
                "--abandon",
                "2",
            ],
            "shares between 0 and 1",
        ),
    ];
    for (args, expected) in cases {
        let output = Command::new(BIN)
            .arg("simulate")
            .args(args)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            matches!(output.status.code(), Some(64) | Some(2)),
            "{args:?}: {:?} {stderr}",
            output.status
        );
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!out.exists(), "{args:?} wrote a report");
    }
}

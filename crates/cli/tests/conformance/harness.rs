//! The processes of the suite: an `eventspool collector`, an `eventspool conformance` run, and
//! what the run printed. Every wait is bounded; children are killed when a test fails.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_eventspool");
/// The read-back hook the tests pass as --verify-cmd.
pub const READ_BACK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/conformance/read_back.py"
);
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// A child process killed when dropped.
pub struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `eventspool collector` (the reference collector as a process).
pub struct Collector {
    _child: Guard,
    pub addr: String,
    pub url: String,
}

impl Collector {
    pub fn start(flags: &[&str]) -> Collector {
        let mut child = Guard(
            Command::new(BIN)
                .args(["collector", "--listen", "127.0.0.1:0"])
                .args(flags)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("start collector"),
        );
        let stdout = child.0.stdout.take().expect("collector stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("collector printed its address");
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("collector first line {line:?}: {e}"));
        Collector {
            _child: child,
            addr: v["addr"].as_str().unwrap().to_string(),
            url: v["url"].as_str().unwrap().to_string(),
        }
    }

    /// `GET /stats`: {"distinct","received","requests"}.
    pub fn stats(&self) -> Value {
        let mut stream = TcpStream::connect(&self.addr).expect("connect for /stats");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "GET /stats HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let body = response.split_once("\r\n\r\n").expect("an answer").1;
        serde_json::from_str(body).expect("/stats is JSON")
    }
}

pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "stdout {:?} is not JSON: {e}; stderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Runs `eventspool ARGS` to the end (bounded).
pub fn run(args: &[&str]) -> Output {
    let mut child = Guard(
        Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start eventspool"),
    );
    let read = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = read(
        child
            .0
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = read(
        child
            .0
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "eventspool {args:?} did not finish within {RUN_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        code: status.code().unwrap_or(-1),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// `eventspool conformance --endpoint URL --json ARGS`, with its report.
pub fn conformance(url: &str, args: &[&str]) -> (Output, Value) {
    let mut all = vec!["conformance", "--endpoint", url, "--json"];
    all.extend_from_slice(args);
    let out = run(&all);
    let report = out.json();
    (out, report)
}

/// Check name → result ("pass", "fail", "n/a") of a report.
pub fn results(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["check"].as_str().unwrap().to_string(),
                c["result"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The entry of one check.
pub fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {report}"))
}

/// The checks that failed.
pub fn failed(report: &Value) -> Vec<String> {
    results(report)
        .into_iter()
        .filter(|(_, r)| r == "fail")
        .map(|(c, _)| c)
        .collect()
}

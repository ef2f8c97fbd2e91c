//! A small collector with one flaw at a time, for the behaviours that should not exist as
//! switches of the reference collector (a collector that does not dedup, drops a bad event
//! without a word, reads members by position, ...). Without a flaw it keeps the protocol, and
//! it does so differently from the reference collector: a malformed event is listed in
//! `rejected` of a 200 instead of failing the batch with 400.
//!
//! Plain std: a thread per connection, one request per connection (`Connection: close`), every
//! read bounded by a timeout. Each stored copy of an event is appended to `stored.txt`, which
//! the tests' `--verify-cmd` reads back.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// Keeps the protocol.
    None,
    /// Stores every copy and counts a resend as new.
    NoDedup,
    /// Leaves a malformed event out without listing it in `rejected`.
    SilentDrop,
    /// Answers 415 to a gzip body.
    NoGzip,
    /// Finds events by a textual `{"event_id":` at their start, so other member orders are 400.
    FieldOrder,
    /// Answers 400 instead of 413 to a body over its limit.
    TooLargeAs400,
    /// Writes `accepted` and `duplicates` as strings.
    CountsAsStrings,
    /// With more than [`BUSY_OVER`] requests in flight, holds the request past any deadline.
    HangUnderLoad,
    /// With more than [`BUSY_OVER`] in flight, answers 503 without `Retry-After`.
    ShedWithoutRetryAfter,
    /// With more than [`BUSY_OVER`] in flight, answers 503 with `Retry-After: 1` (correct).
    ShedWithRetryAfter,
}

impl Flaw {
    fn about_load(self) -> bool {
        matches!(
            self,
            Flaw::HangUnderLoad | Flaw::ShedWithoutRetryAfter | Flaw::ShedWithRetryAfter
        )
    }
}

/// Bodies larger than this (as sent) are refused.
pub const BODY_LIMIT: usize = 1 << 20;
/// Read at most this much of a body (larger ones are answered without it).
const MAX_READ: usize = 16 << 20;
const MAX_HEAD: usize = 64 << 10;
/// The load flaws apply beyond this many requests in flight.
const BUSY_OVER: usize = 4;
/// A load flaw's request takes this long, so that requests overlap.
const LOAD_HANDLING: Duration = Duration::from_millis(100);
/// How long `HangUnderLoad` holds a request: past the deadline the tests give (2 s).
const HANG: Duration = Duration::from_secs(3);
const IO_TIMEOUT: Duration = Duration::from_secs(10);

struct State {
    flaw: Flaw,
    stored: Mutex<HashMap<String, u64>>,
    file: PathBuf,
    in_flight: AtomicUsize,
    paths: Mutex<Vec<String>>,
}

pub struct Broken {
    pub url: String,
    addr: std::net::SocketAddr,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Broken {
    pub fn start(flaw: Flaw, dir: &Path) -> Broken {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the broken collector");
        let addr = listener.local_addr().unwrap();
        let file = dir.join("stored.txt");
        std::fs::write(&file, "").unwrap();
        let state = Arc::new(State {
            flaw,
            stored: Mutex::new(HashMap::new()),
            file,
            in_flight: AtomicUsize::new(0),
            paths: Mutex::new(Vec::new()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let state = Arc::clone(&state);
                    std::thread::spawn(move || serve(&state, stream));
                }
            })
        };
        Broken {
            url: format!("http://{addr}/v1/batch"),
            addr,
            state,
            stop,
            accept: Some(accept),
        }
    }

    /// The file of stored copies, one event id per line.
    pub fn stored_file(&self) -> &Path {
        &self.state.file
    }

    /// The path of every request it was sent.
    pub fn paths(&self) -> Vec<String> {
        self.state.paths.lock().unwrap().clone()
    }
}

impl Drop for Broken {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Request {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length.min(MAX_READ) {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

fn answer(stream: &mut TcpStream, status: u16, body: &Value, extra: &[(&str, &str)]) {
    let text = body.to_string();
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        text.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(text.as_bytes());
}

fn serve(state: &State, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let Some(request) = read_request(&mut stream) else {
        return;
    };
    state
        .paths
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(request.path.clone());
    if request.method != "POST" {
        return answer(&mut stream, 405, &json!({"error": "POST only"}), &[]);
    }
    let in_flight = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _guard = InFlight(&state.in_flight);
    if state.flaw.about_load() {
        std::thread::sleep(LOAD_HANDLING);
        if in_flight > BUSY_OVER {
            match state.flaw {
                Flaw::HangUnderLoad => std::thread::sleep(HANG),
                Flaw::ShedWithoutRetryAfter => {
                    return answer(&mut stream, 503, &json!({"error": "busy"}), &[]);
                }
                _ => {
                    return answer(
                        &mut stream,
                        503,
                        &json!({"error": "busy"}),
                        &[("Retry-After", "1")],
                    );
                }
            }
        }
    }
    let (status, body) = handle(state, &request);
    answer(&mut stream, status, &body, &[]);
}

/// The batch path: limit, encoding, parse, validate, store.
fn handle(state: &State, request: &Request) -> (u16, Value) {
    let flaw = state.flaw;
    if request.body.len() > BODY_LIMIT {
        let status = if flaw == Flaw::TooLargeAs400 {
            400
        } else {
            413
        };
        return (
            status,
            json!({"error": format!("body over {BODY_LIMIT} bytes")}),
        );
    }
    let gzip = request
        .headers
        .get("content-encoding")
        .is_some_and(|e| e.eq_ignore_ascii_case("gzip"));
    let decoded = if gzip {
        if flaw == Flaw::NoGzip {
            return (415, json!({"error": "unsupported content-encoding"}));
        }
        let mut out = Vec::new();
        let decoder = flate2::read::GzDecoder::new(&request.body[..]);
        if decoder.take(MAX_READ as u64).read_to_end(&mut out).is_err() {
            return (400, json!({"error": "bad gzip"}));
        }
        out
    } else {
        request.body.clone()
    };
    let Ok(Value::Object(top)) = serde_json::from_slice::<Value>(&decoded) else {
        return (400, json!({"error": "not a JSON object"}));
    };
    let Some(Value::Array(batch)) = top.get("batch") else {
        return (400, json!({"error": "missing batch"}));
    };
    if flaw == Flaw::FieldOrder {
        let text = String::from_utf8_lossy(&decoded);
        if text.matches("{\"event_id\":").count() < batch.len() {
            return (400, json!({"error": "an event must start with event_id"}));
        }
    }
    let (mut accepted, mut duplicates) = (0u64, 0u64);
    let mut rejected = Vec::new();
    let mut stored = state.stored.lock().unwrap_or_else(|e| e.into_inner());
    // A request held past its test's end finds the directory gone: a storage error then.
    let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(&state.file) else {
        return (500, json!({"error": "storage failed"}));
    };
    for event in batch {
        let id = event.get("event_id").and_then(Value::as_str).unwrap_or("");
        if let Err(why) = valid(event) {
            if flaw != Flaw::SilentDrop {
                rejected.push(json!({"event_id": id, "reason": why}));
            }
            continue;
        }
        let copies = stored.entry(id.to_string()).or_default();
        if *copies > 0 && flaw != Flaw::NoDedup {
            duplicates += 1;
            continue;
        }
        if writeln!(file, "{id}").is_err() {
            return (500, json!({"error": "storage failed"}));
        }
        *copies += 1;
        accepted += 1;
    }
    let mut body = if flaw == Flaw::CountsAsStrings {
        json!({"accepted": accepted.to_string(), "duplicates": duplicates.to_string()})
    } else {
        json!({"accepted": accepted, "duplicates": duplicates})
    };
    if !rejected.is_empty() {
        body["rejected"] = Value::Array(rejected);
    }
    (200, body)
}

/// docs/protocol.md §Event, checked field by field.
fn valid(event: &Value) -> Result<(), String> {
    let text = |key: &str| event.get(key).and_then(Value::as_str);
    if text("event_id").is_none_or(str::is_empty) {
        return Err("event_id must be a string".into());
    }
    if text("name").is_none_or(|n| !(1..=256).contains(&n.len())) {
        return Err("name must be 1 to 256 bytes".into());
    }
    if text("timestamp").is_none_or(|t| chrono::DateTime::parse_from_rfc3339(t).is_err()) {
        return Err("timestamp must be RFC 3339".into());
    }
    if event.get("properties").is_none_or(|p| !p.is_object()) {
        return Err("properties must be an object".into());
    }
    Ok(())
}

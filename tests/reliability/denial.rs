//! README §Consent end to end, with an app's own transport that holds every request 400 ms on
//! its way to the reference collector: the app denies while a request is in flight, at offsets
//! spread over the request's life; no request starts after `set_consent(Denied)` returned, and
//! the store directory keeps no byte of a tracked value, also when the process is killed
//! (SIGKILL) between the denial's record and its delete.
//!
//! `EVENTSPOOL_DENIAL_ROUNDS=200 cargo test --test reliability denial -- --nocapture` runs more
//! rounds.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use eventspool::{
    Config, Consent, DeliveryState, DropReason, EventSpool, HttpRequest, HttpResponse, Transport,
    TransportError,
};
use eventspool_collector::{CollectorConfig, ReferenceCollector};
use futures_util::future::BoxFuture;
use serde_json::json;

use crate::common::{crash_child, env_count};

const WAIT: Duration = Duration::from_secs(30);
const HOLD: Duration = Duration::from_millis(400);

/// The app's HTTP stack: every request is held `HOLD` before it is POSTed, over a plain socket,
/// to the collector on 127.0.0.1. It notes when each request reached it and how many are open.
struct HeldTransport {
    starts: Mutex<Vec<Instant>>,
    open: Arc<AtomicU64>,
}

impl Transport for HeldTransport {
    fn send(
        &self,
        request: HttpRequest,
    ) -> BoxFuture<'static, Result<HttpResponse, TransportError>> {
        self.starts.lock().unwrap().push(Instant::now());
        let open = self.open.clone();
        open.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(HOLD).await;
            let result = tokio::task::spawn_blocking(move || post(&request))
                .await
                .map_err(|e| TransportError::Io(e.to_string()))
                .and_then(|r| r);
            open.fetch_sub(1, Ordering::SeqCst);
            result
        })
    }
}

fn post(request: &HttpRequest) -> Result<HttpResponse, TransportError> {
    use std::io::{Read, Write};
    let io = |e: std::io::Error| TransportError::Io(e.to_string());
    let rest = request.url.strip_prefix("http://").expect("loopback http");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream =
        std::net::TcpStream::connect(host).map_err(|e| TransportError::Connect(e.to_string()))?;
    stream.set_read_timeout(Some(request.timeout)).map_err(io)?;
    let mut head = format!(
        "{} /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        request.method,
        request.body.len()
    );
    for (k, v) in &request.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(&request.body).map_err(io)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(io)?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| TransportError::Io("no end of headers".into()))?;
    let status = String::from_utf8_lossy(&answer[..split])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| TransportError::Io("no status line".into()))?;
    Ok(HttpResponse {
        status,
        headers: Vec::new(),
        body: answer[split + 4..].to_vec(),
        truncated: false,
    })
}

/// The files of the store directory that hold `needle` (database, WAL, SHM, lock), read whole,
/// as tests/integration/encryption.rs scans them.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap_or_default();
        if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            hits.push(path.display().to_string());
        }
    }
    hits
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// 20 rounds (more with `EVENTSPOOL_DENIAL_ROUNDS`): a backlog drains through the held
/// transport, and the app denies at an offset spread over the 400 ms a request is in flight
/// (from just after it left to just before its answer, when the next batch is being taken).
#[test]
fn no_send_starts_after_a_denial_returned_and_nothing_stays_on_disk() {
    let rounds = env_count("EVENTSPOOL_DENIAL_ROUNDS", 20);
    let collector = ReferenceCollector::start(CollectorConfig::default()).expect("collector");
    let mut late = Vec::new();
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let mark = format!("denial-e2e-secret-{round:03}");
        let open = Arc::new(AtomicU64::new(0));
        let transport = Arc::new(HeldTransport {
            starts: Mutex::new(Vec::new()),
            open: open.clone(),
        });
        let mut c = Config::new(collector.url());
        c.db_path = Some(dir.path().join("events.db"));
        c.memory_capacity = 10;
        c.max_batch_events = 4;
        c.min_batch_interval_ms = 0;
        c.flush_at = 1_000;
        c.compression = eventspool::Compression::None;
        let spool = EventSpool::builder(c)
            .transport(transport.clone())
            .open()
            .unwrap();
        for i in 0..40 {
            spool
                .track("private", json!({ "secret": format!("{mark}-{i:02}") }))
                .unwrap();
        }
        spool.persist().unwrap();
        spool.flush();
        wait_until("the first request", || {
            !transport.starts.lock().unwrap().is_empty()
        });
        // Offsets from 0 to just under the hold, in steps over the rounds; the last ones land
        // where one answer comes back and the next batch is taken.
        let offset = HOLD.mul_f64((round % 20) as f64 / 20.0 + 0.02 * (round / 20) as f64);
        std::thread::sleep(offset.min(HOLD));
        spool.set_consent(Consent::Denied).unwrap();
        let returned = Instant::now();
        wait_state(&spool, DeliveryState::Disabled);
        wait_until("the request on the wire to end", || {
            open.load(Ordering::SeqCst) == 0
        });
        let starts = transport.starts.lock().unwrap().clone();
        let after = starts.iter().filter(|t| **t > returned).count();
        if after > 0 {
            late.push((round, offset, after));
        }
        // Once the request on the wire is answered, nothing of the user is left.
        wait_until("the worker to settle", || spool.stats().pending == 0);
        let hits = files_holding(dir.path(), &mark);
        assert!(
            hits.is_empty(),
            "round {round}: tracked values left in {hits:?}"
        );
        let stats = spool.stats();
        assert_eq!(
            stats.delivered + stats.dropped(DropReason::ConsentDenied),
            40,
            "round {round}: each event sent before the denial or deleted: {stats:?}"
        );
        spool.shutdown(WAIT).unwrap();
        let hits = files_holding(dir.path(), &mark);
        assert!(
            hits.is_empty(),
            "round {round}: after shutdown, left in {hits:?}"
        );
    }
    assert!(
        late.is_empty(),
        "requests started after set_consent(Denied) returned (round, offset, requests): {late:?}"
    );
}

/// Holds the worker the `at`-th time it shows `Sending` (it has taken a batch and is about to
/// hand it to the transport) until the test lets it go: the app's denial then lands exactly
/// between taking a batch and sending it, the ordering the offsets above rarely hit.
struct HoldAtSending {
    at: u64,
    seen: AtomicU64,
    reached: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl eventspool::DeliveryObserver for HoldAtSending {
    fn on_state(&self, status: &eventspool::DeliveryStatus) {
        if status.state != DeliveryState::Sending {
            return;
        }
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 != self.at {
            return;
        }
        let reached = self.reached.lock().unwrap().take().expect("held once");
        let release = self.release.lock().unwrap().take().expect("released once");
        reached.send(()).unwrap();
        release
            .recv_timeout(WAIT)
            .expect("the test releases the worker");
    }
}

/// 20 rounds (more with `EVENTSPOOL_DENIAL_ROUNDS`) through the held transport: the worker is
/// stopped between taking its batch and sending it, after 0 to 3 requests of 400 ms went
/// through, and the app denies right then. No request starts after `set_consent(Denied)`
/// returned; each event was delivered before the denial or deleted; the store directory keeps
/// no byte of a tracked value.
#[test]
fn a_denial_between_taking_a_batch_and_sending_it_starts_no_request() {
    let rounds = env_count("EVENTSPOOL_DENIAL_ROUNDS", 20);
    let collector = ReferenceCollector::start(CollectorConfig::default()).expect("collector");
    let mut late = Vec::new();
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let mark = format!("denial-held-secret-{round:03}");
        let open = Arc::new(AtomicU64::new(0));
        let transport = Arc::new(HeldTransport {
            starts: Mutex::new(Vec::new()),
            open: open.clone(),
        });
        let (reached_tx, reached) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let before = round % 4;
        let hold = Arc::new(HoldAtSending {
            at: before + 1,
            seen: AtomicU64::new(0),
            reached: Mutex::new(Some(reached_tx)),
            release: Mutex::new(Some(release_rx)),
        });
        let mut c = Config::new(collector.url());
        c.db_path = Some(dir.path().join("events.db"));
        c.memory_capacity = 10;
        c.max_batch_events = 4;
        c.min_batch_interval_ms = 0;
        c.flush_at = 1_000;
        c.compression = eventspool::Compression::None;
        let spool = EventSpool::builder(c)
            .transport(transport.clone())
            .observer(hold)
            .open()
            .unwrap();
        for i in 0..40 {
            spool
                .track("private", json!({ "secret": format!("{mark}-{i:02}") }))
                .unwrap();
        }
        spool.persist().unwrap();
        spool.flush();
        reached
            .recv_timeout(WAIT)
            .expect("the worker takes a batch");
        assert_eq!(
            transport.starts.lock().unwrap().len() as u64,
            before,
            "round {round}: requests before the held one"
        );
        spool.set_consent(Consent::Denied).unwrap();
        let returned = Instant::now();
        release.send(()).unwrap();
        wait_state(&spool, DeliveryState::Disabled);
        wait_until("the worker to settle", || spool.stats().pending == 0);
        wait_until("no request open", || open.load(Ordering::SeqCst) == 0);
        let after = transport
            .starts
            .lock()
            .unwrap()
            .iter()
            .filter(|t| **t > returned)
            .count();
        if after > 0 {
            late.push((round, before, after));
        }
        let stats = spool.stats();
        assert_eq!(
            stats.delivered + stats.dropped(DropReason::ConsentDenied),
            40,
            "round {round}: each event sent before the denial or deleted: {stats:?}"
        );
        let hits = files_holding(dir.path(), &mark);
        assert!(
            hits.is_empty(),
            "round {round}: tracked values left in {hits:?}"
        );
        spool.shutdown(WAIT).unwrap();
        let hits = files_holding(dir.path(), &mark);
        assert!(
            hits.is_empty(),
            "round {round}: after shutdown, left in {hits:?}"
        );
    }
    assert!(
        late.is_empty(),
        "requests started after set_consent(Denied) returned (round, requests before the held \
         one, requests after): {late:?}"
    );
}

fn wait_state(spool: &EventSpool, want: DeliveryState) {
    spool
        .wait_for(WAIT, |s| s.state == want)
        .unwrap_or_else(|| panic!("never {want:?}; state is {}", spool.state()));
}

/// The child records the denial and is killed (SIGKILL) before it deletes anything; the next
/// open of the store finishes the deletion before anything else, so the directory holds no
/// tracked value once `open()` returned and a later grant sends none of them.
#[test]
fn a_kill_between_the_record_and_the_delete_leaves_nothing_after_the_next_open() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).expect("collector");
    for round in 0..3u64 {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("events.db");
        let seed = 7_000 + round;
        let mark = format!("deny-secret-{seed}");
        let mut child = Command::new(crash_child())
            .arg(&db)
            .arg(collector.url())
            .arg(seed.to_string())
            .arg("120")
            .arg("deny")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn crash_child");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.next().and_then(|l| l.ok());
        assert_eq!(
            first.as_deref(),
            Some("recorded"),
            "round {round}: the child reached the point between record and delete"
        );
        // SIGKILL: no destructor, no shutdown(), nothing after the record runs.
        child.kill().expect("SIGKILL the child");
        let _ = child.wait();
        assert!(
            !files_holding(dir.path(), &mark).is_empty(),
            "round {round}: the kill landed before the delete (or this test proves nothing)"
        );
        assert_eq!(
            eventspool::admin::inspect(&db).unwrap().consent,
            Some(Consent::Denied),
            "round {round}: the denial was recorded"
        );

        let mut c = Config::new(collector.url());
        c.db_path = Some(db.clone());
        c.flush_at = 1;
        c.min_batch_interval_ms = 0;
        let spool = EventSpool::open(c).unwrap();
        let hits = files_holding(dir.path(), &mark);
        assert!(
            hits.is_empty(),
            "round {round}: after the open, tracked values left in {hits:?}"
        );
        assert_eq!(spool.consent(), Consent::Denied);
        assert_eq!(spool.stats().restored, 0, "round {round}");
        spool.set_consent(Consent::Granted).unwrap();
        spool.track("after", json!({})).unwrap();
        assert!(
            spool.wait_drained(WAIT),
            "round {round}: {} {:?} requests {}",
            spool.state(),
            spool.stats(),
            collector.request_count()
        );
        let sent: Vec<_> = collector
            .events()
            .into_iter()
            .filter(|e| e.name == "private")
            .collect();
        assert!(sent.is_empty(), "round {round}: denied events were sent");
        spool.shutdown(WAIT).unwrap();
        let status = eventspool::admin::inspect(&db).unwrap();
        assert_eq!(
            status.dropped.get("consent_denied"),
            Some(&120),
            "round {round}: {status:?}"
        );
    }
}

//! Stores earlier releases wrote, opened by this build: one row per fixture of
//! tests/fixtures/stores (its README says how each was made, by which commit). Each store holds
//! pending events, two of them leased mid-send (the sender was killed with their batch in
//! flight), and two quarantined events. Opened here, the ledger counts what it held as
//! `restored`, every event is delivered with its id and the bytes that release sent from the
//! same file (`sent.jsonl`), the leased ones say they were sent before, and the quarantined
//! ones keep id and reason and, redriven, go out as that release sent them (`redrive.jsonl`).
//!
//! The table is the directory: a fixture added there (the next schema version's) is tested
//! without a change here, and one missing for a version this build reads fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use eventspool::{
    Config, EventSpool, HttpRequest, HttpResponse, ListFilter, ManualClock, Selector, Transport,
    TransportError, admin,
};
use eventspool_collector::ReferenceCollector;
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::common::{WAIT, collector};

#[derive(Deserialize)]
struct Manifest {
    name: String,
    schema_version: i64,
    encryption_keys: Option<String>,
    /// When the store was last written: the spool here opens it an hour later.
    made_at_ms: i64,
    pending: Vec<Held>,
    quarantined: Vec<Dead>,
}

#[derive(Deserialize)]
struct Held {
    event_id: String,
    critical: bool,
    leased: bool,
}

#[derive(Deserialize)]
struct Dead {
    event_id: String,
    reason: String,
}

/// One request as `record.py` saw it from the old release, or as the transport here saw it.
#[derive(Deserialize)]
struct Sent {
    attempt: Option<u32>,
    body: String,
}

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow)]
    batch: Vec<&'a RawValue>,
}

struct Fixture {
    dir: PathBuf,
    m: Manifest,
}

fn fixtures() -> Vec<Fixture> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stores");
    let mut all: Vec<Fixture> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|dir| dir.join("manifest.json").is_file())
        .map(|dir| Fixture {
            m: serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
            dir,
        })
        .collect();
    all.sort_by(|a, b| a.dir.cmp(&b.dir));
    all
}

/// Each event of each request, as bytes, with the request's `X-Eventspool-Attempt`, by id
/// (the first request that carried it).
fn events_sent(requests: &[Sent]) -> BTreeMap<String, (String, Option<u32>)> {
    let mut out = BTreeMap::new();
    for r in requests {
        let body: Body<'_> = serde_json::from_str(&r.body)
            .unwrap_or_else(|e| panic!("a body without a batch ({e}): {}", r.body));
        for raw in body.batch {
            let id = serde_json::from_str::<serde_json::Value>(raw.get()).unwrap()["event_id"]
                .as_str()
                .unwrap()
                .to_string();
            out.entry(id)
                .or_insert_with(|| (raw.get().to_string(), r.attempt));
        }
    }
    out
}

fn read_sent(path: &Path) -> Vec<Sent> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Posts to the reference collector over a plain socket and keeps each request's body (gzip
/// decoded) and attempt header: the bytes this build sends, to set beside the old release's.
#[derive(Default)]
struct Recording {
    seen: Arc<Mutex<Vec<Sent>>>,
}

impl Transport for Recording {
    fn send(
        &self,
        request: HttpRequest,
    ) -> BoxFuture<'static, Result<HttpResponse, TransportError>> {
        let header = |name: &str| {
            request
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let body = if header("content-encoding").as_deref() == Some("gzip") {
            let mut out = String::new();
            std::io::Read::read_to_string(
                &mut flate2::read::GzDecoder::new(&request.body[..]),
                &mut out,
            )
            .expect("a gzip body");
            out
        } else {
            String::from_utf8(request.body.clone()).expect("a UTF-8 body")
        };
        self.seen.lock().unwrap().push(Sent {
            attempt: header("x-eventspool-attempt").and_then(|v| v.parse().ok()),
            body,
        });
        Box::pin(async move {
            tokio::task::spawn_blocking(move || post(&request))
                .await
                .map_err(|e| TransportError::Io(e.to_string()))?
        })
    }
}

/// One HTTP/1.1 POST on its own connection to the loopback collector.
fn post(request: &HttpRequest) -> Result<HttpResponse, TransportError> {
    use std::io::{Read, Write};
    let io = |e: std::io::Error| TransportError::Io(e.to_string());
    let rest = request.url.strip_prefix("http://").expect("loopback http");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream = std::net::TcpStream::connect(host).map_err(io)?;
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
    let head = String::from_utf8_lossy(&answer[..split]).to_string();
    let status = head
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

/// The fixture's store opened by this build, an hour after it was last written, delivering to
/// `collector` through a [`Recording`].
fn open(
    f: &Fixture,
    db: &Path,
    collector: &ReferenceCollector,
) -> (EventSpool, Arc<Mutex<Vec<Sent>>>) {
    let mut config = Config::new(collector.url());
    config.min_batch_interval_ms = 0;
    config.db_path = Some(db.to_path_buf());
    if let Some(keys) = &f.m.encryption_keys {
        config.set("encryption_keys", keys).unwrap();
    }
    let recording = Recording::default();
    let seen = recording.seen.clone();
    let clock = Arc::new(Arc::new(ManualClock::auto_advancing(
        f.m.made_at_ms + 3_600_000,
    )));
    let spool = EventSpool::builder(config)
        .clock(clock)
        .transport(Arc::new(recording))
        .open()
        .unwrap_or_else(|e| panic!("{}: open: {e}", f.m.name));
    (spool, seen)
}

#[test]
fn there_is_a_fixture_for_every_schema_version_this_build_reads() {
    let all = fixtures();
    for f in &all {
        let conn = rusqlite::Connection::open_with_flags(
            f.dir.join("store.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, f.m.schema_version, "{}: the manifest", f.m.name);
        assert!(
            version <= admin::SCHEMA_VERSION,
            "{}: schema {version} is past this build's {}",
            f.m.name,
            admin::SCHEMA_VERSION
        );
    }
    for version in 1..=admin::SCHEMA_VERSION {
        assert!(
            all.iter().any(|f| f.m.schema_version == version),
            "no fixture store of schema version {version}: make one with the release that \
             writes it (tests/fixtures/stores/README.md)"
        );
    }
}

#[test]
fn every_fixture_store_opens_and_delivers_what_it_held_as_its_release_would() {
    for f in fixtures() {
        let name = &f.m.name;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("events.db");
        std::fs::copy(f.dir.join("store.db"), &db).unwrap();
        let collector = collector();
        let (spool, seen) = open(&f, &db, &collector);

        let held = f.m.pending.len() as u64;
        let stats = spool.stats();
        assert_eq!(
            stats.stores_recovered, 0,
            "{name}: the store was moved aside"
        );
        assert_eq!(stats.restored, held, "{name}: restored");
        let listed = spool.quarantine_list(&ListFilter::default()).unwrap();
        let kept: Vec<(&str, &str)> = listed
            .iter()
            .map(|q| (q.event_id.as_str(), q.reason.as_str()))
            .collect();
        let expected: Vec<(&str, &str)> =
            f.m.quarantined
                .iter()
                .map(|q| (q.event_id.as_str(), q.reason.as_str()))
                .collect();
        assert_eq!(kept, expected, "{name}: quarantined ids and reasons");

        // Everything it held goes out, with its id and the bytes the old release sent.
        spool.flush();
        assert!(spool.wait_drained(WAIT), "{name}: {}", spool.state());
        let now = events_sent(&seen.lock().unwrap());
        let then = events_sent(&read_sent(&f.dir.join("sent.jsonl")));
        assert_eq!(
            now.keys().collect::<Vec<_>>(),
            then.keys().collect::<Vec<_>>(),
            "{name}: the ids sent"
        );
        for e in &f.m.pending {
            assert!(collector.contains(&e.event_id), "{name}: {}", e.event_id);
            let ((bytes_now, attempt_now), (bytes_then, attempt_then)) =
                (&now[&e.event_id], &then[&e.event_id]);
            assert_eq!(bytes_now, bytes_then, "{name}: the bytes of {}", e.event_id);
            assert_eq!(
                attempt_now, attempt_then,
                "{name}: X-Eventspool-Attempt with {}",
                e.event_id
            );
            // Schema 1 kept no send counts: its leased rows come back as never sent.
            if e.leased && f.m.schema_version >= 2 {
                assert!(
                    attempt_now.unwrap() >= 2,
                    "{name}: leased {} went out as a first send",
                    e.event_id
                );
            }
        }
        let critical: Vec<&str> =
            f.m.pending
                .iter()
                .filter(|e| e.critical)
                .map(|e| e.event_id.as_str())
                .collect();
        if let Some(first) = seen.lock().unwrap().first() {
            let body: Body<'_> = serde_json::from_str(&first.body).unwrap();
            for (raw, id) in body.batch.iter().zip(&critical) {
                assert!(
                    raw.get().contains(id),
                    "{name}: the critical lane goes first"
                );
            }
        }
        let stats = spool.stats();
        assert_eq!(
            (stats.delivered, stats.pending, stats.quarantined),
            (held, 0, 0),
            "{name}: {stats:?}"
        );
        assert!(stats.dropped.values().all(|n| *n == 0), "{name}: {stats:?}");

        // The dead letters, redriven, go out with their ids and the bytes the old release's
        // redrive sent.
        let from = seen.lock().unwrap().len();
        assert_eq!(
            spool.quarantine_redrive(&Selector::All).unwrap(),
            2,
            "{name}"
        );
        spool.flush();
        assert!(spool.wait_drained(WAIT), "{name}: {}", spool.state());
        let now = events_sent(&seen.lock().unwrap()[from..]);
        let then = events_sent(&read_sent(&f.dir.join("redrive.jsonl")));
        assert_eq!(now, then, "{name}: the redriven events' bytes");
        for q in &f.m.quarantined {
            assert!(collector.contains(&q.event_id), "{name}: {}", q.event_id);
        }
        let stats = spool.stats();
        assert_eq!(
            (
                stats.restored,
                stats.redriven,
                stats.delivered,
                stats.pending
            ),
            (held, 2, held + 2, 0),
            "{name}: the ledger"
        );
        assert_eq!(collector.distinct_count(), held + 2, "{name}");
        spool.shutdown(WAIT).unwrap();
        drop(spool);

        // Upgraded in place: the file is now this build's version, and holds nothing.
        let status = admin::inspect(&db).unwrap();
        assert_eq!(
            (status.schema_version, status.pending),
            (admin::SCHEMA_VERSION, 0),
            "{name}"
        );
    }
}

/// A store of a later release (a higher `user_version`) is moved aside, byte for byte, and the
/// spool starts on a fresh store: nothing of it is read or changed.
#[test]
fn a_store_of_a_later_release_is_moved_aside_untouched() {
    let newest = fixtures()
        .into_iter()
        .max_by_key(|f| f.m.schema_version)
        .expect("a fixture");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    std::fs::copy(newest.dir.join("store.db"), &db).unwrap();
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "user_version", admin::SCHEMA_VERSION + 1)
            .unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let collector = collector();
    let (spool, _) = open(&newest, &db, &collector);
    let stats = spool.stats();
    assert_eq!((stats.stores_recovered, stats.restored), (1, 0));
    spool.shutdown(WAIT).unwrap();
    let aside: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.to_string_lossy();
            name.contains(".unusable-") && !name.ends_with("-wal") && !name.ends_with("-shm")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        std::fs::read(&aside[0]).unwrap() == before,
        "moved aside as it was"
    );
    let message = admin::inspect(&aside[0]).unwrap_err().to_string();
    assert!(
        message.contains(&format!("schema version {}", admin::SCHEMA_VERSION + 1)),
        "{message}"
    );
}

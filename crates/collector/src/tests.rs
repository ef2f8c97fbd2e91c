//! End-to-end tests over real loopback sockets: reqwest for ordinary requests, raw
//! `TcpStream`s where the point is what happens to the connection itself.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{Value, json};

use super::*;

const WAIT: Duration = Duration::from_secs(5);
const TS: &str = "2026-11-29T11:58:00.001Z";

fn start_with(behavior: Behavior) -> ReferenceCollector {
    ReferenceCollector::start(CollectorConfig {
        behavior,
        ..CollectorConfig::default()
    })
    .expect("collector starts")
}

fn start() -> ReferenceCollector {
    start_with(Behavior::default())
}

fn client() -> reqwest::Client {
    // reqwest is built without a default TLS provider; it wants one even for plain http.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client builds")
}

fn event(id: &str, name: &str) -> Value {
    json!({"event_id": id, "name": name, "timestamp": TS, "session_id": "s-1",
           "properties": {"screen": "home"}})
}

fn batch_of(events: &[(&str, &str)]) -> String {
    let batch: Vec<Value> = events.iter().map(|(id, name)| event(id, name)).collect();
    json!({"sent_at": "2026-11-29T12:00:03.120Z", "batch": batch}).to_string()
}

fn batch(ids: &[&str]) -> String {
    let events: Vec<(&str, &str)> = ids.iter().map(|id| (*id, "screen_view")).collect();
    batch_of(&events)
}

struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    json: Value,
}

async fn post_with(
    client: &reqwest::Client,
    url: &str,
    body: impl Into<reqwest::Body>,
    headers: &[(&str, &str)],
) -> Result<Answer, reqwest::Error> {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("user-agent", "eventspool/0.1.0")
        .header("x-eventspool-attempt", "1")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await?;
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Ok(Answer {
        status,
        headers,
        json,
    })
}

async fn post(c: &ReferenceCollector, body: impl Into<reqwest::Body>) -> Answer {
    post_with(&client(), &c.url(), body, &[])
        .await
        .expect("request completes")
}

/// A one-shot HTTP/1.1 POST over a raw socket; returns what the server sent before closing.
fn raw_post(addr: SocketAddr, body: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(WAIT))?;
    write!(
        s,
        "POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[tokio::test]
async fn stores_once_by_event_id_and_counts_duplicates() {
    let c = start();
    let first = post(&c, batch(&["a", "b"])).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.json, json!({"accepted": 2, "duplicates": 0}));
    let second = post(&c, batch(&["b", "c", "c"])).await;
    assert_eq!(second.json, json!({"accepted": 1, "duplicates": 2}));

    assert_eq!(c.distinct_count(), 3);
    assert_eq!(c.received_count(), 5);
    assert!(c.contains("c") && !c.contains("z"));
    let events = c.events();
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(events[2].first_seen_request, 1);
    assert_eq!(events[0].session_id.as_deref(), Some("s-1"));
    assert_eq!(events[0].properties, json!({"screen": "home"}));

    assert_eq!(c.request_count(), 2);
    let r = &c.requests()[1];
    assert_eq!(
        (r.index, r.status, r.outcome.as_str()),
        (1, Some(200), "stored")
    );
    assert_eq!(r.event_ids, ["b", "c", "c"]);
    assert_eq!(r.attempt, Some(1));
    assert_eq!(r.user_agent.as_deref(), Some("eventspool/0.1.0"));
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(r.sent_at.as_deref(), Some("2026-11-29T12:00:03.120Z"));
    assert!(!r.gzip && r.body_bytes == r.decoded_bytes && r.body_bytes > 0);
}

#[tokio::test]
async fn accepts_gzip_bodies() {
    use flate2::{Compression, write::GzEncoder};
    let c = start();
    let ids: Vec<String> = (0..50).map(|i| format!("id-{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
    enc.write_all(batch(&refs).as_bytes()).expect("gzip");
    let gz = enc.finish().expect("gzip");
    let sent = gz.len();
    let answer = post_with(&client(), &c.url(), gz, &[("content-encoding", "gzip")])
        .await
        .expect("request completes");
    assert_eq!(answer.json, json!({"accepted": 50, "duplicates": 0}));
    let r = &c.requests()[0];
    assert!(r.gzip);
    assert_eq!(r.body_bytes, sent);
    assert!(r.decoded_bytes > r.body_bytes);

    let corrupt = post_with(
        &client(),
        &c.url(),
        "not gzip",
        &[("content-encoding", "gzip")],
    )
    .await
    .expect("request completes");
    assert_eq!(corrupt.status, 400);
    assert_eq!(c.requests()[1].outcome, "bad gzip");
}

#[tokio::test]
async fn rejects_bodies_that_are_not_batch_v1() {
    let c = start();
    let answer = post(&c, "{not json").await;
    assert_eq!(answer.status, 400);
    assert!(
        answer.json["error"]
            .as_str()
            .is_some_and(|e| e.contains("not JSON"))
    );

    let no_props =
        json!({"sent_at": TS, "batch": [{"event_id": "a", "name": "n", "timestamp": TS}]});
    let answer = post(&c, no_props.to_string()).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.json["error"], "batch[0]: missing properties");

    let records = c.requests();
    assert_eq!(records[1].outcome, "bad json");
    assert_eq!(
        records[1].event_ids,
        ["a"],
        "ids are recorded even when the batch is refused"
    );
    assert_eq!(c.distinct_count(), 0);
}

#[tokio::test]
async fn scripted_statuses_come_first_in_order_and_429_carries_retry_after() {
    let c = start_with(Behavior {
        retry_after: Some("7".into()),
        ..Behavior::default()
    });
    c.push_statuses(&[503, 429, 500]);
    c.push_script([Scripted::Status {
        status: 429,
        body: r#"{"error":"slow down"}"#.into(),
        headers: vec![("Retry-After".into(), "1".into())],
    }]);
    assert_eq!(c.pending_script(), 4);
    let client = client();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let a = post_with(&client, &c.url(), batch(&["a"]), &[])
            .await
            .expect("request completes");
        let retry = a
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        seen.push((a.status, retry));
    }
    let expected = [
        (503, Some("7")),
        (429, Some("7")),
        (500, None),
        (429, Some("1")),
        (200, None),
    ];
    let seen: Vec<(u16, Option<&str>)> = seen.iter().map(|(s, r)| (*s, r.as_deref())).collect();
    assert_eq!(seen, expected);
    assert_eq!(c.requests()[0].outcome, "scripted 503");
    assert_eq!(c.requests()[0].event_ids, ["a"]);
    assert_eq!(c.distinct_count(), 1, "only the unscripted request stores");
}

#[tokio::test]
async fn store_then_drop_stores_but_never_answers() {
    let c = start();
    c.push_script([Scripted::StoreThenDrop]);
    let err = post_with(&client(), &c.url(), batch(&["x", "y"]), &[])
        .await
        .err()
        .expect("the client sees a connection error, not a response");
    assert!(!err.is_status(), "{err}");
    assert!(c.contains("x") && c.contains("y"));
    assert_eq!(c.request_count(), 1, "the client did not silently resend");
    let r = &c.requests()[0];
    assert_eq!((r.status, r.outcome.as_str()), (None, "dropped"));

    // The same over a raw socket: the server closes with zero bytes of response.
    c.push_script([Scripted::StoreThenDrop]);
    let got = raw_post(c.addr(), &batch(&["z"])).unwrap_or_default();
    assert_eq!(got, "");
    assert!(c.contains("z"));
}

#[tokio::test]
async fn outage_refuses_connections_and_recovers_on_the_same_port() {
    let c = start();
    let addr = c.addr();
    // An idle keep-alive connection opened before the outage must be cut too.
    let mut idle = TcpStream::connect(addr).expect("connect before outage");
    idle.set_read_timeout(Some(WAIT)).expect("timeout");

    c.set_outage(true).expect("outage starts");
    let refused = TcpStream::connect(addr).expect_err("connect during outage fails");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    let mut buf = [0u8; 16];
    assert!(
        matches!(idle.read(&mut buf), Ok(0) | Err(_)),
        "open connection closed"
    );
    assert!(
        post_with(&client(), &c.url(), batch(&["a"]), &[])
            .await
            .is_err()
    );
    c.set_outage(true).expect("repeating a state is a no-op");

    c.set_outage(false).expect("outage ends");
    assert_eq!(c.addr(), addr);
    assert_eq!(post(&c, batch(&["a"])).await.status, 200);
    assert!(c.contains("a"));
}

// Two workers: the client task must make progress while this one blocks in wait_for_requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_cuts_a_hung_request() {
    let c = start();
    c.push_script([Scripted::Hang]);
    let url = c.url();
    let request = tokio::spawn(async move { post_with(&client(), &url, batch(&["h"]), &[]).await });
    assert!(c.wait_for_requests(1, WAIT));
    assert_eq!(c.requests()[0].outcome, "hung");
    c.set_outage(true).expect("outage starts");
    let result = tokio::time::timeout(WAIT, request)
        .await
        .expect("not hanging any more");
    assert!(result.expect("task").is_err());
    assert!(!c.contains("h"));
}

#[tokio::test]
async fn poison_event_fails_the_whole_batch() {
    let c = start_with(Behavior {
        reject_name: Some("poison".into()),
        ..Behavior::default()
    });
    let answer = post(&c, batch_of(&[("a", "ok"), ("b", "poison")])).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.json, json!({"error": "poison event"}));
    assert_eq!(c.distinct_count(), 0);
    assert_eq!(c.requests()[0].outcome, "poison");
    assert_eq!(post(&c, batch_of(&[("a", "ok")])).await.status, 200);
}

#[tokio::test]
async fn partial_reject_lists_events_and_stores_the_rest() {
    let c = start_with(Behavior {
        partial_reject_name: Some("bad".into()),
        ..Behavior::default()
    });
    let answer = post(&c, batch_of(&[("a", "ok"), ("b", "bad"), ("c", "ok")])).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.json,
        json!({"accepted": 2, "duplicates": 0,
               "rejected": [{"event_id": "b", "reason": "invalid name"}]})
    );
    assert!(c.contains("a") && c.contains("c") && !c.contains("b"));
    assert_eq!(c.received_count(), 2);
    assert_eq!(c.requests()[0].outcome, "partial");
}

#[tokio::test]
async fn partial_reject_reason_replaces_the_default_text() {
    let long = "r".repeat(20_000);
    let c = start_with(Behavior {
        partial_reject_name: Some("bad".into()),
        partial_reject_reason: Some(long.clone()),
        ..Behavior::default()
    });
    let answer = post(&c, batch_of(&[("a", "ok"), ("b", "bad"), ("c", "bad")])).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.json["rejected"],
        json!([{"event_id": "b", "reason": long}, {"event_id": "c", "reason": long}])
    );
    assert!(c.contains("a") && !c.contains("b") && !c.contains("c"));
}

#[tokio::test]
async fn body_over_max_body_bytes_is_413() {
    let c = start_with(Behavior {
        max_body_bytes: Some(300),
        ..Behavior::default()
    });
    let small = batch(&["a"]);
    assert!(small.len() <= 300);
    assert_eq!(post(&c, small).await.status, 200);
    let big = batch(&["b", "c", "d"]);
    assert!(big.len() > 300);
    assert_eq!(post(&c, big).await.status, 413);
    assert_eq!(c.requests()[1].outcome, "too large");
    assert!(!c.contains("b"));
}

#[tokio::test]
async fn a_client_writing_a_body_past_the_service_limit_reads_its_413() {
    // Declared past `Limits::max_body_bytes`: refused before it is read, but a client that
    // writes the whole body (reqwest does) must still read the 413, not a broken pipe.
    let c = start();
    let big = vec![b' '; crate::MAX_RAW_BODY_BYTES * 2];
    let answer = post_with(&client(), &c.url(), big, &[])
        .await
        .expect("the 413 is read, not a broken pipe");
    assert_eq!(answer.status, 413);
    assert_eq!(post(&c, batch(&["a"])).await.status, 200);
}

#[tokio::test]
async fn api_key_is_required_when_configured() {
    let c = start_with(Behavior {
        required_api_key: Some("k1".into()),
        ..Behavior::default()
    });
    let client = client();
    let missing = post_with(&client, &c.url(), batch(&["a"]), &[]).await;
    let wrong = post_with(
        &client,
        &c.url(),
        batch(&["a"]),
        &[("authorization", "Bearer k2")],
    )
    .await;
    let right = post_with(
        &client,
        &c.url(),
        batch(&["a"]),
        &[("authorization", "Bearer k1")],
    )
    .await;
    let statuses: Vec<u16> = [missing, wrong, right]
        .into_iter()
        .map(|a| a.expect("request completes").status)
        .collect();
    assert_eq!(statuses, [401, 401, 200]);
    let records = c.requests();
    assert_eq!(records[0].outcome, "unauthorized");
    assert_eq!(records[2].authorization.as_deref(), Some("Bearer k1"));
}

#[tokio::test]
async fn fail_rate_is_reproducible_and_adds_retry_after() {
    let behavior = Behavior {
        fail_rate: 0.5,
        seed: 42,
        retry_after: Some("Wed, 21 Oct 2015 07:28:00 GMT".into()),
        ..Behavior::default()
    };
    let mut runs = Vec::new();
    for _ in 0..2 {
        let c = start_with(behavior.clone());
        let mut statuses = Vec::new();
        for i in 0..20 {
            let a = post(&c, batch(&[&format!("e{i}")])).await;
            if a.status == 503 {
                assert_eq!(a.headers["retry-after"], "Wed, 21 Oct 2015 07:28:00 GMT");
            }
            statuses.push(a.status);
        }
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1]);
    assert!(
        runs[0].contains(&503) && runs[0].contains(&200),
        "{:?}",
        runs[0]
    );
}

#[tokio::test]
async fn delays_and_hangs_hold_the_answer() {
    let c = start();
    c.push_script([Scripted::Delay(Duration::from_millis(50)), Scripted::Hang]);
    let started = std::time::Instant::now();
    assert_eq!(post(&c, batch(&["a"])).await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(50));

    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(100))
        .build()
        .expect("client builds");
    let err = post_with(&impatient, &c.url(), batch(&["b"]), &[])
        .await
        .err()
        .expect("a hung request times out");
    assert!(err.is_timeout(), "{err}");
    assert!(!c.contains("b"));

    c.set_behavior(Behavior {
        delay: Some(Duration::from_millis(20)),
        ..Behavior::default()
    });
    let started = std::time::Instant::now();
    assert_eq!(post(&c, batch(&["c"])).await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(20));
}

#[tokio::test]
async fn only_post_is_accepted_on_any_path() {
    let c = start();
    let root = format!("http://{}/", c.addr());
    let a = post_with(&client(), &root, batch(&["a"]), &[])
        .await
        .expect("completes");
    assert_eq!(a.status, 200);
    let got = client().get(c.url()).send().await.expect("completes");
    assert_eq!(got.status().as_u16(), 405);
    assert_eq!(c.requests()[1].outcome, "method not allowed");
}

#[test]
fn works_from_sync_code_and_waits_without_sleeping() {
    let c = start();
    assert!(!c.wait_for_distinct(1, Duration::from_millis(20)));
    let answer = raw_post(c.addr(), &batch(&["s"])).expect("request completes");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(c.wait_for_distinct(1, WAIT));
    c.shutdown();
}

#[test]
fn a_database_file_remembers_events_across_restarts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = CollectorConfig {
        db_path: Some(dir.path().join("collector.db")),
        ..CollectorConfig::default()
    };
    let c = ReferenceCollector::start(config.clone()).expect("starts");
    assert!(
        raw_post(c.addr(), &batch(&["p", "q"]))
            .expect("post")
            .contains("200 OK")
    );
    drop(c);
    let c = ReferenceCollector::start(config).expect("restarts");
    assert_eq!(c.distinct_count(), 2);
    let answer = raw_post(c.addr(), &batch(&["q", "r"])).expect("post");
    assert!(
        answer.ends_with(r#"{"accepted":1,"duplicates":1}"#),
        "{answer}"
    );
    let ids: Vec<String> = c.events().into_iter().map(|e| e.event_id).collect();
    assert_eq!(ids, ["p", "q", "r"]);
}

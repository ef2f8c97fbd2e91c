//! The JetStream collector's numbered defects (issue 27), each against a real nats-server:
//! batches past async-nats' ack permits, a broker payload limit, readiness with the broker
//! gone, stream settings on an existing stream, a full stream, project-scoped ids and the
//! bytes as sent, and client reports stored before the answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use eventspool_collector::{ApiKeys, CollectorConfig, JetStreamConfig, ReferenceCollector};
use serde_json::{Value, json};

use crate::nats::NatsServer;
use crate::sink::{batch, ids, ids_from, single};
use crate::stream;

/// Longer than any answer a healthy collector gives here; a wedged one fails at it.
const ANSWER_BOUND: Duration = Duration::from_secs(15);

/// (status, Retry-After, body) of one POST, or why there was none within `ANSWER_BOUND`.
fn try_post(
    addr: SocketAddr,
    body: &str,
    auth: Option<&str>,
) -> Result<(u16, Option<String>, Value), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(ANSWER_BOUND)).unwrap();
    let auth = auth.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        s,
        "POST /v1/batch HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("no answer within {ANSWER_BOUND:?}: {e}"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let retry_after = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().to_owned())
    });
    Ok((
        status,
        retry_after,
        serde_json::from_str(body).unwrap_or(Value::Null),
    ))
}

fn get(addr: SocketAddr, path: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return 0;
    };
    s.set_read_timeout(Some(ANSWER_BOUND)).unwrap();
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn start(js: &JetStreamConfig) -> ReferenceCollector {
    ReferenceCollector::start_jetstream(CollectorConfig::default(), js)
        .expect("collector with a JetStream sink starts")
}

fn body_of(ids: &[String]) -> String {
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    batch(&ids).to_string()
}

/// Defect 1: one batch with more events than async-nats' 5,000 ack permits wedged the
/// collector (no answer, and other clients' batches waited behind it).
#[test]
fn service_a_6000_event_batch_is_answered_and_others_are_served_meanwhile() {
    let nats = NatsServer::start();
    let c = start(&single(&nats, "BIGBATCH"));
    let addr = c.addr();
    let big = body_of(&ids(6_000));
    let started = Instant::now();
    let big_request = std::thread::spawn(move || try_post(addr, &big, None));
    std::thread::sleep(Duration::from_millis(50));
    let small = try_post(addr, &body_of(&ids_from(10_000, 10)), None);
    let big = big_request.join().unwrap();
    let elapsed = started.elapsed();
    let (status, _, body) = big.expect("the 6,000-event batch got an answer");
    assert!(
        status == 413 || (200..300).contains(&status),
        "the 6,000-event batch: {status} {body}"
    );
    let (small_status, _, small_body) = small.expect("the 10-event batch got an answer");
    assert_eq!(small_status, 200, "{small_body}");
    println!(
        "service: a 6,000-event batch answered {status} in {elapsed:?}; a 10-event batch beside it 200"
    );
}

/// Defect 1 at the SDK's batch size: 80 concurrent 100-event batches hold 8,000 events, past
/// the 5,000 permits; every one must be answered (2xx, or 503 with Retry-After), none left
/// waiting.
#[test]
fn service_concurrent_batches_past_the_ack_permits_are_all_answered() {
    let nats = NatsServer::start();
    let c = start(&single(&nats, "MANYBATCHES"));
    let addr = c.addr();
    let started = Instant::now();
    let requests: Vec<_> = (0..80)
        .map(|i| {
            let body = body_of(&ids_from(i * 100, 100));
            std::thread::spawn(move || try_post(addr, &body, None))
        })
        .collect();
    let (mut ok, mut shed, mut unanswered) = (0, 0, Vec::new());
    for r in requests {
        match r.join().unwrap() {
            Ok((200, _, _)) => ok += 1,
            Ok((503, Some(_), _)) => shed += 1,
            Ok((status, retry_after, body)) => {
                panic!("unexpected answer {status} (Retry-After {retry_after:?}): {body}")
            }
            Err(e) => unanswered.push(e),
        }
    }
    println!(
        "service: 80 concurrent 100-event batches: {ok} × 200, {shed} × 503 with Retry-After, \
         {} unanswered, in {:?}",
        unanswered.len(),
        started.elapsed()
    );
    assert!(
        unanswered.is_empty(),
        "{} batches got no answer: {:?}",
        unanswered.len(),
        unanswered.first()
    );
}

/// Defect 6: an event larger than the broker takes was answered 503 with Retry-After for
/// ever; it is a per-event rejection, and the rest of the batch is stored.
#[test]
fn service_an_event_over_the_broker_payload_limit_is_rejected_not_retried() {
    let nats = NatsServer::start_configured("max_payload: 8192");
    let c = start(&single(&nats, "PAYLOAD"));
    let ids = ids(3);
    let mut body = batch(&[&ids[0], &ids[1], &ids[2]]);
    body["batch"][1]["properties"]["blob"] = json!("x".repeat(10_000));
    let (status, _, answer) = try_post(c.addr(), &body.to_string(), None).expect("answered");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["accepted"], 2, "{answer}");
    assert_eq!(
        answer["rejected"][0]["event_id"],
        ids[1].as_str(),
        "{answer}"
    );
    let reason = answer["rejected"][0]["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("limit") || reason.contains("large"),
        "{answer}"
    );
}

/// Defect 3: readiness is what a balancer checks; it fails while the broker is unreachable
/// and passes again once it is back. Liveness stays up.
#[test]
fn service_readiness_fails_while_the_broker_is_down() {
    let mut nats = NatsServer::start();
    let c = start(&single(&nats, "READY"));
    assert_eq!(get(c.addr(), "/readyz"), 200);
    nats.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(c.addr(), "/readyz") != 503 {
        assert!(
            Instant::now() < deadline,
            "readiness still passes with the broker gone"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get(c.addr(), "/livez"), 200);
    nats.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(c.addr(), "/readyz") != 200 {
        assert!(
            Instant::now() < deadline,
            "readiness did not come back with the broker"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Defect 9: an existing stream was used as it was (the collector's duplicate window ignored,
/// no limits, `discard = old`); its settings are applied at start.
#[test]
fn service_stream_settings_are_applied_to_an_existing_stream() {
    let nats = NatsServer::start();
    let js = single(&nats, "SETTINGS");
    block_on(async {
        let context = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        context
            .create_stream(jetstream::stream::Config {
                name: js.stream.clone(),
                subjects: vec![js.subject.clone()],
                duplicate_window: Duration::from_secs(2),
                ..Default::default()
            })
            .await
            .unwrap();
    });
    let _c = start(&js);
    let config = block_on(async {
        let context = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let mut s = context.get_stream(&js.stream).await.unwrap();
        s.info().await.unwrap().config.clone()
    });
    assert_eq!(
        config.duplicate_window, js.duplicate_window,
        "window applied"
    );
    assert_eq!(
        config.discard,
        jetstream::stream::DiscardPolicy::New,
        "discard = new"
    );
    assert_eq!(config.max_bytes, js.max_bytes, "max_bytes applied");
    assert_eq!(config.max_age, js.max_age, "max_age applied");
}

/// Defect 9: a full stream pushes back with 503 and Retry-After (`discard = new`) instead of
/// deleting events it acknowledged.
#[test]
fn service_a_full_stream_answers_503_and_keeps_what_it_acknowledged() {
    let nats = NatsServer::start();
    let js = JetStreamConfig {
        max_bytes: 64 << 10,
        ..single(&nats, "FULL")
    };
    let c = start(&js);
    let mut acked = Vec::new();
    let mut refused = None;
    for round in 0..40 {
        let ids = ids_from(round * 50, 50);
        match try_post(c.addr(), &body_of(&ids), None).expect("answered") {
            (200, _, _) => acked.extend(ids),
            (503, retry_after, body) => {
                refused = Some((retry_after, body));
                break;
            }
            (status, _, body) => panic!("{status} {body}"),
        }
    }
    let (retry_after, body) = refused.expect("a 64 KiB stream fills up within 2,000 events");
    assert!(retry_after.is_some(), "503 without Retry-After: {body}");
    let contents = stream::read_all(&nats.url(), &js.stream);
    let missing = acked
        .iter()
        .filter(|id| !contents.copies.contains_key(*id))
        .count();
    assert_eq!(
        missing, 0,
        "the stream deleted {missing} acknowledged events"
    );
    println!(
        "service: a 64 KiB stream took {} events, then answered 503 ({body}); none of them deleted",
        acked.len()
    );
}

/// Defect 10: ids are scoped by project (`project:event_id`) and the stream message is the
/// event's bytes as the client sent them.
#[test]
fn service_ids_are_scoped_by_project_and_the_bytes_are_kept() {
    let nats = NatsServer::start();
    let js = single(&nats, "PROJECTS");
    let keys = ApiKeys::new([
        ("shop", "shop-key-0123456789"),
        ("blog", "blog-key-0123456789"),
    ])
    .unwrap();
    let c = ReferenceCollector::start_jetstream(
        CollectorConfig {
            api_keys: Some(keys),
            ..CollectorConfig::default()
        },
        &js,
    )
    .unwrap();
    let id = &ids(1)[0];
    // Keys in an order of their own, spaces where JSON allows them: kept as they came.
    let event = format!(
        r#"{{ "properties" : {{"b":1, "a":[1,2]}}, "name":"tap", "timestamp":"2026-12-01T12:00:00.000Z", "event_id":"{id}" }}"#
    );
    let body = format!(r#"{{"sent_at":"2026-12-01T12:00:01.000Z","batch":[{event}]}}"#);
    for key in ["shop-key-0123456789", "blog-key-0123456789"] {
        let (status, _, answer) = try_post(c.addr(), &body, Some(key)).expect("answered");
        assert_eq!((status, &answer["accepted"]), (200, &json!(1)), "{answer}");
    }
    let contents = stream::read_all(&nats.url(), &js.stream);
    assert_eq!(contents.messages, 2, "one per project");
    assert_eq!(contents.id_mismatches, 0, "Nats-Msg-Id is project:event_id");
    let mut projects = contents.projects.clone();
    projects.sort();
    assert_eq!(projects, ["blog", "shop"]);
    assert_eq!(
        contents.payloads[0],
        event.as_bytes(),
        "the stream holds the bytes sent"
    );
}

/// Defect 5: client reports are stored in the broker before the 2xx that lists them, once per
/// (install, report id) downstream however often they are resent.
#[test]
fn service_client_reports_are_stored_before_the_answer() {
    let nats = NatsServer::start();
    let js = single(&nats, "REPORTS");
    let c = start(&js);
    let report =
        |id: u64| json!({"install_id": "a1b2", "report_id": id, "tracked": 10, "delivered": 7});
    for (first, reports) in [(0, vec![report(1)]), (5, vec![report(1), report(2)])] {
        let mut body = batch(&[&ids_from(first, 1)[0]]);
        body["reports"] = json!(reports);
        let (status, _, answer) = try_post(c.addr(), &body.to_string(), None).expect("answered");
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            answer["reports_seen"].as_array().map(Vec::len),
            Some(reports.len()),
            "{answer}"
        );
    }
    let (messages, totals) = stream::read_reports(&nats.url(), &js.reports_stream);
    assert_eq!(
        messages, 2,
        "report 1 resent, stored once (duplicate window)"
    );
    assert_eq!((totals.installs, totals.reports), (1, 2));
    assert_eq!(totals.count("tracked"), 20);
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

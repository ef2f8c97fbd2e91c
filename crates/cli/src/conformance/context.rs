//! What every check shares: the SDK's own request builder and transport (so a check sends the
//! bytes a device sends and reads the answer as a device reads it), the run's tag on every
//! event, the read-back hook, and the requests and events each check spent.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use eventspool::classify::{Outcome, classify};
use eventspool::{
    Compression, Config, EventId, HttpRequest, HttpResponse, NewEvent, ReqwestTransport, Transport,
    TransportError,
};
use serde_json::{Value, json};

use super::readback::{ReadBack, Stored};
use super::unanswered;

/// Every event a check sends is named this followed by the check's name...
pub const NAME_PREFIX: &str = "eventspool_conformance_";
/// ...and carries this property: `{"run": RUN, "check": CHECK, "seq": N}`.
pub const TAG_PROPERTY: &str = "eventspool_conformance";
/// The SDK's default `max_event_bytes`; a check's events stay far below it.
const MAX_EVENT_BYTES: u64 = 32 * 1024;
/// Padding of one event at most, so that every event a check makes is one the SDK would send.
pub const MAX_PAD_BYTES: usize = 30 * 1024;
/// Beyond the deadline, the SDK's own margin before it gives up on a transport (src/worker.rs).
const TRANSPORT_MARGIN: Duration = Duration::from_millis(250);

/// One event as the SDK renders it: its id and its wire JSON.
#[derive(Clone, Debug)]
pub struct Ev {
    pub id: String,
    pub json: String,
}

/// A request the SDK would send, and how many events it carries (the read bound and the
/// counts in the answer depend on it).
pub struct Req {
    pub http: HttpRequest,
    pub events: usize,
}

/// What came back for one request, and how long it took.
pub struct Answer {
    pub result: Result<HttpResponse, TransportError>,
    pub elapsed: Duration,
}

impl Answer {
    /// How the SDK classifies it (docs/protocol.md §Responses).
    pub fn outcome(&self) -> Outcome {
        classify(&self.result, SystemTime::now())
    }

    pub fn status(&self) -> Option<u16> {
        self.result.as_ref().ok().map(|r| r.status)
    }

    pub fn response(&self) -> Option<&HttpResponse> {
        self.result.as_ref().ok()
    }
}

/// The options a run was given, as the checks read them.
pub struct Options {
    pub endpoint: String,
    pub api_key: Option<String>,
    pub deadline: Duration,
    pub allow_insecure_http: bool,
    pub body_limit: Option<usize>,
    pub load_requests: usize,
    pub load_concurrency: usize,
}

pub struct Ctx {
    rt: tokio::runtime::Runtime,
    transport: Arc<ReqwestTransport>,
    plain: Config,
    gzip: Config,
    pub opts: Options,
    /// The run's id (a UUID v7): in every event's tag, so one run's events can be found.
    pub run: String,
    pub read_back: Option<ReadBack>,
    check: &'static str,
    /// Spent by the check running now (reset by [`Ctx::begin`]).
    pub requests: usize,
    pub events_sent: usize,
    /// The JSON bodies of every 2xx answer of the run, for the `directives` check.
    pub answers: Vec<Value>,
    seq: u64,
}

impl Ctx {
    pub fn new(opts: Options, read_back: Option<String>) -> Result<Ctx, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))?;
        let transport =
            Arc::new(ReqwestTransport::new().map_err(|e| format!("cannot set up HTTP: {e}"))?);
        let mut plain = Config::new(opts.endpoint.clone());
        plain.attempt_timeout_ms = u64::try_from(opts.deadline.as_millis()).unwrap_or(u64::MAX);
        plain.allow_insecure_http = opts.allow_insecure_http;
        plain.validate().map_err(|e| format!("--endpoint: {e}"))?;
        plain.compression = Compression::None;
        let mut gzip = plain.clone();
        gzip.compression = Compression::Gzip;
        let run = EventId::new().to_string();
        let read_back = read_back.map(|cmd| ReadBack::new(cmd, &opts.endpoint, &run));
        Ok(Ctx {
            rt,
            transport,
            plain,
            gzip,
            opts,
            run,
            read_back,
            check: "",
            requests: 0,
            events_sent: 0,
            answers: Vec::new(),
            seq: 0,
        })
    }

    /// Starts the bookkeeping of one check.
    pub fn begin(&mut self, check: &'static str) {
        self.check = check;
        self.requests = 0;
        self.events_sent = 0;
    }

    /// `n` new events of this check, tagged, each padded with `pad` bytes of property (so
    /// a check can reach a body size), rendered by the SDK as `track()` would.
    pub fn events(&mut self, n: usize, pad: usize) -> Result<Vec<Ev>, String> {
        let now = chrono::Utc::now().timestamp_millis();
        let pad = pad.min(MAX_PAD_BYTES);
        (0..n)
            .map(|_| {
                self.seq += 1;
                let id = EventId::new().to_string();
                let mut properties = json!({
                    TAG_PROPERTY: { "run": self.run, "check": self.check, "seq": self.seq },
                });
                if pad > 0 {
                    properties["pad"] = Value::String("x".repeat(pad));
                }
                let event = NewEvent {
                    name: format!("{NAME_PREFIX}{}", self.check),
                    properties,
                    event_id: Some(id.clone()),
                    ..NewEvent::default()
                };
                let json = event
                    .to_wire_json(now, MAX_EVENT_BYTES)
                    .map_err(|e| format!("cannot build a test event: {e}"))?;
                Ok(Ev { id, json })
            })
            .collect()
    }

    /// The request the SDK would send for these events (`gzip`: with compression on, which
    /// gzips bodies over 1 KiB), with this `X-Eventspool-Attempt`.
    pub fn request(&self, events: &[Ev], attempt: u32, gzip: bool) -> Req {
        self.request_of_json(events.iter().map(|e| e.json.as_str()), attempt, gzip)
    }

    /// The same for event JSON a check made itself (malformed or reordered on purpose).
    pub fn request_of_json<'a>(
        &self,
        events: impl ExactSizeIterator<Item = &'a str>,
        attempt: u32,
        gzip: bool,
    ) -> Req {
        let count = events.len();
        let body = eventspool::batch_body(events, chrono::Utc::now().timestamp_millis(), None);
        let config = if gzip { &self.gzip } else { &self.plain };
        Req {
            http: eventspool::batch_request(
                config,
                self.opts.api_key.as_deref(),
                body,
                count,
                attempt,
            ),
            events: count,
        }
    }

    /// Sends one request through the SDK's transport; never waits past the deadline.
    pub fn send(&mut self, request: Req) -> Answer {
        let mut answers = self.send_all(vec![request], 1);
        answers.pop().unwrap_or(Answer {
            result: Err(TransportError::Io("no request was sent".into())),
            elapsed: Duration::ZERO,
        })
    }

    /// Sends the requests with at most `concurrency` in flight; answers in request order.
    pub fn send_all(&mut self, requests: Vec<Req>, concurrency: usize) -> Vec<Answer> {
        use futures_util::stream::{self, StreamExt};
        let limit = self.opts.deadline + TRANSPORT_MARGIN;
        self.requests += requests.len();
        let sends = requests.into_iter().map(|request| {
            self.events_sent += request.events;
            let future = self.transport.send(request.http);
            async move {
                let started = Instant::now();
                let result = tokio::time::timeout(limit, future)
                    .await
                    .unwrap_or(Err(TransportError::Timeout));
                Answer {
                    result,
                    elapsed: started.elapsed(),
                }
            }
        });
        let answers: Vec<Answer> = self.rt.block_on(
            stream::iter(sends)
                .buffered(concurrency.max(1))
                .collect::<Vec<_>>(),
        );
        for answer in &answers {
            if let Ok(r) = &answer.result
                && (200..300).contains(&r.status)
                && !r.truncated
                && let Ok(v) = serde_json::from_slice::<Value>(&r.body)
            {
                self.answers.push(v);
            }
        }
        answers
    }

    /// Sends the request on a connection of its own and closes it once the answer begins,
    /// unread: the SDK's "effect unknown" case (the collector did its work, the device never
    /// heard). `Err` says why it could not be done (only plain http:// can be cut this way).
    pub fn send_unanswered(&mut self, request: &Req) -> Result<String, String> {
        unanswered::supported(&self.opts.endpoint)?;
        self.requests += 1;
        self.events_sent += request.events;
        let deadline = self.opts.deadline;
        self.rt.block_on(unanswered::send(
            &self.opts.endpoint,
            &request.http,
            deadline,
        ))
    }

    /// The read-back hook's view of these ids, or `None` when no `--verify-cmd` was given.
    pub fn stored(&self, ids: &[&str]) -> Option<Result<Stored, String>> {
        let hook = self.read_back.as_ref()?;
        Some(hook.stored(self.check, ids))
    }
}

//! One model test over the whole engine: a spool on a real SQLite file, talking to the reference
//! collector on 127.0.0.1, is driven through random sequences of what an app and a collector do
//! (track now or with an explicit timestamp, bursts, persist, offline/online, flush, retry now,
//! back, purge, quarantine redrive and purge, reopen on the same file, a disk kept near its cap;
//! the collector answering 2xx, partial `rejected`, 400, 413, 503, store-then-drop and never;
//! the store's writes failing: "the next K writes fail" (`SQLITE_IOERR`) and "the disk is full
//! until step M" (`SQLITE_FULL` for every write that grows a file), and in replays "the N-th
//! write from now fails" (a write of several transactions fails part-way), through the store's own
//! fault point, `StoreFaults`; space returns before a reopen and at the end).
//! After every step, once the worker has settled, it checks what the README promises:
//!
//! - the ledger `tracked + restored + redriven = delivered + quarantined + dropped + pending`,
//!   computed from the raw counters, equals what memory and the store really hold, and so does
//!   `stats().pending` (a clamp cannot hide a miscount);
//! - the store's own row count (read with SQL through [`eventspool::admin::inspect`]) is the
//!   spool's `pending_disk`, plus the rows whose failed delete the store still owes
//!   (`StoreFaults::owed_rows`); after a reopen the new handle restores exactly what the old one
//!   left;
//! - every event the spool counts delivered was acknowledged by the collector, and the collector
//!   never saw an id the app did not track;
//! - batches leave in timestamp order: within a batch, and across batches for events sent for
//!   the first time (an event that was queued when a batch was put together never follows a
//!   newer one);
//! - no event is sent, or dropped as `expired`, before `max_event_age_ms` has passed since the
//!   SDK accepted it (docs/delivery.md §Retry: age counts from `track()` or redrive, retries
//!   included);
//! - the store stays within `max_disk_bytes` on disk.
//!
//! At each reopen and at the end, every tracked id is audited: delivered, quarantined, still
//! queued, or one of the counted drops. Time is a [`ManualClock`] whose sleeps complete at once,
//! so backoffs cost no real time and the jitter only moves virtual time by seconds, far from the
//! hour-sized ages the test plays with; a step waits on published states and request counts,
//! never on a sleep (a check that fails is only repeated, 10 ms apart and at most 30 times, in
//! case the spill thread is between taking overflow from memory and committing it). Only a
//! scripted "never answers" costs real time (`attempt_timeout_ms`).
//!
//! `EVENTSPOOL_MODEL_CASES` sets the number of cases; `EVENTSPOOL_MODEL_EXCLUDE=persist,hang,...`
//! leaves operations or answers out of the generated cases (to look past one known failure; such
//! runs persist nothing). Shrunk failures are kept in `tests/reliability/model.proptest-regressions`
//! and replayed first; the `model_replay_*` tests replay, by name, the ones recorded by hand.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use eventspool::{
    Clock, Config, DeliveryState, DeliveryStatus, DropReason, Durability, EventSpool, FaultError,
    FaultSite, ListFilter, ManualClock, NewEvent, Selector, Stats, StoreFaults,
};
use eventspool_collector::{Behavior, CollectorConfig, ReferenceCollector, Scripted};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::FileFailurePersistence;

const WALL_START_MS: i64 = 1_764_417_600_000;
const HOUR_MS: i64 = 3_600_000;
const MAX_AGE_MS: i64 = 24 * HOUR_MS;
/// `max_disk_bytes`, unless `EVENTSPOOL_MODEL_DISK_CAP` says otherwise. Not the 64 KiB minimum:
/// there a fresh store (schema in the database and its WAL) already takes ~80 KB on disk.
const DEFAULT_DISK_CAP: u64 = 128 * 1024;
/// A "never answers" costs this much real time; a loopback answer in a loaded debug build is
/// far faster, so no ordinary request times out by accident.
const ATTEMPT_TIMEOUT_MS: u64 = 500;
/// Real time a step may take to settle before the case fails.
const SETTLE: Duration = Duration::from_secs(10);
/// A `reason` this long makes three rejections outgrow a 64 KiB response read bound.
const LONG_REASON_BYTES: usize = 22 * 1024;
const BIG_PAD_BYTES: usize = 1_500;
const REGRESSIONS: &str = "tests/reliability/model.proptest-regressions";

/// Event names; the collector's standing behaviour keys on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    Ok,
    /// Listed in a 2xx answer's `rejected` array.
    Reject,
    /// Makes the whole batch a 400.
    Poison,
}

impl Name {
    fn as_str(self) -> &'static str {
        match self {
            Name::Ok => "ok",
            Name::Reject => "reject",
            Name::Poison => "poison",
        }
    }
}

/// How old an explicit timestamp is at `track()`; `Now` uses plain `track()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Age {
    Now,
    Minutes3,
    Hours2,
    /// Older than `max_event_age_ms`: an importer's historical event.
    Hours31,
}

impl Age {
    fn ms(self) -> i64 {
        match self {
            Age::Now => 0,
            Age::Minutes3 => 3 * 60_000,
            Age::Hours2 => 2 * HOUR_MS,
            Age::Hours31 => 31 * HOUR_MS,
        }
    }

    fn token(self) -> &'static str {
        match self {
            Age::Now => "",
            Age::Minutes3 => "3m",
            Age::Hours2 => "2h",
            Age::Hours31 => "31h",
        }
    }
}

/// One scripted answer of the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    S503,
    S400,
    S413,
    /// Stores the batch, then closes the connection without an answer.
    Drop,
    /// Never answers: the attempt times out.
    Hang,
}

impl Answer {
    fn token(self) -> &'static str {
        match self {
            Answer::S503 => "503",
            Answer::S400 => "400",
            Answer::S413 => "413",
            Answer::Drop => "drop",
            Answer::Hang => "hang",
        }
    }

    fn scripted(self) -> Scripted {
        match self {
            Answer::S503 => Scripted::status(503),
            Answer::S400 => Scripted::status(400),
            Answer::S413 => Scripted::status(413),
            Answer::Drop => Scripted::StoreThenDrop,
            Answer::Hang => Scripted::Hang,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Track {
        name: Name,
        big: bool,
        age: Age,
    },
    /// `track_batch` of events stamped now.
    Burst(Vec<(Name, bool)>),
    Persist,
    SetOnline(bool),
    Flush,
    RetryNow,
    Dismiss,
    PurgePending,
    Redrive,
    PurgeQuarantine,
    Script(Vec<Answer>),
    /// Rejections carry a reason of [`LONG_REASON_BYTES`] (true) or the collector's default.
    LongReasons(bool),
    /// Moves both clocks forward this many hours.
    Advance(u32),
    /// Drops the spool (the last handle) and opens a new one on the same file.
    Reopen,
    /// The next this many writes of the store fail (`SQLITE_IOERR`).
    FailWrites(u8),
    /// The this-many-th write of the store from now fails (`SQLITE_IOERR`), the ones before it
    /// pass: a write of several transactions fails after some of them committed. In replays
    /// only, not drawn: with `durability = always` a `track_batch` whose commit fails part-way
    /// returns `NotDurable` naming only the events left in memory, and this model learns a
    /// batch's ids from what `track_batch` returns, so it would not know the others.
    FailWriteAt(u8),
    /// The disk is full (`SQLITE_FULL`) for this many steps (or until a reopen).
    DiskFull(u8),
}

fn event_token(name: Name, big: bool) -> String {
    format!("{}{}", name.as_str(), if big { "+big" } else { "" })
}

/// A compact form, one token per operation, that [`parse_ops`] reads back: what a shrunk
/// failure prints and what [`KNOWN_SEQUENCES`] holds.
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Track { name, big, age } => {
                write!(f, "track:{}", event_token(*name, *big))?;
                if *age != Age::Now {
                    write!(f, "@{}", age.token())?;
                }
                Ok(())
            }
            Op::Burst(events) => {
                let list: Vec<String> = events.iter().map(|(n, b)| event_token(*n, *b)).collect();
                write!(f, "burst:{}", list.join(","))
            }
            Op::Persist => f.write_str("persist"),
            Op::SetOnline(true) => f.write_str("online"),
            Op::SetOnline(false) => f.write_str("offline"),
            Op::Flush => f.write_str("flush"),
            Op::RetryNow => f.write_str("retry_now"),
            Op::Dismiss => f.write_str("dismiss"),
            Op::PurgePending => f.write_str("purge_pending"),
            Op::Redrive => f.write_str("redrive"),
            Op::PurgeQuarantine => f.write_str("purge_quarantine"),
            Op::Script(answers) => {
                let list: Vec<&str> = answers.iter().map(|a| a.token()).collect();
                write!(f, "script:{}", list.join(","))
            }
            Op::LongReasons(true) => f.write_str("long_reasons"),
            Op::LongReasons(false) => f.write_str("short_reasons"),
            Op::Advance(hours) => write!(f, "advance:{hours}h"),
            Op::Reopen => f.write_str("reopen"),
            Op::FailWrites(k) => write!(f, "fail:{k}"),
            Op::FailWriteAt(n) => write!(f, "failat:{n}"),
            Op::DiskFull(steps) => write!(f, "full:{steps}"),
        }
    }
}

fn parse_event(text: &str) -> Result<(Name, bool), String> {
    let (name, big) = match text.strip_suffix("+big") {
        Some(name) => (name, true),
        None => (text, false),
    };
    let name = match name {
        "ok" => Name::Ok,
        "reject" => Name::Reject,
        "poison" => Name::Poison,
        other => return Err(format!("unknown event name '{other}'")),
    };
    Ok((name, big))
}

fn parse_op(token: &str) -> Result<Op, String> {
    let (head, arg) = token.split_once(':').unwrap_or((token, ""));
    Ok(match head {
        "track" => {
            let (event, age) = arg.split_once('@').unwrap_or((arg, ""));
            let (name, big) = parse_event(event)?;
            let age = match age {
                "" => Age::Now,
                "3m" => Age::Minutes3,
                "2h" => Age::Hours2,
                "31h" => Age::Hours31,
                other => return Err(format!("unknown age '{other}'")),
            };
            Op::Track { name, big, age }
        }
        "burst" => Op::Burst(arg.split(',').map(parse_event).collect::<Result<_, _>>()?),
        "persist" => Op::Persist,
        "online" => Op::SetOnline(true),
        "offline" => Op::SetOnline(false),
        "flush" => Op::Flush,
        "retry_now" => Op::RetryNow,
        "dismiss" => Op::Dismiss,
        "purge_pending" => Op::PurgePending,
        "redrive" => Op::Redrive,
        "purge_quarantine" => Op::PurgeQuarantine,
        "script" => Op::Script(
            arg.split(',')
                .map(|a| match a {
                    "503" => Ok(Answer::S503),
                    "400" => Ok(Answer::S400),
                    "413" => Ok(Answer::S413),
                    "drop" => Ok(Answer::Drop),
                    "hang" => Ok(Answer::Hang),
                    other => Err(format!("unknown answer '{other}'")),
                })
                .collect::<Result<_, _>>()?,
        ),
        "long_reasons" => Op::LongReasons(true),
        "short_reasons" => Op::LongReasons(false),
        "advance" => Op::Advance(
            arg.trim_end_matches('h')
                .parse()
                .map_err(|e| format!("advance '{arg}': {e}"))?,
        ),
        "reopen" => Op::Reopen,
        "fail" => Op::FailWrites(arg.parse().map_err(|e| format!("fail '{arg}': {e}"))?),
        "failat" => Op::FailWriteAt(arg.parse().map_err(|e| format!("failat '{arg}': {e}"))?),
        "full" => Op::DiskFull(arg.parse().map_err(|e| format!("full '{arg}': {e}"))?),
        other => return Err(format!("unknown operation '{other}'")),
    })
}

/// Reads `"spill: track:ok offline ..."` (or `always:`) back into a case.
fn parse_case(text: &str) -> Result<Case, String> {
    let (mode, ops) = text
        .split_once(':')
        .ok_or("a case starts with 'spill:' or 'always:'")?;
    let always = match mode.trim() {
        "spill" => false,
        "always" => true,
        other => return Err(format!("unknown durability '{other}'")),
    };
    let ops = ops
        .split_whitespace()
        .map(parse_op)
        .collect::<Result<_, _>>()?;
    Ok(Case { always, ops })
}

#[derive(Clone, PartialEq, Eq)]
struct Case {
    /// `durability = always` instead of `spill`.
    always: bool,
    ops: Vec<Op>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops: Vec<String> = self.ops.iter().map(Op::to_string).collect();
        write!(
            f,
            "\"{}: {}\"",
            if self.always { "always" } else { "spill" },
            ops.join(" ")
        )
    }
}

// ---- Strategies -------------------------------------------------------------------------

fn excluded() -> HashSet<String> {
    std::env::var("EVENTSPOOL_MODEL_EXCLUDE")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// A weighted union of the arms whose kind is not excluded.
fn union_of<T: fmt::Debug + Clone + 'static>(
    arms: Vec<(&str, u32, BoxedStrategy<T>)>,
    excluded: &HashSet<String>,
) -> BoxedStrategy<T> {
    let arms: Vec<(u32, BoxedStrategy<T>)> = arms
        .into_iter()
        .filter(|(kind, _, _)| !excluded.contains(*kind))
        .map(|(_, w, s)| (w, s))
        .collect();
    assert!(!arms.is_empty(), "EVENTSPOOL_MODEL_EXCLUDE left nothing");
    Union::new_weighted(arms).boxed()
}

fn name() -> BoxedStrategy<Name> {
    prop_oneof![6 => Just(Name::Ok), 2 => Just(Name::Reject), 1 => Just(Name::Poison)].boxed()
}

fn answer(excluded: &HashSet<String>) -> BoxedStrategy<Answer> {
    union_of(
        vec![
            ("503", 4, Just(Answer::S503).boxed()),
            ("400", 2, Just(Answer::S400).boxed()),
            ("413", 1, Just(Answer::S413).boxed()),
            ("drop", 2, Just(Answer::Drop).boxed()),
            ("hang", 1, Just(Answer::Hang).boxed()),
        ],
        excluded,
    )
}

fn op(excluded: &HashSet<String>) -> BoxedStrategy<Op> {
    let age = union_of(
        vec![
            ("now", 6, Just(Age::Now).boxed()),
            ("3m", 2, Just(Age::Minutes3).boxed()),
            ("2h", 1, Just(Age::Hours2).boxed()),
            ("31h", 1, Just(Age::Hours31).boxed()),
        ],
        excluded,
    );
    let big = prop::bool::weighted(0.4);
    union_of(
        vec![
            (
                "track",
                10,
                (name(), big, age)
                    .prop_map(|(name, big, age)| Op::Track { name, big, age })
                    .boxed(),
            ),
            (
                "burst",
                3,
                prop::collection::vec((name(), big), 2..=10)
                    .prop_map(Op::Burst)
                    .boxed(),
            ),
            ("persist", 2, Just(Op::Persist).boxed()),
            ("online", 3, any::<bool>().prop_map(Op::SetOnline).boxed()),
            ("flush", 1, Just(Op::Flush).boxed()),
            ("retry_now", 2, Just(Op::RetryNow).boxed()),
            ("dismiss", 1, Just(Op::Dismiss).boxed()),
            ("purge_pending", 1, Just(Op::PurgePending).boxed()),
            ("redrive", 1, Just(Op::Redrive).boxed()),
            ("purge_quarantine", 1, Just(Op::PurgeQuarantine).boxed()),
            (
                "script",
                4,
                prop::collection::vec(answer(excluded), 1..=4)
                    .prop_map(Op::Script)
                    .boxed(),
            ),
            (
                "reasons",
                2,
                any::<bool>().prop_map(Op::LongReasons).boxed(),
            ),
            // Hour steps whose sums never land within minutes of the 24 h age limit.
            (
                "advance",
                2,
                prop::sample::select(vec![7u32, 13, 29])
                    .prop_map(Op::Advance)
                    .boxed(),
            ),
            ("reopen", 1, Just(Op::Reopen).boxed()),
            ("fail", 2, (1u8..=6).prop_map(Op::FailWrites).boxed()),
            ("full", 1, (1u8..=3).prop_map(Op::DiskFull).boxed()),
        ],
        excluded,
    )
}

fn case() -> impl Strategy<Value = Case> {
    let excluded = excluded();
    let always = if excluded.contains("always") {
        Just(false).boxed()
    } else if excluded.contains("spill") {
        Just(true).boxed()
    } else {
        prop::bool::weighted(0.3).boxed()
    };
    (always, prop::collection::vec(op(&excluded), 4..=28))
        .prop_map(|(always, ops)| Case { always, ops })
}

// ---- The harness ------------------------------------------------------------------------

/// When the SDK accepted an event (tracked or redriven): the step, and the wall clock read just
/// before and just after the call, so the true moment lies between them.
#[derive(Clone, Copy, Debug)]
struct Accepted {
    step: usize,
    lo_ms: i64,
    hi_ms: i64,
}

/// Counters summed over the handles already closed.
#[derive(Default)]
struct Totals {
    tracked: u64,
    restored: u64,
    redriven: u64,
    delivered: u64,
    quarantined: u64,
    dropped: BTreeMap<String, u64>,
}

impl Totals {
    fn add(&mut self, st: &Stats) {
        self.tracked += st.tracked;
        self.restored += st.restored;
        self.redriven += st.redriven;
        self.delivered += st.delivered;
        self.quarantined += st.quarantined;
        for (reason, n) in &st.dropped {
            *self.dropped.entry(reason.clone()).or_insert(0) += n;
        }
    }

    fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped.get(reason.as_str()).copied().unwrap_or(0)
    }
}

struct Harness {
    _dir: tempfile::TempDir,
    db: PathBuf,
    collector: ReferenceCollector,
    clock: Arc<ManualClock>,
    spool: Option<EventSpool>,
    always: bool,
    online: bool,
    step: usize,
    /// Every id the app was given, with each acceptance in order.
    accepted: HashMap<String, Vec<Accepted>>,
    /// Ids deleted from the quarantine by `quarantine_purge` (not a drop: an operator's act).
    quarantine_purged: HashSet<String>,
    closed: Totals,
    /// The step in which each collector request (by index) was sent.
    request_steps: Vec<usize>,
    /// The store's fault point, the same for every handle on the file.
    faults: StoreFaults,
    /// The step before which the full disk empties again.
    full_until: Option<usize>,
    /// A fault step has run: the app's verbs may be refused by the store from then on.
    faulted: bool,
}

fn disk_cap() -> u64 {
    std::env::var("EVENTSPOOL_MODEL_DISK_CAP")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_DISK_CAP)
}

fn config(url: &str, db: &Path, always: bool) -> Config {
    let mut c = Config::new(url);
    c.db_path = Some(db.to_path_buf());
    c.memory_capacity = 6;
    c.max_disk_bytes = disk_cap();
    c.max_event_bytes = 4 * 1024;
    c.max_batch_events = 8;
    c.min_batch_interval_ms = 0;
    c.flush_at = 1;
    c.flush_interval_ms = 1_000;
    c.backoff_base_ms = 100;
    c.backoff_cap_ms = 1_000;
    c.max_auto_attempts = 2;
    c.attempt_timeout_ms = ATTEMPT_TIMEOUT_MS;
    c.max_event_age_ms = MAX_AGE_MS as u64;
    c.durability = if always {
        Durability::Always
    } else {
        Durability::Spill
    };
    c
}

fn ms_of(rfc3339: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .ok()
        .map(|t| t.timestamp_millis())
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("timestamp in range")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn properties(big: bool) -> serde_json::Value {
    if big {
        serde_json::json!({"pad": "x".repeat(BIG_PAD_BYTES)})
    } else {
        serde_json::json!({"screen": "home"})
    }
}

/// Where the worker rests once it has done all it will do without a new request from the app.
/// `WaitingForUser` is not such a place: behind it the slow probe goes out by itself, at once on
/// this clock whose sleeps complete immediately, and its answer may deliver or quarantine
/// events while the harness reads the quarantine.
fn at_rest(status: &DeliveryStatus, online: bool) -> bool {
    if !online {
        return matches!(status.state, DeliveryState::Offline);
    }
    match status.state {
        DeliveryState::Idle => status.pending == 0,
        DeliveryState::Paused { .. } => true,
        _ => false,
    }
}

fn ids_in(db: &Path, table: &str) -> Result<HashSet<String>, String> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| format!("open {}: {e}", db.display()))?;
    let mut stmt = conn
        .prepare(&format!("SELECT event_id FROM {table}"))
        .map_err(|e| e.to_string())?;
    let ids = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(|e| e.to_string())?
        .collect::<rusqlite::Result<HashSet<String>>>()
        .map_err(|e| e.to_string())?;
    Ok(ids)
}

impl Harness {
    fn start(always: bool) -> Result<Harness, String> {
        let collector = ReferenceCollector::start(CollectorConfig {
            behavior: Behavior {
                reject_name: Some(Name::Poison.as_str().into()),
                partial_reject_name: Some(Name::Reject.as_str().into()),
                ..Behavior::default()
            },
            ..CollectorConfig::default()
        })
        .map_err(|e| format!("collector: {e}"))?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let db = dir.path().join("events.db");
        let mut h = Harness {
            _dir: dir,
            db,
            collector,
            clock: Arc::new(ManualClock::auto_advancing(WALL_START_MS)),
            spool: None,
            always,
            online: true,
            step: 0,
            accepted: HashMap::new(),
            quarantine_purged: HashSet::new(),
            closed: Totals::default(),
            request_steps: Vec::new(),
            faults: StoreFaults::new(),
            full_until: None,
            faulted: false,
        };
        h.open()?;
        Ok(h)
    }

    fn open(&mut self) -> Result<(), String> {
        let clock: Arc<dyn Clock> = Arc::new(self.clock.clone());
        let mut builder = EventSpool::builder(config(&self.collector.url(), &self.db, self.always))
            .clock(clock)
            .store_faults(self.faults.clone());
        if !self.online {
            builder = builder.start_offline();
        }
        self.spool = Some(builder.open().map_err(|e| format!("open: {e}"))?);
        Ok(())
    }

    fn spool(&self) -> &EventSpool {
        self.spool.as_ref().expect("spool is open")
    }

    fn wall(&self) -> i64 {
        self.clock.wall_ms()
    }

    fn accept(&mut self, id: String, lo_ms: i64, hi_ms: i64) {
        self.accepted.entry(id).or_default().push(Accepted {
            step: self.step,
            lo_ms,
            hi_ms,
        });
    }

    fn track(&mut self, name: Name, big: bool, age: Age) -> Result<(), String> {
        let lo = self.wall();
        let result = if age == Age::Now {
            self.spool().track(name.as_str(), properties(big))
        } else {
            let mut event = NewEvent::new(name.as_str(), properties(big));
            event.timestamp = Some(rfc3339(lo - age.ms()));
            self.spool().track_event(event)
        };
        let hi = self.wall();
        match result {
            Ok(id) => self.accept(id.to_string(), lo, hi),
            // Queued all the same (only the durability promise failed).
            Err(eventspool::Error::NotDurable { event_ids, .. }) => {
                for id in event_ids {
                    self.accept(id.to_string(), lo, hi);
                }
            }
            Err(e) => return Err(format!("track refused: {e}")),
        }
        Ok(())
    }

    fn burst(&mut self, events: &[(Name, bool)]) -> Result<(), String> {
        let batch: Vec<NewEvent> = events
            .iter()
            .map(|(name, big)| NewEvent::new(name.as_str(), properties(*big)))
            .collect();
        let lo = self.wall();
        let result = self.spool().track_batch(&batch);
        let hi = self.wall();
        let ids = match result {
            Ok(ids) => ids,
            Err(eventspool::Error::NotDurable { event_ids, .. }) => event_ids,
            Err(e) => return Err(format!("track_batch refused: {e}")),
        };
        for id in ids {
            self.accept(id.to_string(), lo, hi);
        }
        Ok(())
    }

    fn quarantined_ids(&self) -> Result<Vec<String>, String> {
        Ok(self
            .spool()
            .quarantine_list(&ListFilter::default())
            .map_err(|e| format!("quarantine_list: {e}"))?
            .into_iter()
            .map(|q| q.event_id)
            .collect())
    }

    /// Carries out one operation; returns whether the worker must make progress before it can
    /// be called settled (it was waiting for the user, who just asked for something).
    fn apply(&mut self, op: &Op) -> Result<bool, String> {
        let waiting = matches!(
            self.spool().state().state,
            DeliveryState::WaitingForUser { .. }
        );
        match op {
            Op::Track { name, big, age } => self.track(*name, *big, *age)?,
            Op::Burst(events) => self.burst(events)?,
            Op::Persist => {
                if let Err(e) = self.spool().persist() {
                    self.refused_by_store("persist", e)?;
                }
            }
            Op::SetOnline(online) => {
                self.online = *online;
                self.spool().set_online(*online);
            }
            Op::Flush => self.spool().flush(),
            Op::RetryNow => {
                self.spool().retry_now();
                return Ok(waiting && self.online);
            }
            Op::Dismiss => {
                self.spool().dismiss();
                return Ok(waiting && self.online);
            }
            Op::PurgePending => {
                if let Err(e) = self.spool().purge_pending() {
                    self.refused_by_store("purge_pending", e)?;
                }
            }
            Op::Redrive => {
                let ids = self.quarantined_ids()?;
                let lo = self.wall();
                let n = match self.spool().quarantine_redrive(&Selector::All) {
                    Ok(n) => n,
                    Err(e) => {
                        return self
                            .refused_by_store("quarantine_redrive", e)
                            .map(|_| false);
                    }
                };
                let hi = self.wall();
                if n != ids.len() as u64 {
                    return Err(format!(
                        "quarantine_redrive moved {n} events but the quarantine listed {}",
                        ids.len()
                    ));
                }
                for id in ids {
                    self.accept(id, lo, hi);
                }
            }
            Op::PurgeQuarantine => {
                let ids = self.quarantined_ids()?;
                let n = match self.spool().quarantine_purge(&Selector::All) {
                    Ok(n) => n,
                    Err(e) => return self.refused_by_store("quarantine_purge", e).map(|_| false),
                };
                if n != ids.len() as u64 {
                    return Err(format!(
                        "quarantine_purge deleted {n} events but the quarantine listed {}",
                        ids.len()
                    ));
                }
                self.quarantine_purged.extend(ids);
            }
            Op::Script(answers) => self
                .collector
                .push_script(answers.iter().map(|a| a.scripted())),
            Op::LongReasons(long) => {
                let mut b = self.collector.behavior();
                b.partial_reject_reason = long.then(|| "r".repeat(LONG_REASON_BYTES));
                self.collector.set_behavior(b);
            }
            Op::Advance(hours) => self
                .clock
                .advance(Duration::from_millis(*hours as u64 * HOUR_MS as u64)),
            Op::Reopen => self.reopen()?,
            Op::FailWrites(k) => {
                self.faulted = true;
                self.faults
                    .fail_next(FaultSite::Write, u64::from(*k), FaultError::IoErr);
            }
            Op::FailWriteAt(n) => {
                self.faulted = true;
                self.faults
                    .fail_nth(FaultSite::Write, u64::from(*n), FaultError::IoErr);
            }
            Op::DiskFull(steps) => {
                self.faulted = true;
                self.faults.fill_disk(FaultError::Full);
                self.full_until = Some(self.step + usize::from(*steps));
            }
        }
        Ok(false)
    }

    /// A verb the store refused: fine once a fault step ran (nothing changed; the model checks
    /// that), a failure otherwise.
    fn refused_by_store(&self, verb: &str, e: eventspool::Error) -> Result<(), String> {
        if self.faulted && matches!(e, eventspool::Error::Storage(_)) {
            Ok(())
        } else {
            Err(format!("{verb}: {e}"))
        }
    }

    /// Space returns (before a reopen, at the end, or when the full disk's steps are over).
    fn disarm(&mut self) {
        self.faults.disarm();
        self.full_until = None;
    }

    /// Waits until the worker rests (and, after a request from a waiting user, has acted on it).
    fn settle(&mut self, before_requests: u64, needs_progress: bool) -> Result<(), String> {
        let spool = self.spool();
        let online = self.online;
        let settled = spool.wait_for(SETTLE, |status| {
            at_rest(status, online)
                && (!needs_progress
                    || spool.stats().requests > before_requests
                    || (matches!(status.state, DeliveryState::Idle) && status.pending == 0))
        });
        if settled.is_none() {
            return Err(format!(
                "the worker did not settle within {} s: state {:?}, stats {:?}",
                SETTLE.as_secs(),
                spool.state(),
                spool.stats()
            ));
        }
        let count = self.collector.request_count();
        while self.request_steps.len() < count {
            self.request_steps.push(self.step);
        }
        Ok(())
    }

    /// The checks of the module docs that one handle's figures must pass.
    fn check_counts(&self, st: &Stats) -> Result<(), String> {
        let raw = st.tracked as i128 + st.restored as i128 + st.redriven as i128
            - st.delivered as i128
            - st.quarantined as i128
            - st.dropped_from_queue() as i128;
        let held = (st.pending_memory + st.pending_disk) as i128;
        if raw != held {
            return Err(format!(
                "ledger: tracked {} + restored {} + redriven {} - delivered {} - quarantined {} - dropped {} = {raw} pending, but memory holds {} and the store {}",
                st.tracked,
                st.restored,
                st.redriven,
                st.delivered,
                st.quarantined,
                st.dropped_from_queue(),
                st.pending_memory,
                st.pending_disk
            ));
        }
        if st.pending as i128 != held {
            return Err(format!(
                "stats().pending is {} but memory holds {} and the store {}",
                st.pending, st.pending_memory, st.pending_disk
            ));
        }
        if !st.balances() {
            return Err(format!("Stats::balances() is false: {st:?}"));
        }
        let rows = eventspool::admin::inspect(&self.db)
            .map_err(|e| format!("admin::inspect: {e}"))?
            .pending;
        let owed = self.faults.owed_rows();
        if rows != st.pending_disk + owed {
            return Err(format!(
                "the store's events table has {rows} rows but the spool counts {} on disk (and owes a delete to {owed})",
                st.pending_disk
            ));
        }
        let on_disk = eventspool::disk_usage(&self.db);
        let cap = disk_cap();
        if st.store_bytes > cap || on_disk > cap {
            return Err(format!(
                "store of {} bytes on disk (stats say {}) is over max_disk_bytes {cap}; quarantine {:?}, {} queued",
                on_disk, st.store_bytes, st.quarantine, st.pending_disk
            ));
        }
        Ok(())
    }

    /// Ids the collector acknowledged: in a 2xx answer and not listed as rejected.
    fn acknowledged(&self) -> HashSet<String> {
        let mut acked = HashSet::new();
        for r in self.collector.requests() {
            if r.status.is_some_and(|s| (200..300).contains(&s)) {
                for (id, name) in r.event_ids.iter().zip(&r.names) {
                    if name != Name::Reject.as_str() {
                        acked.insert(id.clone());
                    }
                }
            }
        }
        acked
    }

    /// The acceptance in force when request `step` was sent.
    fn acceptance_at(&self, id: &str, step: usize) -> Option<Accepted> {
        self.accepted
            .get(id)?
            .iter()
            .rev()
            .find(|a| a.step <= step)
            .copied()
    }

    fn check_collector(&self, st: &Stats) -> Result<(), String> {
        let records = self.collector.requests();
        let delivered = self.closed.delivered + st.delivered;
        let acked = self.acknowledged();
        if delivered != acked.len() as u64 {
            return Err(format!(
                "the spool counts {delivered} delivered but the collector acknowledged {} distinct events",
                acked.len()
            ));
        }
        // (id, timestamp ms, step first sent) in order of first sending.
        let mut first_seen: Vec<(String, i64, usize)> = Vec::new();
        let mut seen = HashSet::new();
        for r in &records {
            let step = self
                .request_steps
                .get(r.index)
                .copied()
                .unwrap_or(self.step);
            let sent_ms = r.sent_at.as_deref().and_then(ms_of);
            let mut last_ts = i64::MIN;
            for (id, ts) in r.event_ids.iter().zip(&r.timestamps) {
                let Some(accepted) = self.acceptance_at(id, step) else {
                    return Err(format!(
                        "request #{} carried {id}, which the app never tracked",
                        r.index
                    ));
                };
                let ts_ms = ms_of(ts)
                    .ok_or_else(|| format!("request #{} has timestamp '{ts}'", r.index))?;
                if ts_ms < last_ts {
                    return Err(format!(
                        "request #{} is out of timestamp order: {ts} after {}",
                        r.index,
                        rfc3339(last_ts)
                    ));
                }
                last_ts = ts_ms;
                if let Some(sent_ms) = sent_ms
                    && sent_ms - accepted.hi_ms > MAX_AGE_MS
                {
                    return Err(format!(
                        "request #{} (step {step}) sent {id} {:.1} h after the SDK accepted it (max_event_age_ms is {} h)",
                        r.index,
                        (sent_ms - accepted.hi_ms) as f64 / HOUR_MS as f64,
                        MAX_AGE_MS / HOUR_MS
                    ));
                }
                if seen.insert(id.clone()) {
                    first_seen.push((id.clone(), ts_ms, step));
                }
            }
        }
        // An event queued when a batch was put together must not follow a newer one. Only a
        // send in a later step than the one that queued the event counts: within that step the
        // worker may already have put the newer event's batch together (a retry, the other half
        // of a split), and a batch is not reopened for an older event that arrives after it.
        for (l, (id, ts, _)) in first_seen.iter().enumerate() {
            let available = self.accepted[id][0].step;
            if let Some((newer, newer_ts, step)) = first_seen[..l]
                .iter()
                .find(|(_, t, step)| *step > available && t > ts)
            {
                return Err(format!(
                    "{id} ({}, queued at step {available}) was first sent after the newer {newer} ({}, sent at step {step})",
                    rfc3339(*ts),
                    rfc3339(*newer_ts)
                ));
            }
        }
        let expired = self.closed.dropped(DropReason::Expired) + st.dropped(DropReason::Expired);
        let cutoff = self.wall() - MAX_AGE_MS;
        let old_enough = self
            .accepted
            .values()
            .filter(|a| a.last().is_some_and(|a| a.lo_ms <= cutoff))
            .count() as u64;
        if expired > old_enough {
            return Err(format!(
                "{expired} events dropped as expired, but only {old_enough} were accepted more than {} h ago",
                MAX_AGE_MS / HOUR_MS
            ));
        }
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        let st = self.spool().stats();
        self.check_counts(&st)?;
        self.check_collector(&st)
    }

    /// Checks once the worker has settled. The spill thread may still be writing overflow
    /// (between taking it from memory and committing it, an event is briefly in neither
    /// count), so a failed check is repeated a bounded number of times before it counts.
    fn check_settled(&self) -> Result<(), String> {
        let mut last = Ok(());
        for _ in 0..30 {
            last = self.check();
            if last.is_ok() {
                return last;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        last
    }

    /// Shuts the spool down and accounts for every id it was ever given.
    fn close(&mut self) -> Result<(), String> {
        self.disarm();
        let spool = self.spool.take().expect("spool is open");
        spool
            .shutdown(Duration::from_secs(10))
            .map_err(|e| format!("shutdown: {e}"))?;
        let st = spool.stats();
        drop(spool);
        self.check_counts(&st)
            .map_err(|e| format!("after shutdown: {e}"))?;
        if st.pending_memory != 0 {
            return Err(format!(
                "shutdown left {} events in memory only",
                st.pending_memory
            ));
        }
        self.closed.add(&st);
        self.audit()
    }

    /// Drops the last handle (which shuts the spool down and persists what memory holds) and
    /// accounts for every id. What the implicit shutdown evicts to fit the cap is read from the
    /// store's persisted counters, since the handle's own are gone with it.
    fn drop_spool(&mut self) -> Result<(), String> {
        let spool = self.spool.take().expect("spool is open");
        // What dropping the last handle does (`Drop` calls `shutdown` with two seconds, its
        // error ignored), made explicit so the figures are read after it: the attempt in flight
        // gets its answer first, and the final persist may evict (`disk_cap`), both counted.
        let _ = spool.shutdown(Duration::from_secs(2));
        let st = spool.stats();
        drop(spool);
        self.closed.add(&st);
        self.audit()
    }

    /// Every tracked id is acknowledged, quarantined, queued, or one of the counted drops.
    fn audit(&self) -> Result<(), String> {
        let acked = self.acknowledged();
        let queued = ids_in(&self.db, "events")?;
        let quarantined = ids_in(&self.db, "quarantine")?;
        for (a, b, what) in [
            (
                &acked,
                &queued,
                "acknowledged by the collector and still queued",
            ),
            (
                &acked,
                &quarantined,
                "acknowledged by the collector and quarantined",
            ),
            (&queued, &quarantined, "both queued and quarantined"),
        ] {
            if let Some(id) = a.intersection(b).next() {
                return Err(format!("{id} is {what}"));
            }
        }
        let gone = self
            .accepted
            .keys()
            .filter(|id| {
                !acked.contains(*id)
                    && !queued.contains(*id)
                    && !quarantined.contains(*id)
                    && !self.quarantine_purged.contains(*id)
            })
            .count() as u64;
        let dropped: u64 = self.closed.dropped.values().sum();
        if gone != dropped && std::env::var("EVENTSPOOL_MODEL_DEBUG").is_ok() {
            for id in self.accepted.keys().filter(|id| {
                !acked.contains(*id)
                    && !queued.contains(*id)
                    && !quarantined.contains(*id)
                    && !self.quarantine_purged.contains(*id)
            }) {
                eprintln!("gone: {id} accepted {:?}", self.accepted[id]);
            }
            for r in self.collector.requests() {
                eprintln!(
                    "request #{} status {:?} ids {:?} names {:?}",
                    r.index, r.status, r.event_ids, r.names
                );
            }
            eprintln!("purged {:?}", self.quarantine_purged);
        }
        if gone != dropped {
            return Err(format!(
                "{gone} tracked events are neither delivered, quarantined nor queued, but {dropped} drops were counted ({:?})",
                self.closed.dropped
            ));
        }
        Ok(())
    }

    fn reopen(&mut self) -> Result<(), String> {
        self.disarm();
        self.drop_spool()?;
        let left = eventspool::admin::inspect(&self.db)
            .map_err(|e| format!("admin::inspect: {e}"))?
            .pending;
        self.open()?;
        let restored = self.spool().stats().restored;
        if restored != left {
            return Err(format!(
                "the new handle restored {restored} events but the store held {left}"
            ));
        }
        Ok(())
    }
}

fn run_case(case: &Case) -> Result<(), String> {
    let mut h = Harness::start(case.always)?;
    h.settle(0, false)?;
    for (i, op) in case.ops.iter().enumerate() {
        h.step = i + 1;
        if h.full_until.is_some_and(|until| h.step >= until) {
            h.disarm();
        }
        let step = |e: String| format!("step {} `{op}`: {e}", i + 1);
        let before = h.spool().stats().requests;
        let needs_progress = h.apply(op).map_err(step)?;
        let before = if matches!(op, Op::Reopen) { 0 } else { before };
        h.settle(before, needs_progress).map_err(step)?;
        h.check_settled().map_err(step)?;
    }
    h.step += 1;
    h.close()
        .map_err(|e| format!("at the end (shutdown and audit): {e}"))
}

fn model_config() -> ProptestConfig {
    let cases = std::env::var("EVENTSPOOL_MODEL_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    // A run that leaves operations out generates other cases from the same seeds: keep its
    // findings out of the committed file.
    let failure_persistence = if excluded().is_empty() {
        Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS))
            as Box<dyn proptest::test_runner::FailurePersistence>)
    } else {
        None
    };
    ProptestConfig {
        cases,
        max_shrink_iters: 400,
        max_shrink_time: 120_000,
        failure_persistence,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(model_config())]

    /// The whole engine against its promises, over random sequences of app and collector moves.
    #[test]
    fn model_engine_keeps_its_promises(case in case()) {
        run_case(&case).map_err(TestCaseError::fail)?;
    }
}

/// Replays one recorded case (the compact form a failure prints) and fails with what broke.
fn replay(text: &str) {
    let case = parse_case(text).unwrap_or_else(|e| panic!("bad case text: {e}"));
    if let Err(e) = run_case(&case) {
        panic!("{e}\n    case: {case:?}");
    }
}

// Shrunk failures the model found, replayed deterministically so each fix can run
// its own: `cargo test --all-features --test reliability model_replay`.

/// Point 2: a 2xx whose `rejected` list outgrows the response read bound.
#[test]
fn model_replay_cut_rejected_list_is_not_delivered() {
    replay("spill: long_reasons burst:reject,reject,reject");
}

/// Point 3: dead letters grow the file past `max_disk_bytes`.
#[test]
fn model_replay_quarantine_stays_inside_the_disk_cap() {
    let burst = format!("burst:{}", ["reject+big"; 10].join(","));
    let bursts = [burst.as_str(); 6].join(" ");
    replay(&format!("spill: offline {bursts} online"));
}

/// Point 4: `persist()` while a batch is in flight puts its events in two places.
#[test]
fn model_replay_persist_during_a_batch_keeps_one_copy() {
    replay("spill: script:503,503,503 track:ok persist purge_pending retry_now");
}

/// Point 5: `retry_now()` sends a batch whose events expired while it waited.
#[test]
fn model_replay_retry_checks_age_before_sending() {
    replay("spill: script:503,503,503 track:ok advance:29h retry_now");
}

/// Point 6: an importer's old timestamp is not an old acceptance.
#[test]
fn model_replay_age_counts_from_track() {
    replay("spill: track:ok@31h");
}

/// Point 6: a redriven dead letter's age starts at the redrive.
#[test]
fn model_replay_age_counts_from_redrive() {
    replay("spill: script:400 track:ok advance:29h redrive");
}

/// The store's fault steps: a quarantine purge the store refused had already emptied the dead
/// letters held in memory (the quarantine write before it had failed), and said it purged none.
#[test]
fn model_replay_a_refused_purge_keeps_the_dead_letters_held_in_memory() {
    replay("spill: fail:3 track:reject purge_quarantine track:ok");
}

/// The store's fault steps: a `persist()` of six 1.5 KB events is three transactions at the
/// model's cap; the second write fails after the first transaction committed. Those two events
/// are on disk only, not also handed back to memory.
#[test]
fn model_replay_a_persist_failing_part_way_keeps_what_committed_on_disk_only() {
    replay(
        "spill: offline track:ok+big track:ok+big track:ok+big track:ok+big track:ok+big \
         track:ok+big failat:2 persist online flush",
    );
}

/// `DELETE FROM quarantine` on an empty quarantine changes no row but still writes a few WAL
/// frames; the store checked its cap only after a transaction that changed rows, so two purges
/// on a store near its cap left it 296 bytes over.
#[test]
fn model_replay_empty_purges_keep_the_store_inside_its_cap() {
    replay(
        "always: offline burst:ok+big,ok+big,ok+big,ok+big burst:ok+big,ok+big track:ok+big \
         track:ok+big track:ok+big burst:ok+big,ok+big,ok+big,ok+big,ok+big track:ok@3m \
         purge_quarantine purge_quarantine",
    );
}

/// Replays the case in `EVENTSPOOL_MODEL_CASE` (as a failure prints it), for diagnosis:
/// `EVENTSPOOL_MODEL_CASE="spill: track:ok offline" cargo test --all-features --test reliability
/// model_replay_from_env -- --ignored --nocapture`.
#[test]
#[ignore = "a diagnosis tool: replays the case given in EVENTSPOOL_MODEL_CASE"]
fn model_replay_from_env() {
    let text = std::env::var("EVENTSPOOL_MODEL_CASE").expect("set EVENTSPOOL_MODEL_CASE");
    replay(&text);
}

#[test]
fn model_case_text_round_trips() {
    let text = "always: track:ok track:reject+big@31h burst:ok,poison+big persist offline online \
                flush retry_now dismiss purge_pending redrive purge_quarantine script:503,400,413,drop,hang \
                long_reasons short_reasons advance:29h reopen fail:3 failat:4 full:2";
    let case = parse_case(text).expect("parses");
    assert_eq!(case.ops.len(), 20);
    let again = parse_case(format!("{case:?}").trim_matches('"')).expect("parses again");
    assert_eq!(again, case);
}

//! `send` and `flush`: track, drain until done or stuck, summarize.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use eventspool::{
    Config, DeliveryObserver, DeliveryState, DeliveryStatus, EventSpool, NewEvent, Notice, Stats,
};
use serde_json::{Value, json};

use crate::{CmdResult, Connection, EXIT_ERROR, EXIT_OK, EXIT_PENDING, Failure, print_json};

pub const SEND_HELP: &str = "\
Each input line is one event: {\"name\", \"properties\", \"timestamp\"?, \"event_id\"?, \"session_id\"?}.
Every line is checked before anything is sent; a bad line stops with exit 2 naming its number.
Prints {\"delivered\",\"quarantined\",\"pending\",\"dropped\":{...},\"state\",\"attempts\"} on stdout;
a stop adds \"last_error\" (one line), \"last_status\", and \"pause\" (auth or config) when paused.
Exit 0: nothing pending. 3: stopped (retries spent, paused, or --timeout) with events pending;
with --db they stay in the store for `eventspool flush`. 1: the store failed (disk full, I/O
error): reading stops, the summary still prints, with \"store_error\", the input lines not
tracked as \"untracked\", and the events that were only in memory at the end counted as
dropped \"store_refused\" (each named on stderr); what the store holds stays for a `flush`.

Example:
  printf '%s\\n' '{\"name\":\"app_open\",\"properties\":{\"build\":\"1.2\"}}' |
    eventspool send --endpoint http://127.0.0.1:8080/v1/batch --db events.db --input -";

pub const FLUSH_HELP: &str = "\
Delivers the events a store holds: left pending by an earlier send, or redriven from the
quarantine. Same summary and exit codes as `send`.

Example:
  eventspool flush --endpoint http://127.0.0.1:8080/v1/batch --db events.db --timeout 60";

#[derive(Args)]
pub struct SendArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// JSON Lines file to read, or `-` for stdin.
    #[arg(long, default_value = "-")]
    pub input: PathBuf,
}

#[derive(Args)]
pub struct FlushArgs {
    #[command(flatten)]
    pub conn: Connection,
}

/// Reads and checks every line; nothing is tracked unless all of them are good.
fn read_events(input: &PathBuf, max_event_bytes: u64) -> Result<Vec<NewEvent>, Failure> {
    let reader: Box<dyn BufRead> = if input.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(input)
            .map_err(|e| Failure::bad_input(format!("cannot read {}: {e}", input.display())))?;
        Box::new(std::io::BufReader::new(file))
    };
    let now = chrono::Utc::now().timestamp_millis();
    let mut events = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let number = i + 1;
        let line =
            line.map_err(|e| Failure::bad_input(format!("line {number}: cannot read: {e}")))?;
        let Some(event) =
            NewEvent::from_numbered_line(number, &line).map_err(Failure::bad_input)?
        else {
            continue;
        };
        event
            .to_wire_json(now, max_event_bytes)
            .map_err(|e| Failure::bad_input(format!("line {number}: {e}")))?;
        events.push(event);
    }
    Ok(events)
}

pub fn send(args: SendArgs) -> CmdResult {
    let config = args.conn.config()?;
    let timeout = args.conn.timeout()?;
    let events = read_events(&args.input, config.max_event_bytes)?;
    let deadline = Instant::now() + timeout;
    let has_store = config.db_path.is_some();
    let capacity = config.memory_capacity;
    let (spool, drops) = open(config)?;
    let total = events.len() as u64;
    let mut progress = Progress::new(total);
    // Set when the store refuses a write: reading stops there, so no more events pile up in
    // memory that the run could not keep.
    let mut store_error: Option<String> = None;
    for (i, event) in events.into_iter().enumerate() {
        let left = total - i as u64 - 1;
        match spool.track_event(event) {
            Ok(_) => {}
            // Queued in memory all the same; the store refused it (a critical event).
            Err(eventspool::Error::NotDurable { reason, .. }) => store_error = Some(reason),
            Err(e) => return Err(e.into()),
        }
        if has_store {
            // Hand memory over to the store in steps so a fast reader never outruns the spill.
            if store_error.is_none()
                && (i as u64 + 1).is_multiple_of((capacity / 2).max(1))
                && let Err(e) = spool.persist()
            {
                store_error = Some(e.to_string());
            }
            if let Some(e) = &store_error {
                eprintln!(
                    "eventspool: the store failed ({e}); {left} input lines were not tracked"
                );
                return finish(&spool, &drops, deadline, &mut progress, left, store_error);
            }
        } else if spool.stats().pending_memory >= capacity {
            // Memory only: wait for room rather than overflow (which would drop events).
            let room = spool.wait_for(deadline.saturating_duration_since(Instant::now()), |st| {
                st.pending < capacity || stuck(st)
            });
            if room.is_none_or(|st| st.pending >= capacity) {
                eprintln!("eventspool: delivery stalled; {left} input lines were not tracked");
                return finish(&spool, &drops, deadline, &mut progress, left, None);
            }
        }
    }
    if has_store && let Err(e) = spool.persist() {
        eprintln!("eventspool: the store failed ({e})");
        store_error = Some(e.to_string());
    }
    finish(&spool, &drops, deadline, &mut progress, 0, store_error)
}

pub fn flush(args: FlushArgs) -> CmdResult {
    let config = args.conn.config()?;
    if config.db_path.is_none() {
        return Err(Failure::bad_input(
            "flush needs --db: there is nothing to deliver without a store",
        ));
    }
    let deadline = Instant::now() + args.conn.timeout()?;
    let (spool, drops) = open(config)?;
    let mut progress = Progress::new(spool.stats().pending);
    finish(&spool, &drops, deadline, &mut progress, 0, None)
}

/// Opens the spool with a [`DropReporter`] watching it from the start.
fn open(config: Config) -> Result<(EventSpool, Arc<DropReporter>), Failure> {
    let drops = Arc::new(DropReporter::default());
    let spool = EventSpool::builder(config).observer(drops.clone()).open()?;
    Ok((spool, drops))
}

/// Names on stderr every event the spool dropped, with the reason, as the SDK reports them
/// ([`Notice::EventsDropped`]); a tool that loses an event says which one.
#[derive(Default)]
struct DropReporter {
    /// Events named so far, by reason.
    named: Mutex<BTreeMap<String, u64>>,
}

impl DeliveryObserver for DropReporter {
    fn on_state(&self, _status: &DeliveryStatus) {}

    fn on_notice(&self, notice: &Notice) {
        let Notice::EventsDropped { reason, event_ids } = notice else {
            return;
        };
        let why = match reason.as_str() {
            "expired" => "expired: accepted longer than max_event_age_ms ago, never sent",
            "store_refused" => {
                "store_refused: the store could not take it (disk full or failing) and the run ended with it only in memory"
            }
            other => other,
        };
        let mut err = std::io::stderr().lock();
        for id in event_ids {
            let _ = writeln!(err, "eventspool: dropped event {id}: {why}");
        }
        *self
            .named
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason.clone())
            .or_default() += event_ids.len() as u64;
    }
}

impl DropReporter {
    /// Drops the SDK counted without naming the events (memory overflow, disk cap, ...): said
    /// as counts, so none goes unmentioned.
    fn report_unnamed(&self, stats: &Stats) {
        let named = self.named.lock().unwrap_or_else(|p| p.into_inner());
        for (reason, n) in &stats.dropped {
            let unnamed = n.saturating_sub(named.get(reason).copied().unwrap_or(0));
            if unnamed > 0 {
                eprintln!("eventspool: dropped {unnamed} events: {reason}");
            }
        }
    }
}

/// States in which waiting longer achieves nothing without someone acting.
fn stuck(status: &DeliveryStatus) -> bool {
    matches!(
        status.state,
        DeliveryState::WaitingForUser { .. }
            | DeliveryState::Paused { .. }
            | DeliveryState::Disabled
            | DeliveryState::Deferred { .. }
    )
}

/// Drains, prints the summary, closes the spool (pending events go to the store). A store
/// that failed (`store_error`, or the final persist at shutdown) still gets its summary, with
/// exit 1.
fn finish(
    spool: &EventSpool,
    drops: &DropReporter,
    deadline: Instant,
    progress: &mut Progress,
    untracked: u64,
    mut store_error: Option<String>,
) -> CmdResult {
    spool.flush();
    let last = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = left.min(Duration::from_millis(200));
        let status = spool.wait_for(step, |st| st.is_drained() || stuck(st));
        progress.show(&spool.stats());
        match status {
            Some(st) => break st,
            None if left.is_zero() => break spool.state(),
            None => {}
        }
    };
    progress.done();
    if stuck(&last) {
        // The status line already names the last error; once is enough.
        eprintln!("eventspool: stopped: {last}");
    }
    if let Err(e) = spool.shutdown(Duration::from_secs(10)) {
        eprintln!("eventspool: the store failed at the end ({e})");
        store_error.get_or_insert(e.to_string());
    }
    // After shutdown: what memory held was persisted, or, on a failing store, dropped and
    // counted (`store_refused`); `pending` is then what the store keeps.
    let stats = spool.stats();
    drops.report_unnamed(&stats);
    if stats.pending > 0 && stats.store_bytes == 0 {
        eprintln!(
            "eventspool: no --db given: {} undelivered events are lost",
            stats.pending
        );
    }
    print_json(&summary(
        &stats,
        &last.state,
        untracked,
        store_error.as_deref(),
    ));
    Ok(if store_error.is_some() {
        EXIT_ERROR
    } else if stats.pending == 0 && untracked == 0 {
        EXIT_OK
    } else {
        EXIT_PENDING
    })
}

/// The summary of docs/cli.md, plus what a script needs to act on a stop: `pause` (`auth` or
/// `config`) when paused, `attempts` (requests this run sent), and the one-line `last_error`
/// with its `last_status` when the run ended on a failure.
fn summary(
    stats: &Stats,
    state: &DeliveryState,
    untracked: u64,
    store_error: Option<&str>,
) -> Value {
    let dropped: serde_json::Map<String, Value> = stats
        .dropped
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| (k.clone(), json!(n)))
        .collect();
    let mut out = json!({
        "delivered": stats.delivered,
        "quarantined": stats.quarantined,
        "pending": stats.pending,
        "dropped": dropped,
        "state": state.name(),
        "attempts": stats.requests,
    });
    let last_error = match state {
        DeliveryState::Paused { reason, last_error } => {
            out["pause"] = json!(reason.as_str());
            Some(last_error)
        }
        DeliveryState::Deferred { reason } => {
            out["deferred"] = json!(reason.as_str());
            None
        }
        DeliveryState::WaitingForUser { last_error, .. }
        | DeliveryState::RetryScheduled { last_error, .. } => Some(last_error),
        _ => None,
    };
    if let Some(failure) = last_error {
        out["last_error"] = json!(failure.to_string());
        out["last_status"] = json!(failure.status);
    }
    if untracked > 0 {
        out["untracked"] = json!(untracked);
    }
    if let Some(e) = store_error {
        out["store_error"] = json!(e);
    }
    out
}

/// Progress on stderr: a redrawn line with rate and ETA on a terminal, a plain line every few
/// seconds otherwise (logs stay readable).
struct Progress {
    total: u64,
    started: Instant,
    last_line: Instant,
    tty: bool,
    drawn: bool,
}

impl Progress {
    fn new(total: u64) -> Progress {
        Progress {
            total,
            started: Instant::now(),
            last_line: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    fn show(&mut self, stats: &Stats) {
        let done = stats.delivered + stats.quarantined;
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = done as f64 / secs;
        let eta = if rate > 0.0 && self.total > done {
            format!("{:.0} s", (self.total - done) as f64 / rate)
        } else {
            "-".into()
        };
        let line = format!(
            "delivered {}/{} ({} quarantined)  {:.0} events/s  ETA {eta}  pending {}",
            stats.delivered, self.total, stats.quarantined, rate, stats.pending
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let width = 30usize;
            let filled = if self.total == 0 {
                width
            } else {
                (done.min(self.total) as usize * width) / self.total as usize
            };
            let _ = write!(
                err,
                "\r\x1b[2K[{}{}] {line}",
                "#".repeat(filled),
                " ".repeat(width - filled)
            );
            let _ = err.flush();
            self.drawn = true;
        } else if self.last_line.elapsed() >= Duration::from_secs(2) {
            let _ = writeln!(err, "{line}");
            self.last_line = Instant::now();
        }
    }

    fn done(&mut self) {
        if self.drawn {
            eprintln!();
        }
    }
}

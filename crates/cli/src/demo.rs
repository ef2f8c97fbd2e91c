//! `demo`: the whole story on loopback, rendered the way an app would render it. The real SDK
//! runs against the real reference collector on 127.0.0.1 and a real store in a temporary
//! directory; only the keyboard is optional (`--script` presses the keys itself).

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use clap::Args;
use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::terminal::{Clear, ClearType};
use crossterm::{cursor, execute, terminal};
use eventspool::{Config, DeliveryState, DeliveryStatus, EventSpool, ListFilter};
use eventspool_collector::{Behavior, CollectorConfig, ReferenceCollector};
use serde_json::json;

use crate::{CmdResult, EXIT_ERROR, EXIT_OK, Failure};

pub const HELP: &str = "\
Runs a loopback collector and an app's spool in this terminal: events tracked offline spill to
disk, the collector goes down, the retry countdown runs (keys: r retry now, b back, q quit), the
retry budget runs out, the collector comes back, r drains the backlog in order, a poison event
lands in quarantine. --script plays the same story without a keyboard and exits 0 only if the
end state is right (every good event delivered once, the poison event quarantined).

Examples:
  cargo run --release -- demo
  eventspool demo --script";

/// The event the collector refuses for good.
const POISON: &str = "checkout_poison";

#[derive(Args)]
pub struct DemoArgs {
    /// Play without a keyboard, as plain lines; exit 0 only if the end state is right.
    #[arg(long)]
    script: bool,
    /// How many events the app tracks while offline.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..=100_000))]
    events: u64,
}

/// Timings: watchable seconds on a terminal, quick ones for the script that CI runs.
struct Pace {
    backoff_base_ms: u64,
    backoff_cap_ms: u64,
    batch_gap_ms: u64,
    beat: Duration,
    tick: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    Retry,
    Back,
    Quit,
}

/// Where keys come from and where the story goes.
enum Screen {
    Terminal { live_shown: bool },
    Script { last_live: String },
}

/// Restores the terminal on every way out: normal return, error, panic (hook) and Ctrl-C (which
/// raw mode delivers as a key, handled as quit).
struct RawMode;

impl RawMode {
    fn enable() -> Result<RawMode, Failure> {
        terminal::enable_raw_mode().map_err(|e| {
            Failure::error(format!(
                "the demo needs a terminal ({e}); try `eventspool demo --script`"
            ))
        })?;
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        let _ = execute!(std::io::stdout(), cursor::Hide);
        Ok(RawMode)
    }
}

fn restore_terminal() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(std::io::stdout(), cursor::Show);
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore_terminal();
    }
}

impl Screen {
    /// A line of the story.
    fn say(&mut self, text: &str) {
        let mut out = std::io::stdout().lock();
        match self {
            Screen::Terminal { live_shown } => {
                if *live_shown {
                    let _ = execute!(out, cursor::MoveToColumn(0), Clear(ClearType::CurrentLine));
                    *live_shown = false;
                }
                for line in text.lines() {
                    let _ = write!(out, "{line}\r\n");
                }
            }
            Screen::Script { .. } => {
                let _ = writeln!(out, "{text}");
            }
        }
        let _ = out.flush();
    }

    /// The status line an app would show, redrawn in place; the script prints it when it changes.
    fn live(&mut self, text: &str, key: &str) {
        match self {
            Screen::Terminal { live_shown } => {
                let mut out = std::io::stdout().lock();
                let _ = execute!(out, cursor::MoveToColumn(0), Clear(ClearType::CurrentLine));
                let _ = write!(out, "{text}");
                let _ = out.flush();
                *live_shown = true;
            }
            Screen::Script { last_live } => {
                if last_live != key {
                    *last_live = key.to_string();
                    println!("  | {text}");
                }
            }
        }
    }

    /// Waits up to `wait` for a key (terminal); the script never has one.
    fn key(&mut self, wait: Duration) -> Option<Key> {
        match self {
            Screen::Script { .. } => {
                std::thread::sleep(wait);
                None
            }
            Screen::Terminal { .. } => {
                if !crossterm::event::poll(wait).unwrap_or(false) {
                    return None;
                }
                match crossterm::event::read() {
                    Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => match k.code {
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                            Some(Key::Quit)
                        }
                        KeyCode::Char('r' | 'R') => Some(Key::Retry),
                        KeyCode::Char('b' | 'B') | KeyCode::Esc => Some(Key::Back),
                        KeyCode::Char('q' | 'Q') => Some(Key::Quit),
                        _ => None,
                    },
                    _ => None,
                }
            }
        }
    }

    fn scripted(&self) -> bool {
        matches!(self, Screen::Script { .. })
    }
}

/// A temporary directory for the demo's store, removed at the end.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(args: DemoArgs) -> CmdResult {
    let pace = if args.script {
        Pace {
            backoff_base_ms: 200,
            backoff_cap_ms: 1000,
            batch_gap_ms: 0,
            beat: Duration::ZERO,
            tick: Duration::from_millis(20),
        }
    } else {
        Pace {
            backoff_base_ms: 1000,
            backoff_cap_ms: 8000,
            batch_gap_ms: 120,
            beat: Duration::from_millis(1500),
            tick: Duration::from_millis(100),
        }
    };
    let _raw = if args.script {
        None
    } else {
        Some(RawMode::enable()?)
    };
    let mut screen = if args.script {
        Screen::Script {
            last_live: String::new(),
        }
    } else {
        Screen::Terminal { live_shown: false }
    };
    let outcome = story(&args, &pace, &mut screen);
    if let Screen::Terminal { live_shown: true } = screen {
        screen.say("");
    }
    outcome
}

fn story(args: &DemoArgs, pace: &Pace, screen: &mut Screen) -> CmdResult {
    let dir = TempDir(std::env::temp_dir().join(format!("eventspool-demo-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)
        .map_err(|e| Failure::error(format!("cannot create {}: {e}", dir.0.display())))?;
    let collector = ReferenceCollector::start(CollectorConfig {
        behavior: Behavior {
            reject_name: Some(POISON.into()),
            ..Behavior::default()
        },
        ..CollectorConfig::default()
    })
    .map_err(|e| Failure::error(format!("cannot start the loopback collector: {e}")))?;
    let mut config = Config::new(collector.url());
    config.db_path = Some(dir.0.join("events.db"));
    config.memory_capacity = 50;
    config.max_batch_events = 20;
    config.min_batch_interval_ms = pace.batch_gap_ms;
    config.flush_interval_ms = 600_000;
    config.backoff_base_ms = pace.backoff_base_ms;
    config.backoff_cap_ms = pace.backoff_cap_ms;
    config.max_auto_attempts = 5;
    config.attempt_timeout_ms = 2000;
    let spool = EventSpool::builder(config.clone()).start_offline().open()?;
    let total = args.events;
    let poison_at = total * 3 / 5;

    screen.say(&format!(
        "eventspool demo: a loopback collector at {}, a store in {}",
        collector.url(),
        dir.0.display()
    ));
    screen.say("");
    screen.say(&format!("1. No network. The app tracks {total} events (event #{poison_at} is one the collector will refuse)."));
    let mut poison_id = String::new();
    for i in 1..=total {
        let name = if i == poison_at {
            POISON
        } else if i % 3 == 0 {
            "button_tap"
        } else {
            "screen_view"
        };
        let screen_name = ["home", "cart", "settings"][i as usize % 3];
        let id = spool.track(name, json!({"n": i, "screen": screen_name}))?;
        if i == poison_at {
            poison_id = id.to_string();
        }
    }
    let settled = Instant::now() + Duration::from_secs(5);
    while spool.stats().pending_memory > config.memory_capacity && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = spool.stats();
    screen.say(&format!(
        "   track() never waited: {} events in memory, {} spilled to disk ({} KB store). State: {}",
        s.pending_memory,
        s.pending_disk,
        s.store_bytes / 1024,
        spool.state().state.name()
    ));
    if pause(screen, pace.beat) == Some(Key::Quit) {
        return quit(screen, &spool);
    }

    screen.say("2. The network is back, but the collector is down (connections refused).");
    collector
        .set_outage(true)
        .map_err(|e| Failure::error(format!("outage: {e}")))?;
    // Every published state arrives here, so a retry that came and went between two ticks
    // is still shown (polling `state()` alone can miss a short first backoff).
    let (states, published) = mpsc::channel::<DeliveryStatus>();
    let _states = spool.add_observer(Arc::new(move |status: &DeliveryStatus| {
        let _ = states.send(status.clone());
    }));
    spool.set_online(true);
    let mut pressed_during_countdown = false;
    'outage: loop {
        let mut pending: Vec<DeliveryStatus> = published.try_iter().collect();
        if pending.is_empty() {
            pending.push(spool.state());
        }
        for status in pending {
            match &status.state {
                DeliveryState::RetryScheduled {
                    attempt,
                    max_attempts,
                    retry_in_ms,
                    ..
                } => {
                    let secs = retry_in_ms.div_ceil(1000);
                    screen.live(
                        &format!("Connection lost — attempt {attempt} of {max_attempts} — next try in {secs} s   [r] retry now  [b] back  [q] quit"),
                        &format!("retry {attempt}"),
                    );
                    if screen.scripted() && *attempt >= 2 && !pressed_during_countdown {
                        pressed_during_countdown = true;
                        screen.say(
                            "   [script presses r: retry now, while the collector is still down]",
                        );
                        spool.retry_now();
                    }
                }
                DeliveryState::WaitingForUser { .. } => break 'outage,
                DeliveryState::Idle if status.pending > 0 => break 'outage,
                _ => screen.live(&format!("{status}"), status.state.name()),
            }
        }
        match screen.key(pace.tick) {
            Some(Key::Retry) => spool.retry_now(),
            Some(Key::Back) => spool.dismiss(),
            Some(Key::Quit) => return quit(screen, &spool),
            None => {}
        }
    }
    let status = spool.state();
    match &status.state {
        DeliveryState::WaitingForUser {
            attempts, last_error, ..
        } => screen.say(&format!(
            "   Automatic retries spent after {attempts} attempts ({}): the app now waits for the user.",
            short(last_error)
        )),
        _ => screen.say(&format!("   Back: retrying stopped, {} events kept.", status.pending)),
    }
    let mut carried = pause(screen, pace.beat);
    if carried == Some(Key::Quit) {
        return quit(screen, &spool);
    }

    screen.say(
        "3. The collector is back up. Nothing is sent until the user asks (no battery spent).",
    );
    collector
        .set_outage(false)
        .map_err(|e| Failure::error(format!("outage end: {e}")))?;
    let mut script_steps = 0;
    loop {
        let status = spool.state();
        if !matches!(
            status.state,
            DeliveryState::WaitingForUser { .. } | DeliveryState::Idle
        ) {
            break;
        }
        let text = match &status.state {
            DeliveryState::WaitingForUser { attempts, .. } => format!(
                "Gave up after {attempts} attempts — {} events waiting   [r] retry now  [b] back  [q] quit",
                status.pending
            ),
            _ => format!(
                "Stopped retrying — {} events kept   [r] retry now  [q] quit",
                status.pending
            ),
        };
        screen.live(&text, status.state.name());
        let key = if screen.scripted() {
            script_steps += 1;
            // The script shows "back" first, then "retry now".
            let key = match (script_steps, &status.state) {
                (1, DeliveryState::WaitingForUser { .. }) => Some(Key::Back),
                _ => Some(Key::Retry),
            };
            let label = if key == Some(Key::Back) {
                "b: back (events kept)"
            } else {
                "r: retry now"
            };
            screen.say(&format!("   [script presses {label}]"));
            key
        } else {
            carried.take().or_else(|| screen.key(pace.tick))
        };
        match key {
            Some(Key::Retry) => {
                spool.retry_now();
                spool.flush();
                // Let the worker take the trigger before looking at the state again.
                spool.wait_for(Duration::from_secs(2), |st| {
                    !matches!(
                        st.state,
                        DeliveryState::WaitingForUser { .. } | DeliveryState::Idle
                    ) || st.pending == 0
                });
            }
            Some(Key::Back) => {
                spool.dismiss();
                spool.wait_for(Duration::from_secs(2), |st| st.state == DeliveryState::Idle);
            }
            Some(Key::Quit) => return quit(screen, &spool),
            None => {}
        }
        if spool.state().pending == 0 {
            break;
        }
    }

    screen.say("4. Draining the backlog in timestamp order, in batches of 20.");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = spool.state();
        let s = spool.stats();
        let done = s.delivered + s.quarantined;
        let width = 30;
        let filled = (done.min(total) * width / total) as usize;
        let text = format!(
            "Delivering ▕{}{}▏ {}/{} delivered, {} quarantined, {} pending   [q] quit",
            "█".repeat(filled),
            "░".repeat(width as usize - filled),
            s.delivered,
            total,
            s.quarantined,
            status.pending
        );
        if status.is_drained() {
            screen.say(&format!("   {}", text.trim_end_matches("   [q] quit")));
            break;
        }
        screen.live(&text, &format!("drain {}", done * 4 / total));
        if !matches!(status.state, DeliveryState::Sending | DeliveryState::Idle)
            || Instant::now() > deadline
        {
            screen.say(&format!("   Delivery stopped unexpectedly: {status}"));
            break;
        }
        if screen.key(pace.tick) == Some(Key::Quit) {
            return quit(screen, &spool);
        }
    }

    screen.say("5. The poison event did not block the queue: it waits in quarantine for triage.");
    let quarantined = spool.quarantine_list(&ListFilter::default())?;
    for q in &quarantined {
        screen.say(&format!(
            "   quarantined {} ({}): status {}, {}",
            q.event_id,
            q.reason,
            q.status.map_or("-".into(), |s| s.to_string()),
            q.detail
        ));
    }
    pause(screen, pace.beat);

    let s = spool.stats();
    let events = collector.events();
    let in_order = events.windows(2).all(|w| w[0].timestamp <= w[1].timestamp);
    let good = total - 1;
    let ok = s.delivered == good
        && collector.distinct_count() == good
        && quarantined.len() == 1
        && quarantined[0].event_id == poison_id
        && !collector.contains(&poison_id)
        && in_order
        && s.balances();
    screen.say("");
    screen.say(&format!(
        "Summary: {} delivered (collector holds {} distinct, {} received, {} requests), {} quarantined, {} pending, in timestamp order: {}.",
        s.delivered,
        collector.distinct_count(),
        collector.received_count(),
        collector.request_count(),
        s.quarantined,
        s.pending,
        if in_order { "yes" } else { "NO" }
    ));
    let ok = ok && fleet_loop(&collector, &spool, &poison_id, screen)?;
    spool.shutdown(Duration::from_secs(5))?;
    if ok {
        screen.say("Every good event arrived exactly once; nothing was lost.");
        Ok(EXIT_OK)
    } else {
        screen.say(&format!(
            "END STATE WRONG: expected {good} delivered and 1 quarantined ({poison_id})."
        ));
        Ok(EXIT_ERROR)
    }
}

/// The fleet loop in a few lines: the next request carries the device's client report, the
/// collector (its poison "bug" fixed) answers with a `redrive` directive, and the quarantined
/// event comes back and is delivered with its original id. Returns whether it all happened.
fn fleet_loop(
    collector: &ReferenceCollector,
    spool: &EventSpool,
    poison_id: &str,
    screen: &mut Screen,
) -> Result<bool, Failure> {
    screen.say("");
    screen.say("6. The fleet loop: the collector fixes its bug and asks the device to redrive.");
    collector.set_behavior(Behavior {
        directives: Some(serde_json::json!({"id": "demo-fix", "redrive": ["bad_request"]})),
        ..Behavior::default()
    });
    spool.track("app_open", serde_json::json!({}))?;
    spool.flush();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(collector.contains(poison_id) && spool.stats().pending == 0) {
        if Instant::now() > deadline {
            screen.say("   The redrive did not arrive in time.");
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let install = spool.install_id().unwrap_or_default();
    let report = collector.fleet_install(&install).unwrap_or_default();
    let shown: Vec<String> = report.iter().map(|(k, v)| format!("{k} {v}")).collect();
    screen.say(&format!(
        "   reports from install {}…: {}",
        install.get(..8).unwrap_or_default(),
        shown.join(", ")
    ));
    let s = spool.stats();
    screen.say(&format!(
        "   directive redrive [\"bad_request\"] arrived: {} redriven, {} delivered with its \
         original id {poison_id}; quarantine now {}.",
        s.redriven,
        s.redriven,
        s.quarantine.values().sum::<u64>()
    ));
    Ok(report.get("quarantined.bad_request") == Some(&1)
        && s.redriven == 1
        && s.quarantine.values().sum::<u64>() == 0)
}

/// A moment to read the screen; a key pressed meanwhile ends it and is handed back, so an
/// early `r` is acted on rather than lost.
fn pause(screen: &mut Screen, beat: Duration) -> Option<Key> {
    let until = Instant::now() + beat;
    while Instant::now() < until {
        if let Some(key) = screen.key(until.saturating_duration_since(Instant::now())) {
            return Some(key);
        }
    }
    None
}

/// The gist of a failure for a status line ("could not connect", "HTTP 503").
fn short(failure: &eventspool::Failure) -> String {
    match failure.status {
        Some(status) => format!("HTTP {status}"),
        None => failure
            .message
            .split(':')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

fn quit(screen: &mut Screen, spool: &EventSpool) -> CmdResult {
    let pending = spool.state().pending;
    screen.say(&format!("Quit: {pending} events were still pending; an app would keep them in its store for next time."));
    spool.shutdown(Duration::from_secs(5))?;
    Ok(EXIT_OK)
}

//! Benchmarks against physical baselines, each measured in the same process and run as the
//! figure it is compared with, because on a shared machine absolute times drift but ratios hold.
//!
//! `cargo run --release --example bench [-- --quick]`
//!
//! Human table on stderr, JSON report on stdout. `--quick` skips the 1M-event growth runs;
//! `--only track,spill,…` picks scenarios (`SCENARIOS`); `--sizes N,M` sets the spill/drain
//! sizes; anything else is refused with its name (`--help` prints the usage).
//! The peak-RSS run re-executes this binary (`--rss-child URL`) so that the high-water mark it
//! reads belongs to that scenario alone. See BENCHMARKS.md for the figures and the machine.

mod burst;
mod critical;
mod rss;
mod slowlink;
mod store;
mod track;
mod trickle;

use eventspool_testkit::throttle;
use serde_json::{Value, json};

/// The benchmark event: 6 properties, about 250 bytes on the wire with its id and timestamp.
pub fn properties() -> Value {
    json!({
        "screen": "checkout",
        "button": "confirm_order",
        "items": 3,
        "cart_cents": 129_900,
        "experiment": "variant_b",
        "referrer": "push_campaign"
    })
}

pub const EVENT_NAME: &str = "button_tap";

/// One line of the report.
pub struct Row {
    pub figure: String,
    pub ours: f64,
    pub baseline: Option<f64>,
    pub unit: &'static str,
    /// `ours / baseline`.
    pub ratio: Option<f64>,
    pub target: String,
    pub met: Option<bool>,
    pub extra: Value,
}

impl Row {
    /// A cost (lower is better): target is `ratio <= max_ratio`.
    pub fn cost(
        figure: impl Into<String>,
        ours: f64,
        baseline: f64,
        unit: &'static str,
        max_ratio: Option<f64>,
    ) -> Row {
        let ratio = ours / baseline;
        Row {
            figure: figure.into(),
            ours,
            baseline: Some(baseline),
            unit,
            ratio: Some(ratio),
            target: max_ratio
                .map(|m| format!("ratio <= {m}"))
                .unwrap_or_else(|| "-".into()),
            met: max_ratio.map(|m| ratio <= m),
            extra: Value::Null,
        }
    }

    /// A rate (higher is better): target is `ratio >= min_ratio`.
    pub fn rate(
        figure: impl Into<String>,
        ours: f64,
        baseline: f64,
        unit: &'static str,
        min_ratio: Option<f64>,
    ) -> Row {
        let ratio = ours / baseline;
        Row {
            figure: figure.into(),
            ours,
            baseline: Some(baseline),
            unit,
            ratio: Some(ratio),
            target: min_ratio
                .map(|m| format!("ratio >= {m}"))
                .unwrap_or_else(|| "-".into()),
            met: min_ratio.map(|m| ratio >= m),
            extra: Value::Null,
        }
    }

    /// An absolute figure against an absolute limit (lower is better).
    pub fn limit(
        figure: impl Into<String>,
        ours: f64,
        unit: &'static str,
        max: Option<f64>,
    ) -> Row {
        Row {
            figure: figure.into(),
            ours,
            baseline: None,
            unit,
            ratio: None,
            target: max
                .map(|m| format!("<= {m} {unit}"))
                .unwrap_or_else(|| "-".into()),
            met: max.map(|m| ours <= m),
            extra: Value::Null,
        }
    }

    pub fn with(mut self, extra: Value) -> Row {
        self.extra = extra;
        self
    }

    fn print(&self) {
        let num = |v: f64| {
            if v >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.3}")
            }
        };
        eprintln!(
            "{:<50} {:>14} {:>14} {:<9} {:>8} {:<14} {}",
            self.figure,
            num(self.ours),
            self.baseline.map(num).unwrap_or_else(|| "-".into()),
            self.unit,
            self.ratio
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into()),
            self.target,
            match self.met {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "",
            }
        );
    }

    fn json(&self) -> Value {
        json!({
            "figure": self.figure, "ours": self.ours, "baseline": self.baseline, "unit": self.unit,
            "ratio": self.ratio, "target": self.target, "met": self.met, "detail": self.extra,
        })
    }
}

pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo.lines().next().unwrap_or_default().to_string();
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": model,
        "memory": mem.split_whitespace().skip(1).collect::<Vec<_>>().join(" "),
        "loadavg_at_start": loadavg(),
    })
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The scenarios `--only` picks from, in the order they run.
const SCENARIOS: [&str; 11] = [
    "track", "spill", "cap", "always", "critical", "drain", "encrypt", "rss", "cold", "slowlink",
    "trickle",
];

fn usage() -> String {
    format!(
        "usage: bench [--quick] [--only SCENARIO[,SCENARIO...]] [--sizes N[,N...]]
  --quick   without the 1M-event growth runs
  --only    some of: {} (default: all)
  --sizes   the spill, drain and encrypt sizes in events (default: 10000,100000 and, without
            --quick, 1000000)
Table on stderr, JSON on stdout; BENCHMARKS.md says what each row measures.",
        SCENARIOS.join(", ")
    )
}

/// The command line: a mistyped flag, scenario or size is refused with its name rather than
/// running (or skipping) minutes of benchmarks.
struct Options {
    quick: bool,
    only: Option<Vec<String>>,
    sizes: Option<Vec<usize>>,
}

impl Options {
    /// `None` for `--help`.
    fn parse(args: &[String]) -> Result<Option<Options>, String> {
        let mut options = Options {
            quick: false,
            only: None,
            sizes: None,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || {
                args.next()
                    .filter(|v| !v.is_empty() && !v.starts_with("--"))
                    .ok_or_else(|| format!("{arg} needs a comma-separated list"))
            };
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--help" | "-h" => return Ok(None),
                "--only" => {
                    let names: Vec<String> = value()?.split(',').map(str::to_string).collect();
                    if let Some(bad) = names.iter().find(|n| !SCENARIOS.contains(&n.as_str())) {
                        return Err(format!("--only: no scenario named {bad:?}"));
                    }
                    options.only = Some(names);
                }
                "--sizes" => {
                    let sizes = value()?
                        .split(',')
                        .map(|n| match n.parse::<usize>() {
                            Ok(size) if size > 0 => Ok(size),
                            _ => Err(format!("--sizes: {n:?} is not a number of events")),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    options.sizes = Some(sizes);
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(Some(options))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rss-child") {
        let url = args
            .get(i + 1)
            .ok_or("--rss-child needs the collector URL")?;
        let pace = args
            .get(i + 2)
            .and_then(|p| p.parse().ok())
            .ok_or("--rss-child needs a pace (events/s)")?;
        return rss::child(url, pace);
    }
    let Options { quick, only, sizes } = match Options::parse(&args[1..]) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{}", usage());
            return Ok(());
        }
        Err(e) => {
            eprintln!("bench: {e}\n\n{}", usage());
            std::process::exit(2);
        }
    };
    let want = |name: &str| {
        debug_assert!(
            SCENARIOS.contains(&name),
            "{name} is missing from SCENARIOS"
        );
        only.as_ref().is_none_or(|o| o.iter().any(|x| x == name))
    };
    let machine = machine();
    eprintln!(
        "machine: {machine}; event: {} bytes on the wire, 6 properties",
        wire_size()
    );
    eprintln!(
        "{:<50} {:>14} {:>14} {:<9} {:>8} {:<14}",
        "figure", "eventspool", "baseline", "unit", "ratio", "target"
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut emit = |new: Vec<Row>| {
        for r in &new {
            r.print();
        }
        rows.extend(new);
    };
    if want("track") {
        emit(track::run()?);
    }
    // `--sizes 10000,100000` replaces the growth series (e.g. to profile one size).
    let sizes = sizes.unwrap_or(if quick {
        vec![10_000, 100_000]
    } else {
        vec![10_000, 100_000, 1_000_000]
    });
    if want("spill") {
        emit(store::spill(&sizes)?);
    }
    if want("cap") {
        emit(burst::near_cap()?);
    }
    if want("always") {
        emit(burst::always()?);
    }
    if want("critical") {
        emit(critical::run()?);
    }
    if want("drain") {
        emit(store::drain(&sizes)?);
    }
    if want("encrypt") {
        emit(store::encryption(&sizes)?);
    }
    if want("rss") {
        emit(rss::run()?);
    }
    if want("cold") {
        emit(store::cold_open()?);
    }
    if want("slowlink") {
        emit(slowlink::run()?);
    }
    if want("trickle") {
        emit(trickle::run(quick)?);
    }
    let report = json!({
        "machine": machine,
        "loadavg_at_end": loadavg(),
        "quick": quick,
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Size of the benchmark event on the wire (the same shape the SDK sends).
pub fn wire_size() -> usize {
    json!({
        "event_id": uuid::Uuid::now_v7().to_string(),
        "name": EVENT_NAME,
        "timestamp": "2026-11-29T12:00:00.000Z",
        "properties": properties(),
    })
    .to_string()
    .len()
}

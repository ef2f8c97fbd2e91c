//! `collector`: the reference collector as a process, for collector teams' tests, binding
//! tests and demos, with switches to reproduce each failure mode without writing code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use eventspool_collector::{Behavior, CollectorConfig, ReferenceCollector, Scripted};
use serde_json::json;

use crate::{CmdResult, Failure, print_json};

pub const HELP: &str = "\
Speaks eventspool batch v1 on POST (any path but its own GET paths below; /v1/batch is
canonical), stores each event once by event_id, and answers GET /stats with
{\"distinct\",\"received\",\"requests\"}, GET /livez and /readyz for health, GET /metrics in
Prometheus text. Client reports are
totalled per install exactly once: GET /fleet answers the fleet totals, and --fleet-every prints
them on stdout as {\"fleet\":{...}} lines when they change. The first stdout line is
{\"addr\",\"url\"} (useful with port 0); one log line per batch goes to stderr. Runs until killed.

Examples:
  eventspool collector --listen 127.0.0.1:8080 --db collected.db
  eventspool collector --listen 127.0.0.1:0 --fail-rate 0.3 --retry-after 2
  eventspool collector --listen 127.0.0.1:8080 --status-sequence 503,503,200 --reject-name poison
  eventspool collector --listen 127.0.0.1:8080 --outage-secs 30
  eventspool collector --listen 127.0.0.1:8080 --fleet-every 5 --directives '{\"id\":\"fix-1\",\"redrive\":[\"bad_request\"]}'";

#[derive(Args)]
pub struct CollectorArgs {
    /// Address to listen on; port 0 picks a free one (printed on the first stdout line).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// SQLite file for stored events (events of earlier runs count as duplicates); memory if absent.
    #[arg(long)]
    db: Option<PathBuf>,
    /// Fraction of requests answered 503 (0.0–1.0).
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Seed for --fail-rate, so a failing run can be replayed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Refuse connections for the first SECS seconds after start (the port is bound, then closed).
    #[arg(long, value_name = "SECS")]
    outage_secs: Option<f64>,
    /// Answer the first requests with these statuses, one each (2xx means "handle normally").
    #[arg(long, value_name = "S,S,...", value_delimiter = ',')]
    status_sequence: Vec<u16>,
    /// Answer 400 to any batch containing an event with this name (a poison event).
    #[arg(long, value_name = "NAME")]
    reject_name: Option<String>,
    /// List events with this name as rejected in a 200 answer (partial success).
    #[arg(long, value_name = "NAME")]
    partial_reject_name: Option<String>,
    /// Answer 413 to bodies larger than this (as sent, before gzip decoding).
    #[arg(long, value_name = "BYTES")]
    max_body_bytes: Option<usize>,
    /// Retry-After header value on 429 and 503 answers (seconds or an HTTP date).
    #[arg(long, value_name = "VALUE")]
    retry_after: Option<String>,
    /// Wait this long before answering each request.
    #[arg(long, value_name = "MS")]
    delay_ms: Option<u64>,
    /// Answer 401 unless the request carries `Authorization: Bearer KEY`.
    #[arg(long, value_name = "KEY")]
    require_api_key: Option<String>,
    /// Answer 400 to any batch containing an event with this property (a collector bug).
    #[arg(long, value_name = "KEY")]
    reject_property: Option<String>,
    /// Send this JSON object as `directives` in every 2xx (docs/protocol.md §Directives).
    #[arg(long, value_name = "JSON")]
    directives: Option<String>,
    /// Ask devices to send a waiting client report alone with their periodic flush when they
    /// have no event to send (totals catch up without new events; one request per flush
    /// interval at most).
    #[arg(long)]
    lone_reports: bool,
    /// Print the fleet's client report totals every SECS seconds when they changed.
    #[arg(long, value_name = "SECS")]
    fleet_every: Option<f64>,
}

pub fn run(args: CollectorArgs) -> CmdResult {
    if !(0.0..=1.0).contains(&args.fail_rate) {
        return Err(Failure::bad_input(format!(
            "--fail-rate {}: must be between 0 and 1",
            args.fail_rate
        )));
    }
    let outage = match args.outage_secs {
        Some(value) => Some(crate::secs("--outage-secs", value)?),
        None => None,
    };
    let directives = match &args.directives {
        Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) if v.is_object() => Some(v),
            _ => {
                return Err(Failure::bad_input(format!(
                    "--directives {text}: must be a JSON object"
                )));
            }
        },
        None => None,
    };
    let fleet_every = match args.fleet_every {
        Some(value) if value > 0.0 => Some(crate::secs("--fleet-every", value)?),
        Some(value) => {
            return Err(Failure::bad_input(format!(
                "--fleet-every {value}: must be more than 0"
            )));
        }
        None => None,
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    let behavior = Behavior {
        fail_rate: args.fail_rate,
        seed: args.seed,
        reject_name: args.reject_name,
        partial_reject_name: args.partial_reject_name,
        max_body_bytes: args.max_body_bytes,
        retry_after: args.retry_after,
        delay: args.delay_ms.map(Duration::from_millis),
        required_api_key: args.require_api_key,
        reject_property: args.reject_property,
        lone_reports: args.lone_reports,
        directives,
        ..Behavior::default()
    };
    let collector = ReferenceCollector::start(CollectorConfig {
        listen: args.listen,
        db_path: args.db,
        behavior,
        ..CollectorConfig::default()
    })
    .map_err(|e| Failure::error(format!("cannot start collector on {}: {e}", args.listen)))?;
    collector.push_script(args.status_sequence.iter().map(|&s| {
        if (200..300).contains(&s) {
            Scripted::Delay(Duration::ZERO)
        } else {
            Scripted::status(s)
        }
    }));
    if let Some(outage) = outage {
        collector
            .set_outage(true)
            .map_err(|e| Failure::error(format!("cannot start the outage: {e}")))?;
        print_json(&json!({ "addr": collector.addr().to_string(), "url": collector.url() }));
        eprintln!(
            "outage: refusing connections for {:.1} s",
            outage.as_secs_f64()
        );
        std::thread::sleep(outage);
        collector
            .set_outage(false)
            .map_err(|e| Failure::error(format!("cannot end the outage: {e}")))?;
        eprintln!("outage over: listening on {}", collector.addr());
    } else {
        print_json(&json!({ "addr": collector.addr().to_string(), "url": collector.url() }));
        eprintln!("listening on {}", collector.url());
    }
    let Some(every) = fleet_every else {
        loop {
            std::thread::park();
        }
    };
    let mut shown = eventspool_collector::FleetTotals::default();
    loop {
        std::thread::sleep(every);
        let totals = collector.fleet_totals();
        if totals != shown {
            print_json(&json!({ "fleet": totals.to_json() }));
            shown = totals;
        }
    }
}

//! `conformance`: black-box checks of a running collector against docs/protocol.md, for collector
//! teams whose collector the SDK will talk to. Each check sends a bounded number of requests,
//! only to `--endpoint`, with events built and sent by the SDK's own code and tagged so a team
//! can find and delete them. docs/cli.md §conformance documents every check.

mod answer;
mod checks;
mod context;
mod readback;
mod report;
mod unanswered;
mod verdict;

use std::time::{Duration, Instant};

use clap::Args;

use crate::{CmdResult, EXIT_ERROR, EXIT_OK, Failure, print_json};
use checks::{CHECKS, Check};
use context::{Ctx, Options};
use report::{Report, Row};
use verdict::Verdict;

pub const HELP: &str = "\
Checks: answer_body, dedup, malformed_event, encodings, field_order, body_limit, auth,
directives, and load (opt-in: --load). Prints a table (check, what the protocol says, what the
collector did, pass/fail/n/a) and the fix for each failure; --json prints one JSON object.
Every event is named eventspool_conformance_<check> and carries the property
\"eventspool_conformance\": {\"run\", \"check\", \"seq\"}, so they can be found and deleted.
--verify-cmd runs under sh with the event ids on stdin and prints the stored ones, one
`EVENT_ID [COUNT]` per line (docs/cli.md).
Exit 0: every check passed (or did not apply). 1: a check failed. 2: bad arguments.

Examples:
  eventspool conformance --endpoint http://127.0.0.1:8080/v1/batch
  eventspool conformance --endpoint http://127.0.0.1:8080/v1/batch --api-key test-key \\
      --body-limit 1000000 --load --only dedup,load --json
  eventspool conformance --endpoint http://127.0.0.1:8080/v1/batch \\
      --verify-cmd \"sqlite3 collected.db \\\"SELECT event_id FROM events WHERE name GLOB 'eventspool_conformance_*'\\\"\"";

/// Bounds of the load check's flags: enough to see shedding, never a load test of its own.
const MAX_LOAD_REQUESTS: usize = 10_000;
const MAX_LOAD_CONCURRENCY: usize = 256;
/// `--deadline` bounds: below a millisecond nothing can answer; above ten minutes a run is no
/// longer bounded in any useful sense.
const MIN_DEADLINE: Duration = Duration::from_millis(1);
const MAX_DEADLINE: Duration = Duration::from_secs(600);
/// `--body-limit` above this would make the check send a body no SDK ever sends.
const MAX_BODY_LIMIT: usize = 64 << 20;

#[derive(Args)]
pub struct ConformanceArgs {
    /// The collector's batch URL; every request goes there and nowhere else.
    #[arg(long)]
    endpoint: String,
    /// Sent as `Authorization: Bearer KEY`; the auth check then expects 401/403 without it.
    #[arg(long)]
    api_key: Option<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Run only these checks (comma-separated names); naming `load` runs it without --load.
    #[arg(long, value_name = "CHECK,...", value_delimiter = ',')]
    only: Vec<String>,
    /// Read-back hook: ids on stdin, prints the stored ones as `EVENT_ID [COUNT]` lines.
    #[arg(long, value_name = "CMD")]
    verify_cmd: Option<String>,
    /// Also run the load check: many requests at once; the collector must answer 2xx, or
    /// 429/503 with Retry-After, within the deadline.
    #[arg(long)]
    load: bool,
    /// Requests the load check sends.
    #[arg(long, value_name = "N", default_value_t = 200)]
    load_requests: usize,
    /// Requests the load check keeps in flight at once.
    #[arg(long, value_name = "N", default_value_t = 20)]
    load_concurrency: usize,
    /// Every request must be answered within this many seconds (the SDK's attempt timeout).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    deadline: f64,
    /// The collector's body limit in bytes: a body of this size must get 2xx, one over it 413.
    /// Without it, the check tries 512 KiB, 2 MiB and 8 MiB.
    #[arg(long, value_name = "BYTES")]
    body_limit: Option<usize>,
    /// Allow plain http:// to a host that is not loopback (as the SDK's allow_insecure_http).
    #[arg(long)]
    allow_insecure_http: bool,
}

/// The checks `--only` and `--load` select, in run order; `Err` names an unknown one.
fn selected(args: &ConformanceArgs) -> Result<Vec<&'static Check>, Failure> {
    if args.only.is_empty() {
        return Ok(CHECKS.iter().filter(|c| !c.opt_in || args.load).collect());
    }
    for name in &args.only {
        if checks::by_name(name.trim()).is_none() {
            let names: Vec<&str> = CHECKS.iter().map(|c| c.name).collect();
            return Err(Failure::bad_input(format!(
                "--only {name}: no such check; the checks are {}",
                names.join(", ")
            )));
        }
    }
    Ok(CHECKS
        .iter()
        .filter(|c| args.only.iter().any(|n| n.trim() == c.name))
        .collect())
}

fn options(args: &ConformanceArgs) -> Result<Options, Failure> {
    let deadline = crate::secs("--deadline", args.deadline)?;
    if deadline < MIN_DEADLINE || deadline > MAX_DEADLINE {
        return Err(Failure::bad_input(format!(
            "--deadline {}: must be {} to {} seconds",
            args.deadline,
            MIN_DEADLINE.as_secs_f64(),
            MAX_DEADLINE.as_secs()
        )));
    }
    if !(1..=MAX_LOAD_REQUESTS).contains(&args.load_requests) {
        return Err(Failure::bad_input(format!(
            "--load-requests {}: must be 1 to {MAX_LOAD_REQUESTS}",
            args.load_requests
        )));
    }
    if !(1..=MAX_LOAD_CONCURRENCY).contains(&args.load_concurrency) {
        return Err(Failure::bad_input(format!(
            "--load-concurrency {}: must be 1 to {MAX_LOAD_CONCURRENCY}",
            args.load_concurrency
        )));
    }
    if let Some(limit) = args.body_limit
        && !(1024..=MAX_BODY_LIMIT).contains(&limit)
    {
        return Err(Failure::bad_input(format!(
            "--body-limit {limit}: must be 1024 to {MAX_BODY_LIMIT} bytes"
        )));
    }
    if args
        .verify_cmd
        .as_deref()
        .is_some_and(|c| c.trim().is_empty())
    {
        return Err(Failure::bad_input("--verify-cmd: empty command"));
    }
    Ok(Options {
        endpoint: args.endpoint.clone(),
        api_key: args.api_key.clone(),
        deadline,
        allow_insecure_http: args.allow_insecure_http,
        body_limit: args.body_limit,
        load_requests: args.load_requests,
        load_concurrency: args.load_concurrency,
    })
}

pub fn run(args: ConformanceArgs) -> CmdResult {
    let checks = selected(&args)?;
    let opts = options(&args)?;
    let endpoint = opts.endpoint.clone();
    let mut ctx = Ctx::new(opts, args.verify_cmd.clone()).map_err(|e| {
        if e.contains("allow_insecure_http") {
            Failure::bad_input(format!("{e} (here: --allow-insecure-http)"))
        } else if e.starts_with("--endpoint") {
            Failure::bad_input(e)
        } else {
            Failure::error(e)
        }
    })?;
    let mut rows = Vec::with_capacity(checks.len());
    for check in checks {
        ctx.begin(check.name);
        let started = Instant::now();
        let verdict: Verdict = (check.run)(&mut ctx).unwrap_or_else(|v| v);
        eprintln!("conformance: {} {}", check.name, verdict.grade.as_str());
        debug_assert!(
            check.opt_in || ctx.requests <= check.max_requests,
            "{} sent {} requests, over its bound of {}",
            check.name,
            ctx.requests,
            check.max_requests
        );
        rows.push(Row {
            check: check.name,
            protocol: check.protocol,
            verdict,
            requests: ctx.requests,
            events: ctx.events_sent,
            ms: started.elapsed().as_millis(),
        });
    }
    let report = Report {
        endpoint,
        run: ctx.run.clone(),
        rows,
    };
    if args.json {
        print_json(&report.to_json());
    } else {
        print!("{}", report.to_table());
    }
    Ok(if report.failed() { EXIT_ERROR } else { EXIT_OK })
}

//! `eventspool`: the SDK for people who do not write Rust (docs/cli.md). Machine-readable output is
//! JSON on stdout; progress and human text go to stderr. Exit codes: 0 done, 1 error,
//! 2 bad input, 3 stopped with events still pending (they stay in the store).

mod collector_cmd;
mod conformance;
mod demo;
mod dlq;
mod send;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use eventspool::Config;

/// Everything went out.
pub const EXIT_OK: u8 = 0;
/// Something failed that is not the input's fault (store, network setup, ...).
pub const EXIT_ERROR: u8 = 1;
/// The input or the arguments are wrong; nothing was sent.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Stopped with events pending; they stay in the store for the next `flush`.
pub const EXIT_PENDING: u8 = 3;

/// A failure with the exit code it maps to.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn bad_input(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_BAD_INPUT,
            message: message.into(),
        }
    }
    pub fn error(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_ERROR,
            message: message.into(),
        }
    }
}

impl From<eventspool::Error> for Failure {
    fn from(e: eventspool::Error) -> Failure {
        match e {
            eventspool::Error::Config(_) | eventspool::Error::InvalidEvent(_) => {
                Failure::bad_input(e.to_string())
            }
            other => Failure::error(other.to_string()),
        }
    }
}

pub type CmdResult = Result<u8, Failure>;

#[derive(Parser)]
#[command(
    name = "eventspool",
    version,
    about = "Keeps analytics events safe while offline and delivers them when back online",
    after_help = "Start with:  eventspool demo\n\nExit codes: 0 done, 1 error, 2 bad input (nothing sent), 3 stopped with events pending (kept in the store)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Track JSON Lines events from a file or stdin, deliver them, print a JSON summary.
    #[command(after_help = send::SEND_HELP)]
    Send(send::SendArgs),
    /// Deliver what a store holds (events left pending or redriven), print a JSON summary.
    #[command(after_help = send::FLUSH_HELP)]
    Flush(send::FlushArgs),
    /// Show a store's backlog and quarantine as JSON; safe while another process uses the store.
    #[command(after_help = status::HELP)]
    Status(status::StatusArgs),
    /// Triage the quarantine (dead-letter store): list, show, redrive, purge.
    #[command(subcommand, after_help = dlq::HELP)]
    Dlq(dlq::DlqCommand),
    /// Run the reference collector (batch v1 on HTTP), optionally misbehaving on purpose.
    #[command(after_help = collector_cmd::HELP)]
    Collector(collector_cmd::CollectorArgs),
    /// Check a running collector against the protocol (docs/protocol.md): dedup, statuses,
    /// rejected lists, gzip, 413, auth, directives, and load on request.
    #[command(after_help = conformance::HELP)]
    Conformance(conformance::ConformanceArgs),
    /// Watch the whole story in the terminal: offline, spill, outage, countdown, retry, drain.
    #[command(after_help = demo::HELP)]
    Demo(demo::DemoArgs),
}

/// The connection options shared by `send` and `flush`.
#[derive(Args, Clone, Debug)]
pub struct Connection {
    /// The collector's batch URL (http:// only for loopback unless allow_insecure_http=true).
    #[arg(long)]
    pub endpoint: String,
    /// SQLite store: events not delivered stay here for the next `flush`.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Any setting of docs/configuration.md by name, e.g. `--set max_auto_attempts=3` (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub set: Vec<String>,
    /// Stop waiting after this many seconds; what is left stays pending (exit 3).
    #[arg(long, value_name = "SECS", default_value_t = 300.0)]
    pub timeout: f64,
}

impl Connection {
    /// The SDK config: the defaults of docs/configuration.md, except no pause between batches (a
    /// command-line run is an explicit bulk transfer, not an app sparing its battery); `--set`
    /// overrides anything.
    pub fn config(&self) -> Result<Config, Failure> {
        let mut config = Config::new(self.endpoint.clone());
        config.min_batch_interval_ms = 0;
        config.db_path = self.db.clone();
        config.api_key = self.api_key.clone();
        for item in &self.set {
            let Some((name, value)) = item.split_once('=') else {
                return Err(Failure::bad_input(format!(
                    "--set {item}: expected NAME=VALUE"
                )));
            };
            config
                .set(name.trim(), value.trim())
                .map_err(|e| Failure::bad_input(format!("--set {item}: {e}")))?;
        }
        config
            .validate()
            .map_err(|e| Failure::bad_input(e.to_string()))?;
        Ok(config)
    }

    pub fn timeout(&self) -> Result<std::time::Duration, Failure> {
        secs("--timeout", self.timeout)
    }
}

/// A flag given in seconds; refused (naming the flag) when it is negative or not finite.
pub fn secs(flag: &str, value: f64) -> Result<std::time::Duration, Failure> {
    std::time::Duration::try_from_secs_f64(value)
        .map_err(|_| Failure::bad_input(format!("{flag} {value}: not a duration in seconds")))
}

/// Prints one JSON value on its own stdout line.
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Send(args) => send::send(args),
        Command::Flush(args) => send::flush(args),
        Command::Status(args) => status::run(args),
        Command::Dlq(cmd) => dlq::run(cmd),
        Command::Collector(args) => collector_cmd::run(args),
        Command::Conformance(args) => conformance::run(args),
        Command::Demo(args) => demo::run(args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("eventspool: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

//! `status`: a store's backlog and quarantine, read without becoming its owner.

use std::path::PathBuf;

use clap::Args;
use eventspool::format_timestamp;
use serde_json::json;

use crate::{CmdResult, EXIT_OK, Failure, print_json};

pub const HELP: &str = "\
Prints {\"db\",\"pending\",\"pending_critical\",\"bytes\",\"oldest\",\"newest\",\"consent\",
\"quarantine\":{reason:n},\"dropped\":{reason:n}}. `consent` is the recorded tracking consent (pending,
granted, denied; null for a store written before consent existed).
Opens the store read-only without its owner lock, so it works (and disturbs nothing) while an
app or `eventspool send` is using the store.

Example:
  eventspool status --db events.db";

#[derive(Args)]
pub struct StatusArgs {
    /// The SQLite store to look at.
    #[arg(long)]
    pub db: PathBuf,
}

pub fn run(args: StatusArgs) -> CmdResult {
    let status = eventspool::admin::inspect(&args.db).map_err(|e| Failure::error(e.to_string()))?;
    print_json(&json!({
        "db": args.db.display().to_string(),
        "pending": status.pending,
        "pending_critical": status.pending_critical,
        "bytes": status.bytes,
        "oldest": status.oldest_ms.map(format_timestamp),
        "newest": status.newest_ms.map(format_timestamp),
        "consent": status.consent.map(|c| c.as_str()),
        "quarantine": status.quarantine,
        "dropped": status.dropped,
    }));
    Ok(EXIT_OK)
}

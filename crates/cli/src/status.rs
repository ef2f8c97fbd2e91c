//! `status`: a store's backlog and quarantine, read without becoming its owner.

use std::path::PathBuf;

use clap::Args;
use eventspool::admin::SCHEMA_VERSION;
use eventspool::format_timestamp;
use serde_json::json;

use crate::{CmdResult, EXIT_OK, Failure, print_json};

pub const HELP: &str = "\
Prints {\"db\",\"pending\",\"pending_critical\",\"bytes\",\"oldest\",\"newest\",\"consent\",
\"quarantine\":{reason:n},\"dropped\":{reason:n},\"schema_version\"}. `consent` is the recorded tracking
consent (pending, granted, denied; null for a store written before consent existed).
`schema_version` is the store format the file holds: a store an earlier release wrote is read
as this release will read it once upgraded (the file itself is upgraded only by the next open
of a spool or `eventspool flush`, and stderr says so); a store of a newer release is named with
its version and not read (exit 1).
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
    let status = eventspool::admin::inspect(&args.db).map_err(|e| match e {
        e @ eventspool::Error::NotFound(_) => Failure::error(e.to_string()),
        e => Failure::error(format!("{e} (the file was not changed)")),
    })?;
    if status.schema_version < SCHEMA_VERSION {
        eprintln!(
            "eventspool: {} holds schema version {} (an earlier release's); read through an \
             upgraded copy in memory, the file was not changed; the next open by a spool or \
             `eventspool flush` upgrades it to version {SCHEMA_VERSION}",
            args.db.display(),
            status.schema_version
        );
    }
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
        "schema_version": status.schema_version,
    }));
    Ok(EXIT_OK)
}

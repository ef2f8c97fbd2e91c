//! `dlq`: the operator's triage loop over a store's quarantine. `list` and `show` only read (the
//! file is never changed, even when it cannot be read); `redrive` and `purge` need the store to be
//! closed.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use eventspool::admin::{self, StoreAdmin};
use eventspool::format_timestamp;
use eventspool::{EncryptionKeys, ListFilter, QuarantinedEvent, Selector, SettingValue};
use serde_json::{Value, json};

use crate::{CmdResult, EXIT_OK, Failure, print_json};

pub const HELP: &str = "\
The quarantine holds events the collector refused for good (reasons: rejected, bad_request,
too_large), or never answered for (max_sends). Triage: list, look at one, fix the cause, redrive
(same event_id; the next `eventspool flush` delivers them) or purge. `list` and `show` only read
and never change the file; `redrive` and `purge` need the store's owner lock: stop the app first.

Examples:
  eventspool dlq list --db events.db --reason bad_request --limit 20
  eventspool dlq show --db events.db 0193a5e2-8f1c-7d2e-9b1a-3c4d5e6f7a8b
  eventspool dlq redrive --db events.db --all && eventspool flush --endpoint URL --db events.db
  eventspool dlq purge --db events.db --reason too_large

An encrypted store (config encryption_keys) needs its keys in the environment, in the text form
of that setting: EVENTSPOOL_ENCRYPTION_KEYS=ID:HEX64[,ID:HEX64...] (never on the command line,
where other users can read it). Without them every command refuses, naming the key id it needs.";

/// Where the `dlq` commands take an encrypted store's keys from.
pub const KEYS_ENV: &str = "EVENTSPOOL_ENCRYPTION_KEYS";

/// The store's keys from [`KEYS_ENV`] (none when unset).
fn keys() -> Result<EncryptionKeys, Failure> {
    let text = std::env::var(KEYS_ENV).unwrap_or_default();
    EncryptionKeys::parse(KEYS_ENV, &text).map_err(|e| Failure::error(e.to_string()))
}

#[derive(Subcommand)]
pub enum DlqCommand {
    /// List quarantined events as JSON Lines, oldest first (payload only with --show-payload).
    #[command(
        after_help = "Example:\n  eventspool dlq list --db events.db --reason rejected --limit 10"
    )]
    List {
        #[arg(long)]
        db: PathBuf,
        /// Only this reason: rejected, bad_request, too_large, max_sends or undecryptable.
        #[arg(long)]
        reason: Option<String>,
        /// At most this many (0: all).
        #[arg(long, default_value_t = 0)]
        limit: u64,
        /// Include each event's wire JSON (its properties may hold personal data).
        #[arg(long)]
        show_payload: bool,
    },
    /// Show one quarantined event, payload included.
    #[command(
        after_help = "Example:\n  eventspool dlq show --db events.db 0193a5e2-8f1c-7d2e-9b1a-3c4d5e6f7a8b"
    )]
    Show {
        #[arg(long)]
        db: PathBuf,
        id: String,
    },
    /// Move events back to the queue with their original event_id; `flush` then delivers them.
    #[command(
        after_help = "Example:\n  eventspool dlq redrive --db events.db --reason bad_request\n  eventspool flush --endpoint http://127.0.0.1:8080/v1/batch --db events.db"
    )]
    Redrive {
        #[arg(long)]
        db: PathBuf,
        #[command(flatten)]
        select: Selection,
    },
    /// Delete quarantined events for good.
    #[command(
        after_help = "Example:\n  eventspool dlq purge --db events.db --id 0193a5e2-8f1c-7d2e-9b1a-3c4d5e6f7a8b"
    )]
    Purge {
        #[arg(long)]
        db: PathBuf,
        #[command(flatten)]
        select: Selection,
    },
}

/// Exactly one way of choosing events, so `redrive` alone never means "everything" by accident.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct Selection {
    /// This event (repeatable).
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<String>,
    /// Every event quarantined for this reason.
    #[arg(long)]
    reason: Option<String>,
    /// Every quarantined event.
    #[arg(long)]
    all: bool,
}

impl Selection {
    fn selector(&self) -> Selector {
        if self.all {
            Selector::All
        } else if let Some(reason) = &self.reason {
            Selector::Reason(reason.clone())
        } else {
            Selector::Ids(self.ids.clone())
        }
    }
}

fn open(db: &Path) -> Result<StoreAdmin, Failure> {
    if !db.exists() {
        return Err(Failure::error(format!("no store at {}", db.display())));
    }
    StoreAdmin::open(db, &keys()?).map_err(|e| Failure::error(with_key_hint(e)))
}

/// An error, with how to supply the key when it is about one.
fn with_key_hint(e: eventspool::Error) -> String {
    match e {
        e @ eventspool::Error::EncryptionKey { .. } => {
            format!("{e} (set {KEYS_ENV}=ID:HEX64[,...] to the store's encryption_keys)")
        }
        e => e.to_string(),
    }
}

/// A read-only command's error: the message names the file (and says nothing was changed).
fn read_failure(e: eventspool::Error) -> Failure {
    Failure::error(format!("{} (the file was not changed)", with_key_hint(e)))
}

fn entry(e: &QuarantinedEvent, payload: bool) -> Value {
    let event: Option<Value> = serde_json::from_str(&e.body).ok();
    let name = event
        .as_ref()
        .and_then(|v| v.get("name"))
        .cloned()
        .unwrap_or(Value::Null);
    let mut out = json!({
        "event_id": e.event_id,
        "name": name,
        "timestamp": format_timestamp(e.ts_ms),
        "reason": e.reason,
        "status": e.status,
        "detail": e.detail,
        "attempts": e.attempts,
        "sends": e.sends,
        "first_failed": format_timestamp(e.first_failed_ms),
        "last_failed": format_timestamp(e.last_failed_ms),
    });
    if payload {
        out["payload"] = event.unwrap_or_else(|| Value::String(e.body.clone()));
    }
    out
}

pub fn run(cmd: DlqCommand) -> CmdResult {
    match cmd {
        DlqCommand::List {
            db,
            reason,
            limit,
            show_payload,
        } => {
            let filter = ListFilter {
                reason,
                offset: 0,
                limit,
            };
            let entries = admin::quarantine_list(&db, &keys()?, &filter).map_err(read_failure)?;
            for e in entries {
                print_json(&entry(&e, show_payload));
            }
        }
        DlqCommand::Show { db, id } => {
            match admin::quarantine_get(&db, &keys()?, &id).map_err(read_failure)? {
                Some(e) => print_json(&entry(&e, true)),
                None => return Err(Failure::error(format!("no quarantined event with id {id}"))),
            }
        }
        DlqCommand::Redrive { db, select } => {
            let n = open(&db)?.redrive(&select.selector())?;
            print_json(&json!({ "redriven": n }));
            eprintln!(
                "{n} events back in the queue; `eventspool flush --db {}` delivers them",
                db.display()
            );
        }
        DlqCommand::Purge { db, select } => {
            let n = open(&db)?.purge(&select.selector())?;
            print_json(&json!({ "purged": n }));
        }
    }
    Ok(EXIT_OK)
}

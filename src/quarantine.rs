//! The quarantine (dead-letter) store: events the collector refused for good wait here, out of
//! the queue's way, until someone lists, redrives or purges them. Its payloads are kept only
//! here and never logged. With a store configured it lives in the same SQLite file; in
//! memory-only mode it lives in [`MemoryQuarantine`].

use std::collections::BTreeMap;

use crate::event::QueuedEvent;

/// Why the collector refused an event.
pub mod reason {
    /// Listed in a 2xx answer's `rejected` array.
    pub const REJECTED: &str = "rejected";
    /// 400/422 for a batch holding only this event.
    pub const BAD_REQUEST: &str = "bad_request";
    /// 413 for a batch holding only this event.
    pub const TOO_LARGE: &str = "too_large";
    /// No answer (timeout, connection dropped) for this event alone after `max_event_sends`
    /// requests carried it, while the collector answered requests without it.
    pub const MAX_SENDS: &str = "max_sends";
    /// A stored row whose ciphertext failed authentication with its key (damaged on disk): its
    /// payload is gone, its id and timestamps are kept here so the loss is visible. Never
    /// redriven (there is nothing to send); purge it.
    pub const UNDECRYPTABLE: &str = "undecryptable";
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuarantinedEvent {
    pub event_id: String,
    /// The event's own timestamp (ms since the epoch), kept for redrive ordering.
    pub ts_ms: i64,
    /// The event's wire JSON: the payload, kept only here.
    pub body: String,
    pub reason: String,
    /// The collector's words: its `reason` text or at most 1 KiB of its response body.
    pub detail: String,
    pub status: Option<u16>,
    pub attempts: u32,
    pub first_failed_ms: i64,
    pub last_failed_ms: i64,
    /// Requests that carried the event before it came here; kept through a redrive so the
    /// collector still sees a resend (`X-Eventspool-Attempt`).
    pub sends: u32,
}

impl QuarantinedEvent {
    pub fn new(
        event: &QueuedEvent,
        reason: &str,
        detail: String,
        status: Option<u16>,
        attempts: u32,
        now_ms: i64,
    ) -> Self {
        QuarantinedEvent {
            event_id: event.id.to_string(),
            ts_ms: event.ts_ms,
            body: event.json.to_string(),
            reason: reason.to_string(),
            detail,
            status,
            attempts,
            first_failed_ms: now_ms,
            last_failed_ms: now_ms,
            sends: event.sends,
        }
    }
}

/// Which quarantined events an operation applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    Ids(Vec<String>),
    Reason(String),
    All,
}

impl Selector {
    pub fn matches(&self, event: &QuarantinedEvent) -> bool {
        match self {
            Selector::Ids(ids) => ids.iter().any(|id| id == &event.event_id),
            Selector::Reason(reason) => &event.reason == reason,
            Selector::All => true,
        }
    }
}

/// A page of the quarantine, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub reason: Option<String>,
    pub offset: u64,
    /// 0 means no limit.
    pub limit: u64,
}

/// Events removed by the quarantine's own limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Over `quarantine_max_events`, oldest first.
    pub cap: u64,
    /// Older than `quarantine_retention_ms`.
    pub expired: u64,
}

/// The quarantine of a memory-only spool: same rules, no file.
#[derive(Default)]
pub struct MemoryQuarantine {
    next: u64,
    /// By insertion order, so the oldest go first.
    entries: BTreeMap<u64, QuarantinedEvent>,
}

impl MemoryQuarantine {
    pub fn add(
        &mut self,
        events: Vec<QuarantinedEvent>,
        max_events: u64,
        retention_cutoff_ms: i64,
    ) -> Evicted {
        for mut event in events {
            if let Some((&key, _)) = self
                .entries
                .iter()
                .find(|(_, e)| e.event_id == event.event_id)
                && let Some(old) = self.entries.remove(&key)
            {
                event.first_failed_ms = old.first_failed_ms;
                event.attempts += old.attempts;
                event.sends = event.sends.max(old.sends);
            }
            self.next += 1;
            self.entries.insert(self.next, event);
        }
        self.enforce(max_events, retention_cutoff_ms)
    }

    pub fn enforce(&mut self, max_events: u64, retention_cutoff_ms: i64) -> Evicted {
        let before = self.entries.len();
        self.entries
            .retain(|_, e| e.last_failed_ms >= retention_cutoff_ms);
        let expired = (before - self.entries.len()) as u64;
        let mut cap = 0;
        while self.entries.len() as u64 > max_events {
            self.entries.pop_first();
            cap += 1;
        }
        Evicted { cap, expired }
    }

    pub fn list(&self, filter: &ListFilter) -> Vec<QuarantinedEvent> {
        let limit = if filter.limit == 0 {
            usize::MAX
        } else {
            filter.limit as usize
        };
        self.entries
            .values()
            .filter(|e| filter.reason.as_ref().is_none_or(|r| &e.reason == r))
            .skip(filter.offset as usize)
            .take(limit)
            .cloned()
            .collect()
    }

    pub fn get(&self, event_id: &str) -> Option<QuarantinedEvent> {
        self.entries
            .values()
            .find(|e| e.event_id == event_id)
            .cloned()
    }

    /// Removes and returns the selected events (for redrive or purge).
    pub fn take(&mut self, selector: &Selector) -> Vec<QuarantinedEvent> {
        let keys: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| selector.matches(e))
            .map(|(k, _)| *k)
            .collect();
        keys.iter().filter_map(|k| self.entries.remove(k)).collect()
    }

    pub fn counts(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for e in self.entries.values() {
            *counts.entry(e.reason.clone()).or_insert(0) += 1;
        }
        counts
    }
}

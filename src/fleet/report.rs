//! Client reports (docs/protocol.md §Client reports): what changed in the ledger since the last
//! report was cut, as counts only. No payload, no event name, nothing about the user: an
//! operator sees where a fleet's events went, not what they were.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::stats::Stats;

/// The ledger as reports count it. `quarantined` is by reason (the spool's own [`Stats`] keep
/// only the total), and `quarantine_purged` counts dead letters deleted by `purge_quarantine`
/// or the app, which [`Stats`] does not keep either.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub tracked: u64,
    pub restored: u64,
    pub redriven: u64,
    pub delivered: u64,
    pub quarantined: BTreeMap<String, u64>,
    pub dropped: BTreeMap<String, u64>,
    pub quarantine_purged: u64,
}

impl Tally {
    /// The spool's ledger plus what only the fleet loop counts.
    pub fn of(stats: &Stats, quarantined: &BTreeMap<String, u64>, quarantine_purged: u64) -> Tally {
        Tally {
            tracked: stats.tracked,
            restored: stats.restored,
            redriven: stats.redriven,
            delivered: stats.delivered,
            quarantined: quarantined.clone(),
            dropped: stats.dropped.clone(),
            quarantine_purged,
        }
    }

    /// `self - earlier`, field by field; counters only grow, so nothing saturates in practice.
    pub fn since(&self, earlier: &Tally) -> Tally {
        let map =
            |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| -> BTreeMap<String, u64> {
                now.iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.saturating_sub(then.get(k).copied().unwrap_or(0)),
                        )
                    })
                    .filter(|(_, v)| *v > 0)
                    .collect()
            };
        Tally {
            tracked: self.tracked.saturating_sub(earlier.tracked),
            restored: self.restored.saturating_sub(earlier.restored),
            redriven: self.redriven.saturating_sub(earlier.redriven),
            delivered: self.delivered.saturating_sub(earlier.delivered),
            quarantined: map(&self.quarantined, &earlier.quarantined),
            dropped: map(&self.dropped, &earlier.dropped),
            quarantine_purged: self
                .quarantine_purged
                .saturating_sub(earlier.quarantine_purged),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Tally::default()
    }

    /// Whether anything was lost: quarantined, dropped or purged. Without it, a delta holds
    /// only the counts of the events' way through (tracked, restored, redriven, delivered).
    pub fn has_losses(&self) -> bool {
        !self.quarantined.is_empty() || !self.dropped.is_empty() || self.quarantine_purged > 0
    }

    /// The report as it goes on the wire: this delta, with its id, the install it comes from,
    /// and the queue's sizes when it was cut.
    pub fn to_report(
        &self,
        install_id: &str,
        id: u64,
        pending: u64,
        quarantine_size: u64,
    ) -> Value {
        json!({
            "install_id": install_id,
            "report_id": id,
            "tracked": self.tracked,
            "restored": self.restored,
            "redriven": self.redriven,
            "delivered": self.delivered,
            "quarantined": self.quarantined,
            "dropped": self.dropped,
            "quarantine_purged": self.quarantine_purged,
            "pending": pending,
            "quarantine_size": quarantine_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delta_keeps_only_what_changed() {
        let mut stats = Stats {
            tracked: 5,
            delivered: 3,
            ..Stats::default()
        };
        stats.dropped.insert("expired".into(), 1);
        stats.dropped.insert("disk_cap".into(), 0);
        let q = BTreeMap::from([("bad_request".to_string(), 1)]);
        let first = Tally::of(&stats, &q, 0);
        let delta = first.since(&Tally::default());
        assert_eq!(delta.dropped, BTreeMap::from([("expired".to_string(), 1)]));
        stats.tracked = 7;
        let second = Tally::of(&stats, &q, 0);
        let delta = second.since(&first);
        assert_eq!(
            delta,
            Tally {
                tracked: 2,
                ..Tally::default()
            }
        );
        assert!(second.since(&second).is_empty());
        let wire = delta.to_report("i", 4, 2, 1);
        assert_eq!(wire["report_id"], 4);
        assert_eq!(wire["tracked"], 2);
        assert_eq!(wire["install_id"], "i");
    }
}

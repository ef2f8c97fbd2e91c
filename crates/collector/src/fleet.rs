//! Client reports (docs/protocol.md §Client reports), totalled per install exactly once.
//!
//! A device resends a report (same install id, same report id) until a 2xx covers it, so a
//! collector sees some twice and, after a lost answer and a retry, out of order. Each report id
//! is counted once per install; what an install has seen is kept as "every id up to `floor`"
//! plus the few above it, so the memory per install stays small however long it lives.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Value, json};

/// Longest install id taken (the SDK's is 32 hex digits).
const MAX_INSTALL_ID_BYTES: usize = 64;
/// Most entries of a report's `quarantined` or `dropped` object that are counted.
const MAX_REASONS: usize = 32;

/// The counters a report adds up, by name: `tracked`, `restored`, `redriven`, `delivered`,
/// `quarantine_purged`, `quarantined.<reason>`, `dropped.<reason>`.
pub type Counts = BTreeMap<String, u64>;

#[derive(Debug, Default)]
struct Install {
    /// Every report id up to here is counted.
    floor: u64,
    /// Counted ids above `floor`.
    above: BTreeSet<u64>,
    counts: Counts,
    /// The queue sizes of the newest report: (report id, pending, quarantine size).
    latest: (u64, u64, u64),
}

impl Install {
    /// Marks `id` seen; `false` when it was already.
    fn see(&mut self, id: u64) -> bool {
        if id <= self.floor || !self.above.insert(id) {
            return false;
        }
        while self.above.remove(&(self.floor + 1)) {
            self.floor += 1;
        }
        true
    }
}

/// The totals over every install, as `GET /fleet` and `eventspool collector` show them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetTotals {
    pub installs: u64,
    /// Distinct reports counted, and copies that were already counted.
    pub reports: u64,
    pub duplicates: u64,
    /// Reports that could not be read (ignored).
    pub malformed: u64,
    pub counts: Counts,
    /// The sum, over installs, of the sizes in each one's newest report.
    pub pending: u64,
    pub quarantine_size: u64,
}

impl FleetTotals {
    pub fn count(&self, name: &str) -> u64 {
        self.counts.get(name).copied().unwrap_or(0)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "installs": self.installs,
            "reports": self.reports,
            "duplicates": self.duplicates,
            "malformed": self.malformed,
            "counts": self.counts,
            "pending": self.pending,
            "quarantine_size": self.quarantine_size,
        })
    }
}

/// Every install's totals.
#[derive(Debug, Default)]
pub struct FleetBook {
    installs: HashMap<String, Install>,
    duplicates: u64,
    malformed: u64,
}

impl FleetBook {
    /// Takes one report; returns its id when it is readable (counted now or before), so the
    /// answer can name it in `reports_seen`.
    pub fn add(&mut self, report: &Value) -> Option<u64> {
        match read(report) {
            Ok((install_id, id, counts, pending, quarantine_size)) => {
                let install = self.installs.entry(install_id).or_default();
                if !install.see(id) {
                    self.duplicates += 1;
                    return Some(id);
                }
                for (name, n) in counts {
                    *install.counts.entry(name).or_default() += n;
                }
                if id > install.latest.0 {
                    install.latest = (id, pending, quarantine_size);
                }
                Some(id)
            }
            Err(why) => {
                self.malformed += 1;
                tracing::warn!(target: "eventspool::collector", %why, "client report ignored");
                None
            }
        }
    }

    pub fn totals(&self) -> FleetTotals {
        let mut t = FleetTotals {
            installs: self.installs.len() as u64,
            duplicates: self.duplicates,
            malformed: self.malformed,
            ..FleetTotals::default()
        };
        for install in self.installs.values() {
            t.reports += install.floor + install.above.len() as u64;
            for (name, n) in &install.counts {
                *t.counts.entry(name.clone()).or_default() += n;
            }
            t.pending += install.latest.1;
            t.quarantine_size += install.latest.2;
        }
        t
    }

    /// One install's counts.
    pub fn install(&self, install_id: &str) -> Option<Counts> {
        self.installs.get(install_id).map(|i| i.counts.clone())
    }
}

type Read = (String, u64, Counts, u64, u64);

/// The `(install_id, report_id)` of a readable report, its identity downstream: a collector
/// that publishes reports instead of totalling them (JetStream) dedups them by it, and the
/// reader that totals them feeds each to a [`FleetBook`].
pub fn report_key(report: &Value) -> Result<(String, u64), String> {
    read(report).map(|(install, id, ..)| (install, id))
}

fn read(report: &Value) -> Result<Read, String> {
    let install_id = match report.get("install_id") {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_INSTALL_ID_BYTES => s.clone(),
        _ => return Err("install_id is not a string of 1-64 bytes".into()),
    };
    let id = report
        .get("report_id")
        .and_then(Value::as_u64)
        .filter(|id| *id > 0)
        .ok_or("report_id is not a positive integer")?;
    let number = |name: &str| -> Result<u64, String> {
        match report.get(name) {
            None => Ok(0),
            Some(v) => v.as_u64().ok_or(format!("{name} is not a count")),
        }
    };
    let mut counts = Counts::new();
    for name in [
        "tracked",
        "restored",
        "redriven",
        "delivered",
        "quarantine_purged",
    ] {
        let n = number(name)?;
        if n > 0 {
            counts.insert(name.to_string(), n);
        }
    }
    for group in ["quarantined", "dropped"] {
        let Some(v) = report.get(group) else { continue };
        let map = v.as_object().ok_or(format!("{group} is not an object"))?;
        if map.len() > MAX_REASONS {
            return Err(format!("{group} has more than {MAX_REASONS} reasons"));
        }
        for (reason, n) in map {
            let n = n
                .as_u64()
                .ok_or(format!("{group}.{reason} is not a count"))?;
            if n > 0 {
                counts.insert(format!("{group}.{reason}"), n);
            }
        }
    }
    Ok((
        install_id,
        id,
        counts,
        number("pending")?,
        number("quarantine_size")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(install: &str, id: u64, tracked: u64) -> Value {
        json!({"install_id": install, "report_id": id, "tracked": tracked,
               "quarantined": {"bad_request": 1}, "pending": id, "quarantine_size": 1})
    }

    #[test]
    fn each_report_counts_once_in_any_order() {
        let mut book = FleetBook::default();
        for (install, id) in [("a", 2), ("a", 1), ("a", 2), ("b", 1), ("a", 3), ("a", 1)] {
            assert_eq!(book.add(&report(install, id, 10)), Some(id));
        }
        let t = book.totals();
        assert_eq!((t.installs, t.reports, t.duplicates), (2, 4, 2));
        assert_eq!(t.count("tracked"), 40);
        assert_eq!(t.count("quarantined.bad_request"), 4);
        assert_eq!(t.pending, 3 + 1, "newest report of each install");
        assert_eq!(book.add(&json!({"report_id": 1})), None);
        assert_eq!(
            book.add(&json!({"install_id": "a", "report_id": 9, "tracked": -1})),
            None
        );
        assert_eq!(book.totals().malformed, 2);
        let a = &book.installs["a"];
        assert_eq!(
            (a.floor, a.above.len()),
            (3, 0),
            "seen ids folded into the floor"
        );
    }
}

//! The run's report: a table for people (check, what the protocol says, what the collector
//! did, the result; then the fix for each failure) or one JSON object with `--json`.

use serde_json::{Value, json};

use super::context::{NAME_PREFIX, TAG_PROPERTY};
use super::verdict::{Grade, Verdict};

/// One check's line of the report.
pub struct Row {
    pub check: &'static str,
    pub protocol: &'static str,
    pub verdict: Verdict,
    pub requests: usize,
    pub events: usize,
    pub ms: u128,
}

pub struct Report {
    pub endpoint: String,
    pub run: String,
    pub rows: Vec<Row>,
}

const PROTOCOL_WIDTH: usize = 36;
const DID_WIDTH: usize = 50;

impl Report {
    pub fn count(&self, grade: Grade) -> usize {
        self.rows
            .iter()
            .filter(|r| r.verdict.grade == grade)
            .count()
    }

    pub fn failed(&self) -> bool {
        self.count(Grade::Fail) > 0
    }

    pub fn to_json(&self) -> Value {
        let checks: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "check": r.check,
                    "result": r.verdict.grade.as_str(),
                    "protocol": r.protocol,
                    "did": r.verdict.did,
                    "fix": r.verdict.fix,
                    "requests": r.requests,
                    "events": r.events,
                    "ms": r.ms,
                })
            })
            .collect();
        json!({
            "endpoint": self.endpoint,
            "run": self.run,
            "tag": { "name_prefix": NAME_PREFIX, "property": TAG_PROPERTY },
            "passed": self.count(Grade::Pass),
            "failed": self.count(Grade::Fail),
            "not_applicable": self.count(Grade::NotApplicable),
            "requests": self.rows.iter().map(|r| r.requests).sum::<usize>(),
            "events": self.rows.iter().map(|r| r.events).sum::<usize>(),
            "checks": checks,
        })
    }

    pub fn to_table(&self) -> String {
        let name_width = self
            .rows
            .iter()
            .map(|r| r.check.len())
            .chain(["CHECK".len()])
            .max()
            .unwrap_or(5);
        let mut out = String::new();
        let mut line = |cells: [&str; 4]| {
            out.push_str(&format!(
                "{:<name_width$}  {:<PROTOCOL_WIDTH$}  {:<DID_WIDTH$}  {}",
                cells[0], cells[1], cells[2], cells[3]
            ));
            // Padding of an empty last cell would leave trailing blanks.
            while out.ends_with(' ') {
                out.pop();
            }
            out.push('\n');
        };
        line(["CHECK", "PROTOCOL SAYS", "COLLECTOR DID", "RESULT"]);
        for row in &self.rows {
            let protocol = wrap(row.protocol, PROTOCOL_WIDTH);
            let did = wrap(&row.verdict.did, DID_WIDTH);
            for i in 0..protocol.len().max(did.len()) {
                let first = i == 0;
                line([
                    if first { row.check } else { "" },
                    protocol.get(i).map_or("", String::as_str),
                    did.get(i).map_or("", String::as_str),
                    if first {
                        row.verdict.grade.as_str()
                    } else {
                        ""
                    },
                ]);
            }
        }
        let fixes: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.verdict.fix.is_some())
            .collect();
        if !fixes.is_empty() {
            out.push('\n');
            for row in fixes {
                let fix = row.verdict.fix.as_deref().unwrap_or("");
                out.push_str(&format!("fix {}: {fix}\n", row.check));
            }
        }
        let requests: usize = self.rows.iter().map(|r| r.requests).sum();
        let events: usize = self.rows.iter().map(|r| r.events).sum();
        out.push_str(&format!(
            "\n{} checks: {} pass, {} fail, {} n/a; {requests} requests, {events} events to {}\n",
            self.rows.len(),
            self.count(Grade::Pass),
            self.count(Grade::Fail),
            self.count(Grade::NotApplicable),
            self.endpoint,
        ));
        out.push_str(&format!(
            "the events are named {NAME_PREFIX}<check> and carry \
             \"{TAG_PROPERTY}\": {{\"run\": \"{}\", ...}}\n",
            self.run
        ));
        out
    }
}

/// `text` in lines of at most `width` characters, broken at spaces (a longer word is cut).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        loop {
            let used = current.chars().count();
            let room = if used == 0 {
                width
            } else {
                width.saturating_sub(used + 1)
            };
            if word.len() <= room {
                if used > 0 {
                    current.push(' ');
                }
                current.extend(word.iter());
                break;
            }
            if used == 0 {
                let rest = word.split_off(width);
                lines.push(word.iter().collect());
                word = rest;
            } else {
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() || lines.is_empty() {
        lines.push(current);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn report_cells_wrap_at_spaces_and_cut_long_words() {
        assert_eq!(wrap("a bb ccc", 4), ["a bb", "ccc"]);
        assert_eq!(wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert_eq!(wrap("", 4), [""]);
        assert!(
            wrap("one two three four five", 9)
                .iter()
                .all(|l| l.chars().count() <= 9)
        );
    }
}

//! `--verify-cmd`: the team's own way to say which events its collector stored, so a check can
//! tell "answered 2xx and kept" from "answered 2xx and dropped" (or kept twice).
//!
//! The interface (docs/cli.md §conformance): the command runs under `sh -c` with the event ids
//! on stdin, one per line, and the environment variables below; it prints one line per stored
//! event, `EVENT_ID` or `EVENT_ID COUNT` (separated by spaces, tabs, `|` or `,`: what `sqlite3`
//! and `psql -A` print), where `COUNT` is how many copies are stored. Ids it does not print are
//! not stored; lines for other ids are ignored. Exit 0; anything else fails the check that asked.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A hook that takes longer is stopped, and the check that asked fails naming it.
pub const READ_BACK_TIMEOUT: Duration = Duration::from_secs(30);
/// More output than this is not read (a hook that dumps a warehouse).
const MAX_OUTPUT_BYTES: u64 = 8 << 20;
/// Polling step while the hook runs.
const POLL: Duration = Duration::from_millis(10);

/// Stored copies by event id, as the hook printed them.
pub type Stored = HashMap<String, u64>;

pub struct ReadBack {
    cmd: String,
    endpoint: String,
    run: String,
}

impl ReadBack {
    pub fn new(cmd: String, endpoint: &str, run: &str) -> ReadBack {
        ReadBack {
            cmd,
            endpoint: endpoint.to_owned(),
            run: run.to_owned(),
        }
    }

    /// Runs the hook for these ids.
    pub fn stored(&self, check: &str, ids: &[&str]) -> Result<Stored, String> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&self.cmd)
            .env("EVENTSPOOL_CONFORMANCE_RUN", &self.run)
            .env("EVENTSPOOL_CONFORMANCE_CHECK", check)
            .env("EVENTSPOOL_ENDPOINT", &self.endpoint)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("--verify-cmd could not start: {e}"))?;
        let mut input = String::new();
        for id in ids {
            input.push_str(id);
            input.push('\n');
        }
        let stdin = child.stdin.take();
        let writer = std::thread::spawn(move || {
            if let Some(mut stdin) = stdin {
                // A hook that does not read its input is allowed to exit early.
                let _ = stdin.write_all(input.as_bytes());
            }
        });
        let reader = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut out = Vec::new();
                if let Some(pipe) = pipe {
                    let _ = pipe.take(MAX_OUTPUT_BYTES).read_to_end(&mut out);
                }
                out
            })
        };
        let stdout = reader(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let stderr = reader(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() < READ_BACK_TIMEOUT => std::thread::sleep(POLL),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "--verify-cmd did not finish within {} s",
                        READ_BACK_TIMEOUT.as_secs()
                    ));
                }
                Err(e) => return Err(format!("--verify-cmd: {e}")),
            }
        };
        let _ = writer.join();
        let out = stdout.join().unwrap_or_default();
        let err = stderr.join().unwrap_or_default();
        if !status.success() {
            let said = String::from_utf8_lossy(&err);
            let said = said.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            return Err(format!("--verify-cmd failed ({status}): {}", said.trim()));
        }
        parse(&String::from_utf8_lossy(&out))
    }
}

/// The hook's output: `ID` or `ID COUNT` per line.
pub fn parse(text: &str) -> Result<Stored, String> {
    let mut stored = Stored::new();
    for line in text.lines() {
        let mut tokens = line
            .split(|c: char| c.is_whitespace() || c == '|' || c == ',')
            .filter(|t| !t.is_empty());
        let Some(id) = tokens.next() else { continue };
        let count = match tokens.next() {
            None => 1,
            Some(n) => n.parse::<u64>().map_err(|_| {
                format!("--verify-cmd printed {line:?}: expected EVENT_ID or EVENT_ID COUNT")
            })?,
        };
        *stored.entry(id.to_owned()).or_default() += count;
    }
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_back_lines_take_the_common_separators() {
        let stored = parse("a\nb|2\n\nc 1\nd,3\n e\t1 \n").unwrap();
        assert_eq!(stored["a"], 1);
        assert_eq!(stored["b"], 2);
        assert_eq!(stored["c"], 1);
        assert_eq!(stored["d"], 3);
        assert_eq!(stored["e"], 1);
        assert!(parse("a lot").unwrap_err().contains("EVENT_ID COUNT"));
    }
}

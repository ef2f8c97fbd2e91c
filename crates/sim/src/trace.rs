//! A device's trace: every step, request and answer as a line, hashed (FNV-1a, the same in
//! every build, so one seed's hash can be compared across runs and machines); the last lines
//! are kept for a failure's report.

use std::collections::VecDeque;
use std::fmt;
use std::hash::Hasher;

/// A device's trace: every step, request and answer, hashed; the last lines kept for a report.
#[derive(Default)]
pub struct Trace {
    hasher: Fnv,
    recent: VecDeque<String>,
}

impl Trace {
    pub fn line(&mut self, now_ms: u64, what: fmt::Arguments<'_>) {
        let line = format!("{:>10.3}s {what}", now_ms as f64 / 1000.0);
        self.hasher.write(line.as_bytes());
        if echo() {
            eprintln!("{line}");
        }
        if self.recent.len() == 40 {
            self.recent.pop_front();
        }
        self.recent.push_back(line);
    }

    pub fn recent(&self) -> Vec<String> {
        self.recent.iter().cloned().collect()
    }

    pub fn hash(&self) -> u64 {
        self.hasher.finish()
    }
}

/// `EVENTSPOOL_SIM_ECHO=1` prints every trace line as it happens (run it with `--device`).
fn echo() -> bool {
    static ECHO: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ECHO.get_or_init(|| std::env::var_os("EVENTSPOOL_SIM_ECHO").is_some_and(|v| v == "1"))
}

/// FNV-1a: a hash whose value is the same in every build, so a trace hash can be compared
/// across runs and machines.
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

//! The retry policy of docs/delivery.md §Retry as plain functions of data: the full-jitter formula,
//! the `Retry-After` rule, and the per-episode budget. The delivery machine (`src/machine.rs`) only
//! carries out what these decide, and the fleet simulation runs this same code on a virtual clock.

use std::time::SystemTime;

/// The upper bound of the delay before automatic retry `attempt` (1-based):
/// `min(cap, base · 2^(attempt-1))`, saturating instead of overflowing for large attempts.
pub fn backoff_ceiling_ms(attempt: u32, base_ms: u64, cap_ms: u64) -> u64 {
    let shift = attempt.saturating_sub(1).min(63);
    base_ms.saturating_mul(1u64 << shift).min(cap_ms)
}

/// Full jitter: `uniform(0, ceiling)`. Spreading retries over the whole window is what keeps a
/// fleet of phones that reconnect together from hammering the collector in lock-step.
/// `unit` is a uniform sample in `[0, 1)`, injected so tests and simulations are reproducible.
pub fn full_jitter_ms(attempt: u32, base_ms: u64, cap_ms: u64, unit: f64) -> u64 {
    let ceiling = backoff_ceiling_ms(attempt, base_ms, cap_ms);
    ((ceiling as f64) * unit.clamp(0.0, 1.0))
        .floor()
        .min(ceiling as f64) as u64
}

/// Parses `Retry-After` (delta-seconds or an HTTP date) into a delay from `now`.
/// Garbage yields `None` (the normal backoff applies); a date in the past yields 0.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<u64> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(seconds.saturating_mul(1000));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(
        date.duration_since(now)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    )
}

/// The delay before the next try after a transient failure: the jittered backoff, but never
/// earlier than the collector asked (`Retry-After`), and never later than `retry_after_cap_ms`.
pub fn next_delay_ms(
    attempt: u32,
    base_ms: u64,
    cap_ms: u64,
    retry_after_ms: Option<u64>,
    retry_after_cap_ms: u64,
    unit: f64,
) -> u64 {
    let jitter = full_jitter_ms(attempt, base_ms, cap_ms, unit);
    match retry_after_ms {
        Some(asked) => jitter.max(asked.min(retry_after_cap_ms)),
        None => jitter,
    }
}

/// The delay before `WaitingForUser`'s automatic probe number `probe` (1-based):
/// `uniform(0, min(probe_cap_ms, probe_base_ms · 2^(probe-1)))`, the retry formula on a slower
/// scale. The probe is what lets delivery resume by itself once the collector is back, without
/// anyone pressing "retry"; full jitter spreads a fleet's probes as it spreads its retries, and
/// the doubling to a cap of minutes keeps a fleet behind a long outage from costing more than
/// one request per device every few minutes.
pub fn probe_delay_ms(probe: u32, probe_base_ms: u64, probe_cap_ms: u64, unit: f64) -> u64 {
    full_jitter_ms(probe, probe_base_ms, probe_cap_ms, unit)
}

/// One failure episode: from the first transient failure to the next success (or a reconnect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Episode {
    /// Monotonic time of the failure that opened the episode.
    pub started_ms: u64,
    /// Attempts that failed so far in this episode (the first send included).
    pub failures: u32,
}

impl Episode {
    /// Counts a failed attempt: the first failure opens the episode at `now_ms`, later ones
    /// continue it. Returns the episode, whose `failures` is then the attempt just failed.
    pub fn record_failure(episode: &mut Option<Episode>, now_ms: u64) -> &mut Episode {
        let episode = episode.get_or_insert(Episode {
            started_ms: now_ms,
            failures: 0,
        });
        episode.failures += 1;
        episode
    }
}

/// What follows a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Automatic retry number `attempt` of `max_attempts`, after `delay_ms`.
    Retry { attempt: u32, delay_ms: u64 },
    /// The automatic budget is spent: hand over to the user.
    WaitForUser { attempts: u32 },
}

/// The budget rule: up to `max_auto_attempts` automatic retries per episode, and none that would
/// start after `max_retry_elapsed_ms` since the episode began. Manual attempts (`manual`) never
/// schedule another automatic one; they only raise the count the UI shows.
pub fn after_failure(
    episode: &Episode,
    now_ms: u64,
    manual: bool,
    max_auto_attempts: u32,
    max_retry_elapsed_ms: u64,
    delay_ms: u64,
) -> AfterFailure {
    let retries_done = episode.failures.saturating_sub(1);
    let next = retries_done + 1;
    let elapsed_at_retry = now_ms
        .saturating_sub(episode.started_ms)
        .saturating_add(delay_ms);
    if manual || next > max_auto_attempts || elapsed_at_retry > max_retry_elapsed_ms {
        AfterFailure::WaitForUser {
            attempts: retries_done,
        }
    } else {
        AfterFailure::Retry {
            attempt: next,
            delay_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    proptest! {
        #[test]
        fn every_delay_lies_within_the_full_jitter_window(
            attempt in 1u32..200, base in 1u64..100_000, extra in 0u64..10_000_000, unit in 0.0f64..1.0
        ) {
            let cap = base + extra;
            let d = full_jitter_ms(attempt, base, cap, unit);
            let bound = cap.min(base.saturating_mul(2u64.saturating_pow(attempt - 1)));
            prop_assert!(d <= bound, "delay {d} over bound {bound}");
        }

        #[test]
        fn retry_after_is_honoured_and_capped(
            attempt in 1u32..20, asked in 0u64..1_000_000_000, cap in 1u64..10_000_000, unit in 0.0f64..1.0
        ) {
            let d = next_delay_ms(attempt, 1000, 30_000, Some(asked), cap, unit);
            prop_assert!(d >= asked.min(cap));
            prop_assert!(d <= asked.min(cap).max(30_000));
        }

        #[test]
        fn retry_after_parsing_never_panics(text in ".{0,64}") {
            let _ = parse_retry_after(&text, SystemTime::now());
        }
    }

    #[test]
    fn probes_grow_from_a_minute_to_the_cap() {
        let ceilings: Vec<u64> = (1..=6)
            .map(|k| probe_delay_ms(k, 60_000, 900_000, 1.0))
            .collect();
        assert_eq!(
            ceilings,
            [60_000, 120_000, 240_000, 480_000, 900_000, 900_000]
        );
        assert_eq!(probe_delay_ms(3, 60_000, 900_000, 0.5), 120_000);
        assert_eq!(probe_delay_ms(u32::MAX, 60_000, 900_000, 0.0), 0);
    }

    #[test]
    fn ceiling_doubles_then_caps() {
        let ceilings: Vec<u64> = (1..=7)
            .map(|k| backoff_ceiling_ms(k, 1000, 30_000))
            .collect();
        assert_eq!(ceilings, [1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(backoff_ceiling_ms(10_000, 1000, 30_000), 30_000);
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(parse_retry_after("7", now), Some(7000));
        assert_eq!(parse_retry_after(" 120 ", now), Some(120_000));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(parse_retry_after(&later, now), Some(30_000));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(0));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
        // Ten years is honoured as asked, and the cap is applied by next_delay_ms.
        assert_eq!(parse_retry_after("315360000", now), Some(315_360_000_000));
        assert_eq!(
            next_delay_ms(1, 1000, 30_000, Some(315_360_000_000), 300_000, 0.5),
            300_000
        );
    }

    #[test]
    fn budget_hands_over_after_max_auto_attempts() {
        let mut episode = Episode {
            started_ms: 0,
            failures: 0,
        };
        let mut seen = Vec::new();
        loop {
            episode.failures += 1;
            match after_failure(&episode, 1000, false, 5, 300_000, 100) {
                AfterFailure::Retry { attempt, .. } => seen.push(attempt),
                AfterFailure::WaitForUser { attempts } => {
                    assert_eq!(attempts, 5);
                    break;
                }
            }
        }
        assert_eq!(seen, [1, 2, 3, 4, 5]);
        episode.failures += 1;
        assert_eq!(
            after_failure(&episode, 2000, true, 5, 300_000, 0),
            AfterFailure::WaitForUser { attempts: 6 }
        );
    }

    #[test]
    fn elapsed_budget_ends_the_episode_early() {
        let episode = Episode {
            started_ms: 0,
            failures: 2,
        };
        assert_eq!(
            after_failure(&episode, 299_000, false, 5, 300_000, 5_000),
            AfterFailure::WaitForUser { attempts: 1 }
        );
    }
}

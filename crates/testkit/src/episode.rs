//! Used by the integration and proxy suites: drives a failure episode on a stepped clock, so a
//! test can count requests at the hand-over to the user without the slow probe behind
//! `WaitingForUser` adding one.

use std::time::Duration;

use eventspool::{DeliveryState, DeliveryStatus, EventSpool, ManualClock};

const WAIT: Duration = Duration::from_secs(60);

/// Drives a stepped clock through a failure episode: every automatic retry is let go (the clock
/// jumps to its deadline) until the budget is spent. The clock then stands still, so the
/// slow probe behind `WaitingForUser` (a jittered delay of up to `probe_base_ms`) goes out only
/// when the test moves the clock again.
pub fn drive_to_waiting_for_user(spool: &EventSpool, clock: &ManualClock) -> DeliveryStatus {
    let mut seen = 0;
    loop {
        let st = spool
            .wait_for(WAIT, |s| match s.state {
                DeliveryState::WaitingForUser { .. } => true,
                DeliveryState::RetryScheduled { attempt, .. } => attempt > seen,
                _ => false,
            })
            .unwrap_or_else(|| panic!("no retry or hand-over; state {}", spool.state()));
        match st.state {
            DeliveryState::RetryScheduled { attempt, .. } => {
                seen = attempt;
                // Exactly to the retry's deadline: the episode's elapsed budget sees only the
                // time the backoffs really took.
                if let DeliveryState::RetryScheduled { retry_in_ms, .. } = spool.state().state {
                    clock.advance(Duration::from_millis(retry_in_ms));
                }
            }
            _ => return st,
        }
    }
}

//! What the app's observers hear from the spool: per-id drop notices, and the status the UI
//! would render, checked as it is published (attempt within its maximum, no "0 attempts").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use eventspool::{DeliveryObserver, DeliveryState, DeliveryStatus, Notice};

use super::Finding;

/// What the observers heard.
#[derive(Default)]
pub(super) struct Heard {
    pub(super) dropped: HashMap<String, String>,
    pub(super) findings: Vec<Finding>,
    pub(super) last_countdown: Option<(u32, i64)>,
}

pub(super) struct Observer(pub(super) Arc<Mutex<Heard>>);

impl DeliveryObserver for Observer {
    fn on_state(&self, status: &DeliveryStatus) {
        let mut h = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let DeliveryState::RetryScheduled {
            attempt,
            max_attempts,
            ..
        } = status.state
            && attempt > max_attempts
        {
            h.findings.push(format!(
                "the UI is told attempt {attempt} of {max_attempts}"
            ));
        }
        if let DeliveryState::WaitingForUser { attempts: 0, .. } = status.state {
            let line = status.to_string();
            if line.contains(" 0 attempt") {
                h.findings
                    .push(format!("the UI's status line says: {line}"));
            }
        }
        if status.pending > 0 && status.state == DeliveryState::Idle {
            h.last_countdown = None;
        }
    }

    fn on_notice(&self, notice: &Notice) {
        if let Notice::EventsDropped { reason, event_ids } = notice {
            let mut h = self.0.lock().unwrap_or_else(|p| p.into_inner());
            for id in event_ids {
                h.dropped.insert(id.clone(), reason.clone());
            }
        }
    }
}

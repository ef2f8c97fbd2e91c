//! The delivery worker: one task per spool that turns the queue into batches, sends them, and
//! carries out what [`crate::classify`] and [`crate::retry`] decide. It is the only sender, so
//! batches leave strictly in order and only one is ever in flight.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use crate::classify::{Failure, Outcome, classify};
use crate::config::{BATCH_OVERHEAD_BYTES, Compression, Durability};
use crate::event::QueuedEvent;
use crate::quarantine::{QuarantinedEvent, reason};
use crate::retry::{AfterFailure, Episode, after_failure, next_delay_ms};
use crate::shared::{Control, Shared, lock, seqs_by_origin};
use crate::state::{DeliveryState, PauseReason};
use crate::stats::DropReason;
use crate::transport::{HttpRequest, TransportError};
use crate::wire;

const USER_AGENT: &str = concat!("eventspool/", env!("CARGO_PKG_VERSION"));

/// Where the worker stands; the published [`DeliveryState`] is derived from it.
#[derive(Clone, Debug)]
enum Mode {
    Idle,
    Draining,
    RetryWait {
        attempt: u32,
        deadline_ms: u64,
        failure: Failure,
    },
    WaitingForUser {
        attempts: u32,
        failure: Failure,
    },
    Paused {
        reason: PauseReason,
        failure: Failure,
    },
    Offline,
    Disabled,
}

/// A batch being delivered: its events (each with whether it came from the store) and how many
/// times it was sent, for `X-Eventspool-Attempt`.
struct Batch {
    events: Vec<(QueuedEvent, bool)>,
    attempts: u32,
}

struct Worker {
    s: Arc<Shared>,
    mode: Mode,
    episode: Option<Episode>,
    /// The batch in flight first; after a 400/413 split, its halves in order.
    work: VecDeque<Batch>,
    next_periodic_ms: u64,
    /// After `dismiss()`: the user said "back", so `flush_at` does not restart sending; the next
    /// periodic flush or an explicit trigger does.
    suppress_flush_at: bool,
    /// The next failure answers a manual `retry_now()` from `WaitingForUser`.
    manual_attempt: bool,
    last_send_ms: Option<u64>,
    /// A pause outlives going offline and back: only `resume()` or new credentials end it, so a
    /// reconnect does not spend a request on an endpoint already known to refuse.
    pause: Option<(PauseReason, Failure)>,
}

pub async fn run(shared: Arc<Shared>) {
    let mut worker = Worker {
        mode: Mode::Idle,
        episode: None,
        work: VecDeque::new(),
        next_periodic_ms: shared.clock.now_ms() + shared.config.flush_interval_ms,
        suppress_flush_at: false,
        manual_attempt: false,
        last_send_ms: None,
        pause: None,
        s: shared,
    };
    worker.recover_leases();
    worker.run().await;
}

impl Worker {
    async fn run(&mut self) {
        // A peek, not a take: edges the app set before the worker started (a flush() right after
        // open) must still be seen by the loop.
        let control = lock(&self.s.control).clone();
        if !control.enabled {
            self.mode = Mode::Disabled;
        } else if !control.online {
            self.mode = Mode::Offline;
        }
        loop {
            let control = self.s.take_control();
            if control.shutdown {
                self.release_work();
                return;
            }
            self.apply(&control);
            let now = self.s.clock.now_ms();
            match self.mode.clone() {
                Mode::Disabled => self.idle_wait(DeliveryState::Disabled, None).await,
                Mode::Offline => self.idle_wait(DeliveryState::Offline, None).await,
                Mode::Paused { reason, failure } => {
                    self.idle_wait(
                        DeliveryState::Paused {
                            reason,
                            last_error: failure,
                        },
                        None,
                    )
                    .await
                }
                Mode::WaitingForUser { attempts, failure } => {
                    self.idle_wait(
                        DeliveryState::WaitingForUser {
                            attempts,
                            last_error: failure,
                        },
                        None,
                    )
                    .await
                }
                Mode::Idle => {
                    let pending = self.s.counters.pending();
                    let flush_at =
                        !self.suppress_flush_at && self.s.flush_at_reached.load(Ordering::SeqCst);
                    if pending > 0 && (flush_at || now >= self.next_periodic_ms) {
                        self.start_drain(now);
                        continue;
                    }
                    if now >= self.next_periodic_ms {
                        self.next_periodic_ms = now + self.s.config.flush_interval_ms;
                    }
                    let deadline = (pending > 0).then_some(self.next_periodic_ms);
                    self.idle_wait(DeliveryState::Idle, deadline).await;
                }
                Mode::RetryWait {
                    attempt,
                    deadline_ms,
                    failure,
                } => {
                    if now >= deadline_ms {
                        self.mode = Mode::Draining;
                        continue;
                    }
                    let state = DeliveryState::RetryScheduled {
                        attempt,
                        max_attempts: self.s.config.max_auto_attempts,
                        next_retry_at_ms: 0,
                        retry_in_ms: 0,
                        last_error: failure,
                    };
                    self.s.publish(state, Some(deadline_ms));
                    // Wake on each whole second of the countdown, so observers see it tick.
                    let left = deadline_ms - now;
                    let tick = now
                        + if left.is_multiple_of(1000) {
                            1000
                        } else {
                            left % 1000
                        };
                    self.wait(Some(tick.min(deadline_ms))).await;
                }
                Mode::Draining => self.drain_step(now).await,
            }
        }
    }

    fn start_drain(&mut self, now: u64) {
        self.mode = Mode::Draining;
        self.suppress_flush_at = false;
        self.s.flush_at_reached.store(false, Ordering::SeqCst);
        self.next_periodic_ms = now + self.s.config.flush_interval_ms;
    }

    /// Turns the app's requests into mode changes (DESIGN §5's arrows).
    fn apply(&mut self, c: &Control) {
        let now = self.s.clock.now_ms();
        if let Some((reason, _)) = &self.pause
            && (c.resume || (c.api_key_changed && *reason == PauseReason::Auth))
        {
            self.pause = None;
            if matches!(self.mode, Mode::Paused { .. }) {
                self.start_drain(now);
            }
        }
        if c.enabled_changed {
            self.release_work();
            self.episode = None;
            self.mode = if c.enabled {
                self.resting_mode()
            } else {
                Mode::Disabled
            };
        }
        if matches!(self.mode, Mode::Disabled) {
            return;
        }
        if c.online_changed {
            self.release_work();
            // A reconnect starts a fresh failure episode: the old budget was spent on a dead link.
            self.episode = None;
            self.manual_attempt = false;
            if c.online && self.pause.is_none() {
                self.start_drain(now);
            } else {
                self.mode = self.resting_mode();
            }
        }
        if !c.online {
            self.mode = Mode::Offline;
            return;
        }
        match &self.mode {
            Mode::RetryWait { .. } | Mode::WaitingForUser { .. } if c.dismiss => {
                self.release_work();
                self.episode = None;
                self.manual_attempt = false;
                self.suppress_flush_at = true;
                self.next_periodic_ms = now + self.s.config.flush_interval_ms;
                self.mode = Mode::Idle;
            }
            Mode::RetryWait { .. } if c.retry_now => self.mode = Mode::Draining,
            Mode::WaitingForUser { .. } if c.retry_now => {
                self.manual_attempt = true;
                self.mode = Mode::Draining;
            }
            Mode::Idle if c.retry_now || c.flush => self.start_drain(now),
            _ => {}
        }
    }

    /// Where the worker rests when nothing is being sent: offline, paused, or idle.
    fn resting_mode(&self) -> Mode {
        if !lock(&self.s.control).online {
            Mode::Offline
        } else if let Some((reason, failure)) = &self.pause {
            Mode::Paused {
                reason: *reason,
                failure: failure.clone(),
            }
        } else {
            Mode::Idle
        }
    }

    async fn idle_wait(&mut self, state: DeliveryState, deadline: Option<u64>) {
        self.s.publish(state, None);
        self.wait(deadline).await;
    }

    /// Sleeps until the deadline (monotonic clock) or until the app asks for something.
    async fn wait(&self, deadline: Option<u64>) {
        let notified = self.s.wake.notified();
        match deadline {
            Some(deadline) => {
                tokio::select! {
                    _ = notified => {}
                    _ = self.s.clock.sleep_until(deadline) => {}
                }
            }
            None => notified.await,
        }
    }

    async fn drain_step(&mut self, now: u64) {
        if let Some(last) = self.last_send_ms {
            let ready_at = last + self.s.config.min_batch_interval_ms;
            if now < ready_at && self.s.config.min_batch_interval_ms > 0 {
                self.s.publish(DeliveryState::Sending, None);
                self.wait(Some(ready_at)).await;
                return;
            }
        }
        if self.work.is_empty() {
            let assembled = self.assemble();
            // A refused spill (`durability = always`) is told now that the spill lock is free.
            self.s.deliver_notices();
            match assembled {
                Some(batch) => self.work.push_back(batch),
                None => {
                    self.mode = Mode::Idle;
                    self.s.flush_at_reached.store(false, Ordering::SeqCst);
                    return;
                }
            }
        }
        self.s.publish(DeliveryState::Sending, None);
        let Some(result) = self.send_front().await else {
            return;
        };
        self.last_send_ms = Some(self.s.clock.now_ms());
        let outcome = classify(&result, SystemTime::now());
        self.handle(outcome);
    }

    /// Takes the next batch in delivery order from memory and store together.
    fn assemble(&mut self) -> Option<Batch> {
        let s = &self.s;
        // Held while the batch is picked, so a spill in progress (events in neither memory nor
        // the store yet) finishes first. Events still waiting to spill are read from memory,
        // except with `durability = always`: there a caller is waiting for them to reach the
        // disk, so they are committed first and read from the store.
        let _guard = s.spill_lock.lock();
        let always = s.config.durability == Durability::Always;
        if always && let Err(e) = s.spill_locked() {
            tracing::warn!(error = %e, "spill before batch failed; sending what is stored");
        }
        let cutoff = s
            .clock
            .wall_ms()
            .saturating_sub(s.config.max_event_age_ms as i64);
        let expired_memory = s.buffer.lock().expire(cutoff);
        s.counters.drop(DropReason::Expired, expired_memory);
        let limit = s.config.max_batch_events as usize;
        let from_store = match &s.store {
            Some(store) => {
                let read = || {
                    store.oldest(limit).unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "reading the store failed; sending from memory");
                        Vec::new()
                    })
                };
                let mut oldest = read();
                // The rows come in timestamp order, so only a stale first row means work for
                // the expiry pass (which costs a write transaction).
                if oldest.first().is_some_and(|e| e.ts_ms < cutoff) {
                    match store.expire(cutoff) {
                        Ok(n) => s.counters.drop(DropReason::Expired, n),
                        Err(e) => tracing::warn!(error = %e, "expiring stored events failed"),
                    }
                    oldest = read();
                }
                oldest
            }
            None => Vec::new(),
        };
        let mut buffer = s.buffer.lock();
        let room = s.config.max_batch_bytes - BATCH_OVERHEAD_BYTES;
        let mut picked: Vec<(QueuedEvent, bool)> = Vec::new();
        let mut memory_keys = Vec::new();
        let mut bytes = 0u64;
        {
            let mut disk = from_store.into_iter().peekable();
            let mut memory = buffer.peek(limit, !always).peekable();
            while picked.len() < limit {
                let take_disk = match (disk.peek(), memory.peek()) {
                    (Some(d), Some(m)) => d.key() <= m.key(),
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (None, None) => break,
                };
                let size = if take_disk {
                    disk.peek().map(QueuedEvent::bytes)
                } else {
                    memory.peek().map(|m| m.bytes())
                };
                let size = size.unwrap_or(0) + 1;
                if !picked.is_empty() && bytes + size > room {
                    break;
                }
                bytes += size;
                if take_disk {
                    if let Some(event) = disk.next() {
                        picked.push((event, true));
                    }
                } else if let Some(event) = memory.next() {
                    memory_keys.push(event.key());
                    picked.push((event.clone(), false));
                }
            }
        }
        if picked.is_empty() {
            return None;
        }
        buffer.lease(&memory_keys);
        if let Some(store) = &s.store {
            store.lease(&seqs_by_origin(&picked).1);
        }
        Some(Batch {
            events: picked,
            attempts: 0,
        })
    }

    /// Sends the front batch; `None` when shutdown interrupted it.
    async fn send_front(
        &mut self,
    ) -> Option<Result<crate::transport::HttpResponse, TransportError>> {
        let s = self.s.clone();
        let batch = self.work.front_mut()?;
        batch.attempts += 1;
        let mut body = wire::batch_body(
            batch.events.iter().map(|(e, _)| &*e.json),
            s.clock.wall_ms(),
        );
        let mut headers = vec![
            ("Content-Type".to_string(), "application/json".to_string()),
            ("User-Agent".to_string(), USER_AGENT.to_string()),
            (
                "X-Eventspool-Attempt".to_string(),
                batch.attempts.to_string(),
            ),
        ];
        if s.config.compression == Compression::Gzip && body.len() > wire::GZIP_THRESHOLD_BYTES {
            body = wire::gzip(&body);
            headers.push(("Content-Encoding".to_string(), "gzip".to_string()));
        }
        if let Some(key) = lock(&s.api_key).as_ref() {
            headers.push(("Authorization".to_string(), format!("Bearer {key}")));
        }
        let timeout = Duration::from_millis(s.config.attempt_timeout_ms);
        let request = HttpRequest {
            method: "POST".into(),
            url: s.config.endpoint.clone(),
            headers,
            body,
            timeout,
        };
        s.counters.requests.fetch_add(1, Ordering::Relaxed);
        let mut shutdown = s.shutdown.subscribe();
        let send = tokio::time::timeout(
            timeout + Duration::from_millis(250),
            s.transport.send(request),
        );
        tokio::select! {
            result = send => Some(result.unwrap_or(Err(TransportError::Timeout))),
            _ = shutdown.wait_for(|stop| *stop) => None,
        }
    }

    fn handle(&mut self, outcome: Outcome) {
        let Some(batch) = self.work.pop_front() else {
            return;
        };
        match outcome {
            Outcome::Delivered => self.delivered(batch.events),
            Outcome::Partial { rejected } => {
                let status = Some(200);
                let mut good = Vec::new();
                for (event, from_store) in batch.events {
                    let id = event.id.to_string();
                    let Some(rejection) = rejected.iter().find(|r| r.event_id == id) else {
                        good.push((event, from_store));
                        continue;
                    };
                    let why = rejection.reason.clone();
                    self.quarantine(
                        vec![(event, from_store)],
                        reason::REJECTED,
                        why,
                        status,
                        batch.attempts,
                    );
                }
                self.delivered(good);
            }
            Outcome::Poisoned {
                status,
                too_large,
                detail,
            } => {
                if batch.events.len() > 1 {
                    let mut left = batch.events;
                    let right = left.split_off(left.len() / 2);
                    self.work.push_front(Batch {
                        events: right,
                        attempts: 0,
                    });
                    self.work.push_front(Batch {
                        events: left,
                        attempts: 0,
                    });
                } else {
                    let why = if too_large {
                        reason::TOO_LARGE
                    } else {
                        reason::BAD_REQUEST
                    };
                    self.quarantine(batch.events, why, detail, Some(status), batch.attempts);
                }
            }
            Outcome::Transient {
                failure,
                retry_after_ms,
            } => {
                self.work.push_front(batch);
                self.transient(failure, retry_after_ms);
            }
            Outcome::Auth { failure } => self.pause(batch, PauseReason::Auth, failure),
            Outcome::Config { failure } => self.pause(batch, PauseReason::Config, failure),
        }
    }

    fn delivered(&mut self, events: Vec<(QueuedEvent, bool)>) {
        if events.is_empty() {
            return;
        }
        let n = events.len() as u64;
        if let Err(e) = self.s.remove_from_queue(&events) {
            tracing::error!(error = %e, "could not delete delivered events; they may be sent again");
        }
        self.s.counters.delivered.fetch_add(n, Ordering::Relaxed);
        self.s
            .counters
            .batches_delivered
            .fetch_add(1, Ordering::Relaxed);
        self.s.counters.dequeued(n);
        self.episode = None;
        self.manual_attempt = false;
    }

    fn quarantine(
        &mut self,
        events: Vec<(QueuedEvent, bool)>,
        why: &str,
        detail: String,
        status: Option<u16>,
        attempts: u32,
    ) {
        let now = self.s.clock.wall_ms();
        let entries = events
            .iter()
            .map(|(e, _)| QuarantinedEvent::new(e, why, detail.clone(), status, attempts, now))
            .collect();
        if let Err(e) = self.s.add_to_quarantine(entries) {
            // Without a place to keep them, they stay queued rather than vanish.
            tracing::error!(error = %e, "could not quarantine events; keeping them queued");
            self.s.return_to_queue(&events);
            return;
        }
        let n = events.len() as u64;
        tracing::warn!(events = n, reason = why, status = ?status, "events quarantined");
        if let Err(e) = self.s.remove_from_queue(&events) {
            tracing::error!(error = %e, "could not remove quarantined events from the queue");
        }
        self.s.counters.quarantined.fetch_add(n, Ordering::Relaxed);
        self.s.counters.dequeued(n);
    }

    fn transient(&mut self, failure: Failure, retry_after_ms: Option<u64>) {
        let c = &self.s.config;
        let now = self.s.clock.now_ms();
        let episode = self.episode.get_or_insert(Episode {
            started_ms: now,
            failures: 0,
        });
        episode.failures += 1;
        let next_attempt = episode.failures;
        let delay = next_delay_ms(
            next_attempt,
            c.backoff_base_ms,
            c.backoff_cap_ms,
            retry_after_ms,
            c.retry_after_cap_ms,
            fastrand::f64(),
        );
        let manual = std::mem::take(&mut self.manual_attempt);
        tracing::info!(error = %failure, failures = episode.failures, "delivery attempt failed");
        self.mode = match after_failure(
            episode,
            now,
            manual,
            c.max_auto_attempts,
            c.max_retry_elapsed_ms,
            delay,
        ) {
            AfterFailure::Retry { attempt, delay_ms } => {
                // Announced here, not only by the countdown loop: a zero delay must still show
                // "attempt k of n" to the user.
                let state = DeliveryState::RetryScheduled {
                    attempt,
                    max_attempts: c.max_auto_attempts,
                    next_retry_at_ms: 0,
                    retry_in_ms: 0,
                    last_error: failure.clone(),
                };
                self.s.publish(state, Some(now + delay_ms));
                Mode::RetryWait {
                    attempt,
                    deadline_ms: now + delay_ms,
                    failure,
                }
            }
            AfterFailure::WaitForUser { attempts } => Mode::WaitingForUser { attempts, failure },
        };
    }

    fn pause(&mut self, batch: Batch, reason: PauseReason, failure: Failure) {
        tracing::warn!(error = %failure, reason = reason.as_str(), "delivery paused");
        self.work.push_front(batch);
        self.release_work();
        self.pause = Some((reason, failure.clone()));
        self.mode = Mode::Paused { reason, failure };
    }

    /// Gives the events of unfinished batches back to the queue, in place.
    fn release_work(&mut self) {
        let events: Vec<_> = self.work.drain(..).flat_map(|b| b.events).collect();
        self.s.return_to_queue(&events);
    }

    /// After a restart of the worker (a caught panic), nothing is in flight any more.
    fn recover_leases(&mut self) {
        let _guard = self.s.spill_lock.lock();
        self.s.buffer.lock().release_all();
        if let Some(store) = &self.s.store {
            store.release_all();
        }
    }
}

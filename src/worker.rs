//! The delivery worker: one task per spool that turns the queue into batches, sends them, and
//! carries out what [`crate::classify`] and [`crate::retry`] decide. It is the only sender, so
//! batches leave strictly in order and only one is ever in flight.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use crate::classify::{Failure, Outcome, classify};
use crate::config::{BATCH_OVERHEAD_BYTES, Compression};
use crate::event::{QueuedEvent, SendNote};
use crate::quarantine::{QuarantinedEvent, reason};
use crate::retry::{AfterFailure, Episode, after_failure, next_delay_ms, probe_delay_ms};
use crate::shared::{Control, Shared, lock};
use crate::split::{LoneRefusal, SizeLimit, Split};
use crate::state::{DeliveryState, Notice, PauseReason};
use crate::stats::{DropReason, Exit};
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
    /// The budget is spent; the slow probe goes out at `probe_at_ms` (monotonic).
    WaitingForUser {
        attempts: u32,
        failure: Failure,
        probe_at_ms: u64,
    },
    Paused {
        reason: PauseReason,
        failure: Failure,
    },
    Offline,
    Disabled,
}

/// A batch being delivered: its events (each with whether it came from the store), how many
/// times this batch was sent (the quarantine records it; `X-Eventspool-Attempt` is derived from
/// the events' own send counts, which outlive a batch), and the size of its last body before
/// compression, for [`SizeLimit`].
struct Batch {
    events: Vec<(QueuedEvent, bool)>,
    attempts: u32,
    body_bytes: u64,
}

impl Batch {
    fn new(events: Vec<(QueuedEvent, bool)>) -> Batch {
        Batch {
            events,
            attempts: 0,
            body_bytes: 0,
        }
    }
}

/// A lone event refused with 400/422 during a split, held until the split shows whether the
/// collector refuses it or every request (see [`crate::split`]).
struct Refused {
    batch: Batch,
    status: u16,
    detail: String,
}

struct Worker {
    s: Arc<Shared>,
    mode: Mode,
    episode: Option<Episode>,
    /// The batch in flight first; after a 400/413 split, its halves in order.
    work: VecDeque<Batch>,
    /// While `work` holds the pieces of a split: what the split has shown so far.
    split: Option<Split<Refused>>,
    /// The body size a proxy or the collector accepts, learned from 413s (life of the spool).
    size_limit: SizeLimit,
    next_periodic_ms: u64,
    /// After `dismiss()`: the user said "back", so `flush_at` does not restart sending; the next
    /// periodic flush or an explicit trigger does.
    suppress_flush_at: bool,
    /// The next failure answers a manual `retry_now()` from `WaitingForUser`.
    manual_attempt: bool,
    /// The request in flight is `WaitingForUser`'s automatic probe; holds the attempt count
    /// the state keeps if it fails.
    probing: Option<u32>,
    /// Probes that failed since the budget was spent: the next one waits longer.
    probes_failed: u32,
    rng: fastrand::Rng,
    last_send_ms: Option<u64>,
    /// A pause outlives going offline and back: only `resume()` or new credentials end it, so a
    /// reconnect does not spend a request on an endpoint already known to refuse.
    pause: Option<(PauseReason, Failure)>,
    /// HTTP answers (any status) received so far: an isolation compares it with its mark.
    answers: u64,
    /// While events past `max_event_sends` are being isolated: `answers` when it began (or when
    /// a probe was last scheduled). An answer since then shows the collector is alive, so an
    /// event that alone still gets none is the cause.
    isolation: Option<u64>,
    /// The last request got no answer at all (timeout, connection dropped): effect unknown.
    last_send_unanswered: bool,
}

pub async fn run(shared: Arc<Shared>) {
    let mut worker = Worker {
        mode: Mode::Idle,
        episode: None,
        work: VecDeque::new(),
        split: None,
        size_limit: SizeLimit::new(shared.config.max_batch_bytes),
        next_periodic_ms: shared.clock.now_ms() + shared.config.flush_interval_ms,
        suppress_flush_at: false,
        manual_attempt: false,
        probing: None,
        probes_failed: 0,
        rng: match shared.jitter_seed {
            Some(seed) => fastrand::Rng::with_seed(seed),
            None => fastrand::Rng::new(),
        },
        last_send_ms: None,
        pause: None,
        answers: 0,
        isolation: None,
        last_send_unanswered: false,
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
                Mode::WaitingForUser {
                    attempts,
                    failure,
                    probe_at_ms,
                } => {
                    if now >= probe_at_ms {
                        // One request behind the state the UI shows; see `transient`.
                        self.probing = Some(attempts);
                        self.mode = Mode::Draining;
                        continue;
                    }
                    let state = DeliveryState::WaitingForUser {
                        attempts,
                        last_error: failure,
                        next_probe_at_ms: 0,
                        probe_in_ms: 0,
                    };
                    self.s.publish(state, Some(probe_at_ms));
                    self.wait(Some(probe_at_ms)).await;
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

    /// Turns the app's requests into mode changes (the arrows of docs/delivery.md §States).
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
            self.fresh_episode();
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
            self.fresh_episode();
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
        if c.foreground_changed
            && c.foreground
            && matches!(
                self.mode,
                Mode::RetryWait { .. } | Mode::WaitingForUser { .. }
            )
        {
            // Back in the foreground: the user is looking and the outage may be long over, so
            // the budget starts again now, as after a reconnect.
            self.fresh_episode();
            self.mode = Mode::Draining;
        }
        match &self.mode {
            Mode::RetryWait { .. } | Mode::WaitingForUser { .. } if c.dismiss => {
                self.release_work();
                self.fresh_episode();
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

    /// Forgets the failure episode: the next failure starts a new one with the whole budget.
    fn fresh_episode(&mut self) {
        self.episode = None;
        self.manual_attempt = false;
        self.probing = None;
        self.probes_failed = 0;
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
                if self.probing.is_none() {
                    self.s.publish(DeliveryState::Sending, None);
                }
                self.wait(Some(ready_at)).await;
                return;
            }
        }
        if self.work.is_empty() {
            self.isolation = None;
            self.expire_queue();
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
        // One reading of the wall clock for the age check and the batch's `sent_at`: the
        // event that passed the check is the one sent, however the clock moves meanwhile.
        let wall_ms = self.s.clock.wall_ms();
        if !self.drop_expired_from_front(wall_ms) {
            return;
        }
        if self.probing.is_none() {
            // A probe runs behind `WaitingForUser`: the UI keeps showing that state.
            self.s.publish(DeliveryState::Sending, None);
        }
        let Some(result) = self.send_front(wall_ms).await else {
            return;
        };
        self.last_send_ms = Some(self.s.clock.now_ms());
        let note = match &result {
            Ok(_) => Some(SendNote::Answered),
            Err(TransportError::Connect(_) | TransportError::Tls(_)) => Some(SendNote::NotSent),
            Err(TransportError::Timeout | TransportError::Io(_)) => None,
        };
        self.last_send_unanswered = note.is_none();
        self.answers += u64::from(result.is_ok());
        let outcome = classify(&result, SystemTime::now());
        // Events that leave the queue now need no bookkeeping; the others keep what we learned.
        if let Some(note) = note
            && !matches!(outcome, Outcome::Delivered | Outcome::Partial { .. })
        {
            self.note_front(note);
        }
        self.handle(outcome);
    }

    /// The oldest acceptance an event may have to be sent at `wall_ms` (`max_event_age_ms`).
    fn age_cutoff(&self, wall_ms: i64) -> i64 {
        wall_ms.saturating_sub(self.s.config.max_event_age_ms as i64)
    }

    /// Drops every queued event, in memory and in the store, accepted longer than
    /// `max_event_age_ms` ago (the batch in flight is checked by [`Worker::drop_expired_from_front`]).
    fn expire_queue(&mut self) {
        let s = &self.s;
        let cutoff = self.age_cutoff(self.s.clock.wall_ms());
        let gone = s.queue.expire(cutoff);
        self.announce_dropped(DropReason::Expired, gone.iter().map(|id| id.to_string()));
    }

    /// The age limit holds before every send, retries included: events of the front batch that
    /// expired while it waited (retry, `WaitingForUser`) leave as `expired`, never sent. Returns
    /// whether anything is left to send.
    fn drop_expired_from_front(&mut self, wall_ms: i64) -> bool {
        let cutoff = self.age_cutoff(wall_ms);
        let Some(batch) = self.work.front_mut() else {
            return false;
        };
        if batch.events.iter().all(|(e, _)| e.accepted_ms >= cutoff) {
            return true;
        }
        let (expired, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut batch.events)
            .into_iter()
            .partition(|(e, _)| e.accepted_ms < cutoff);
        batch.events = keep;
        let left = !batch.events.is_empty();
        if !left {
            self.work.pop_front();
        }
        if let Err(e) = self.s.queue.drop_expired(&expired) {
            tracing::error!(error = %e, "could not delete expired events from the store");
        }
        self.announce_dropped(
            DropReason::Expired,
            expired.iter().map(|(e, _)| e.id.to_string()),
        );
        left
    }

    /// Names dropped events to the observers (the CLI prints each one); `notice` logs it too.
    fn announce_dropped(&self, reason: DropReason, ids: impl Iterator<Item = String>) {
        let event_ids: Vec<String> = ids.collect();
        if event_ids.is_empty() {
            return;
        }
        self.s.notice(Notice::EventsDropped {
            reason: reason.as_str().to_string(),
            event_ids,
        });
    }

    /// Applies a send's bookkeeping to the front batch: its copies here and the queue's records.
    fn note_front(&mut self, note: SendNote) {
        let Some(batch) = self.work.front_mut() else {
            return;
        };
        for (event, _) in &mut batch.events {
            note.apply(event);
        }
        if let Err(e) = self.s.queue.note_sends(&batch.events, note) {
            tracing::warn!(error = %e, "could not record the send counts");
        }
    }

    /// Takes the next batch in delivery order from memory and store together.
    fn assemble(&mut self) -> Option<Batch> {
        let s = &self.s;
        let limit = s.config.max_batch_events as usize;
        // The first event is always taken, so a limit learned below one event still sends.
        let room = self
            .size_limit
            .bytes()
            .min(s.config.max_batch_bytes)
            .saturating_sub(BATCH_OVERHEAD_BYTES);
        let picked = s.queue.next_batch(limit, room);
        if picked.is_empty() {
            return None;
        }
        Some(Batch::new(picked))
    }

    /// Sends the front batch; `None` when shutdown interrupted it.
    async fn send_front(
        &mut self,
        wall_ms: i64,
    ) -> Option<Result<crate::transport::HttpResponse, TransportError>> {
        let s = self.s.clone();
        let batch = self.work.front_mut()?;
        batch.attempts += 1;
        // Sends of any of its events before this one, plus one: a collector tells a resend from a
        // first send whatever happened in between (reconnect, dismiss, restart, a split).
        let attempt = batch.events.iter().map(|(e, _)| e.sends).max().unwrap_or(0) + 1;
        // Counted before the request goes out, so a crash while it is in flight counts too.
        for (event, _) in &mut batch.events {
            SendNote::Sending.apply(event);
        }
        if let Err(e) = s.queue.note_sends(&batch.events, SendNote::Sending) {
            tracing::warn!(error = %e, "could not record the send counts");
        }
        let mut body = wire::batch_body(batch.events.iter().map(|(e, _)| &*e.json), wall_ms);
        batch.body_bytes = body.len() as u64;
        let mut headers = vec![
            ("Content-Type".to_string(), "application/json".to_string()),
            ("User-Agent".to_string(), USER_AGENT.to_string()),
            ("X-Eventspool-Attempt".to_string(), attempt.to_string()),
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
            max_response_bytes: crate::transport::response_bound(batch.events.len()),
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
        if !matches!(outcome, Outcome::Transient { .. }) && self.probing.take().is_some() {
            // The collector answered the probe: whatever comes next is a new episode.
            self.fresh_episode();
        }
        if matches!(outcome, Outcome::Delivered | Outcome::Partial { .. }) {
            self.size_limit.accepted(batch.body_bytes);
        }
        if matches!(outcome, Outcome::Delivered | Outcome::Partial { .. })
            && let Some(split) = &mut self.split
        {
            for held in split.accepted() {
                self.quarantine_batch(held.batch, reason::BAD_REQUEST, held.detail, held.status);
            }
        }
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
                    let n = batch.events.len();
                    self.split.get_or_insert_with(|| Split::new(n));
                    if too_large {
                        self.size_limit.refused(batch.body_bytes);
                    }
                    self.resend_in_halves(batch);
                } else if too_large {
                    self.size_limit.refused(batch.body_bytes);
                    self.quarantine_batch(batch, reason::TOO_LARGE, detail, status);
                } else {
                    self.lone_refusal(batch, status, detail);
                }
            }
            Outcome::CutShort { failure } => {
                if batch.events.len() > 1 {
                    self.resend_in_halves(batch);
                } else {
                    self.work.push_front(batch);
                    self.transient(failure, None);
                }
            }
            Outcome::Transient {
                failure,
                retry_after_ms,
            } => {
                if let Some(batch) = self.isolate_unanswered(batch, &failure) {
                    self.work.push_front(batch);
                    self.transient(failure, retry_after_ms);
                }
            }
            Outcome::Auth { failure } => self.pause(batch, PauseReason::Auth, failure),
            Outcome::Config { failure } => self.pause(batch, PauseReason::Config, failure),
        }
        if self.work.is_empty()
            && let Some(split) = self.split.take()
        {
            for held in split.finish() {
                self.quarantine_batch(held.batch, reason::BAD_REQUEST, held.detail, held.status);
            }
        }
    }

    /// A lone event refused with 400/422: quarantined, unless the split it came from has had
    /// no request accepted, which may mean the collector (or a proxy) refuses the request.
    fn lone_refusal(&mut self, batch: Batch, status: u16, detail: String) {
        let refused = Refused {
            batch,
            status,
            detail,
        };
        let verdict = match &mut self.split {
            Some(split) => split.lone_refusal(refused),
            None => LoneRefusal::Quarantine(refused),
        };
        match verdict {
            LoneRefusal::Quarantine(r) => {
                self.quarantine_batch(r.batch, reason::BAD_REQUEST, r.detail, r.status)
            }
            LoneRefusal::Held => {}
            LoneRefusal::RequestRefused(all) => {
                let events = self.split.as_ref().map_or(0, Split::events);
                let failure = Failure {
                    status: Some(status),
                    message: format!(
                        "the request is refused, not its events: a batch of {events} split to \
                         single events, none accepted; nothing quarantined (collector: {})",
                        all.last().map_or(String::new(), |r| {
                            crate::classify::status_text(status, r.detail.as_bytes())
                        })
                    ),
                };
                for r in all.into_iter().rev() {
                    self.work.push_front(r.batch);
                }
                let front = self.work.pop_front();
                if let Some(front) = front {
                    self.pause(front, PauseReason::Config, failure);
                }
            }
        }
    }

    /// Puts the two halves of a batch at the front of the work, in order, each as a new batch:
    /// the one bisection step of a 400/413, a cut-short answer and `max_sends` isolation.
    fn resend_in_halves(&mut self, batch: Batch) {
        let mut left = batch.events;
        let right = left.split_off(left.len() / 2);
        self.work.push_front(Batch::new(right));
        self.work.push_front(Batch::new(left));
    }

    fn quarantine_batch(&mut self, batch: Batch, why: &str, detail: String, status: u16) {
        self.quarantine(batch.events, why, detail, Some(status), batch.attempts);
    }

    /// `max_event_sends` (docs/delivery.md §Retry): a request that got no answer, carrying an event
    /// that has now gone unanswered that many times, is bisected like a 400 (no backoff) until the
    /// event is alone. Alone and still unanswered, it is quarantined as `max_sends` when the
    /// collector answered some other request since the isolation began; otherwise the collector may
    /// just be down, so the next batch goes first as a probe (after the usual backoff) and the
    /// event waits behind it. Returns the batch when its failure is an ordinary transient one.
    fn isolate_unanswered(&mut self, batch: Batch, failure: &Failure) -> Option<Batch> {
        let limit = self.s.config.max_event_sends;
        if !self.last_send_unanswered || !batch.events.iter().any(|(e, _)| e.unanswered >= limit) {
            return Some(batch);
        }
        if batch.events.len() > 1 {
            self.isolation.get_or_insert(self.answers);
            self.resend_in_halves(batch);
            return None;
        }
        if self.isolation.is_some_and(|mark| self.answers > mark) {
            let sends = batch.events.first().map_or(0, |(e, _)| e.unanswered);
            let detail = format!("no answer to {sends} requests carrying it; last: {failure}");
            self.quarantine(
                batch.events,
                reason::MAX_SENDS,
                detail,
                None,
                batch.attempts,
            );
            return None;
        }
        self.isolation = Some(self.answers);
        if self.work.is_empty()
            && let Some(probe) = self.assemble()
        {
            self.work.push_back(probe);
        }
        if self.work.is_empty() {
            return Some(batch);
        }
        self.work.insert(1, batch);
        self.transient(failure.clone(), None);
        None
    }

    fn delivered(&mut self, events: Vec<(QueuedEvent, bool)>) {
        if events.is_empty() {
            return;
        }
        let n = events.len() as u64;
        if let Err(e) = self.s.queue.ack(&events) {
            tracing::error!(error = %e, "could not delete delivered events; they may be sent again");
        }
        self.s.counters.left(Exit::Delivered, n);
        self.s
            .counters
            .batches_delivered
            .fetch_add(1, Ordering::Relaxed);
        self.fresh_episode();
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
        if let Err(e) = self.s.queue.quarantine(entries, &events, now) {
            // Without a place to keep them, they stay queued rather than vanish.
            tracing::error!(error = %e, "could not quarantine events; keeping them queued");
            self.s.queue.release(&events);
            return;
        }
        let n = events.len() as u64;
        tracing::warn!(events = n, reason = why, status = ?status, "events quarantined");
        if let Err(e) = self.s.queue.ack(&events) {
            tracing::error!(error = %e, "could not remove quarantined events from the queue");
        }
        self.s.counters.left(Exit::Quarantined, n);
    }

    fn transient(&mut self, failure: Failure, retry_after_ms: Option<u64>) {
        let c = &self.s.config;
        let now = self.s.clock.now_ms();
        if let Some(attempts) = self.probing.take() {
            // A failed probe keeps the state; only the time of the next one moves, further out.
            self.probes_failed += 1;
            tracing::info!(error = %failure, probes = self.probes_failed, "delivery probe failed");
            self.mode = self.waiting_for_user(attempts, failure, now);
            return;
        }
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
            self.rng.f64(),
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
            AfterFailure::WaitForUser { attempts } => self.waiting_for_user(attempts, failure, now),
        };
    }

    /// `WaitingForUser`, with the next slow probe scheduled (docs/delivery.md §Slow probe).
    fn waiting_for_user(&mut self, attempts: u32, failure: Failure, now: u64) -> Mode {
        let c = &self.s.config;
        let delay = probe_delay_ms(
            self.probes_failed + 1,
            c.probe_base_ms,
            c.probe_cap_ms,
            self.rng.f64(),
        );
        Mode::WaitingForUser {
            attempts,
            failure,
            probe_at_ms: now + delay,
        }
    }

    fn pause(&mut self, batch: Batch, reason: PauseReason, failure: Failure) {
        tracing::warn!(error = %failure, reason = reason.as_str(), "delivery paused");
        self.work.push_front(batch);
        self.release_work();
        self.pause = Some((reason, failure.clone()));
        self.mode = Mode::Paused { reason, failure };
    }

    /// Gives the events of unfinished batches (and of a split's held events) back to the queue,
    /// in place.
    fn release_work(&mut self) {
        let held = self.split.take().map(Split::abandon).unwrap_or_default();
        let events: Vec<_> = held
            .into_iter()
            .map(|r| r.batch)
            .chain(self.work.drain(..))
            .flat_map(|b| b.events)
            .collect();
        self.s.queue.release(&events);
    }

    /// After a restart of the worker (a caught panic), nothing is in flight any more.
    fn recover_leases(&mut self) {
        self.s.queue.release_all();
    }
}

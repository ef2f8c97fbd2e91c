//! The delivery worker: one task per spool, the driver of [`crate::machine`]. It gathers the
//! machine's inputs (the app's control verbs, the clock, the queue's batches, the transport's
//! answers classified by [`crate::classify`]) and performs its actions (publish, wait, lease a
//! batch, send it, and the queue calls: ack, quarantine, release, drop). It is the only sender,
//! so batches leave strictly in order and only one is ever in flight.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use crate::classify::{Outcome, classify};
use crate::event::{EventId, QueuedEvent, SendNote};
use crate::fleet::Steer;
use crate::machine::{Action, Events, Input, Jitter, Machine, Policy, send_note, timed_out};
use crate::quarantine::{QuarantinedEvent, Selector};
use crate::shared::Shared;
use crate::state::Notice;
use crate::stats::{DropReason, Exit};
use crate::sync::lock;
use crate::transport::{HttpRequest, HttpResponse, TransportError};
use crate::wire;
use futures_util::future::BoxFuture;

struct Worker {
    s: Arc<Shared>,
    machine: Machine,
    /// The room the machine gave the batch in flight (events and reports; the reports' part is
    /// [`crate::fleet::report_room`] of it).
    room: u64,
    /// The next request's body, built while the request before it was on the wire.
    body_ahead: Option<BodyAhead>,
}

/// A request body built ahead ([`Worker::build_body_ahead`]): the next send takes it when its
/// batch holds exactly these events and carries exactly these reports, in this order. An
/// event's wire JSON never changes after `track()`, so the same seqs make the same body.
struct BodyAhead {
    seqs: Vec<u64>,
    report_ids: Vec<u64>,
    /// The body's JSON bytes before it was encoded.
    json_bytes: u64,
    body: wire::WireBody,
}

pub async fn run(shared: Arc<Shared>) {
    // A peek, not a take: edges the app set before the worker started (a flush() right after
    // open) must still be seen by the loop.
    let control = lock(&shared.control).clone();
    let machine = Machine::new(
        Policy::of(&shared.config),
        Jitter::seeded(shared.jitter_seed),
        shared.clock.now_ms(),
        &control,
    );
    let mut worker = Worker {
        machine,
        s: shared,
        room: 0,
        body_ahead: None,
    };
    worker.recover_leases();
    worker.s.reask_drains();
    worker.run().await;
}

impl Worker {
    async fn run(&mut self) {
        loop {
            let verbs = self.s.take_control();
            let now_ms = self.s.clock.now_ms();
            let actions = self.machine.feed(Input::Control { verbs, now_ms });
            if !self.perform(actions).await {
                return;
            }
            let fleet = Input::Fleet {
                now_ms: self.s.clock.now_ms(),
                report_due: self.s.fleet.report_due(&self.s.counters.snapshot()),
                pause_ms: self.s.fleet.take_pause(self.s.clock.wall_ms()),
            };
            let actions = self.machine.feed(fleet);
            if !self.perform(actions).await {
                return;
            }
            let tick = Input::Tick {
                now_ms: self.s.clock.now_ms(),
                wall_ms: self.s.clock.wall_ms(),
                pending: self.s.counters.pending(),
                flush_at: self.s.flush_at_reached.load(Ordering::SeqCst),
                critical: self.s.critical_waiting.load(Ordering::SeqCst),
                discard_owed: self.s.discard_owed.load(Ordering::SeqCst),
            };
            let actions = self.machine.feed(tick);
            if !self.perform(actions).await {
                return;
            }
        }
    }

    /// Carries out the machine's actions in order, feeding it the answers to its questions (a
    /// batch, a send); `false` once it said stop.
    async fn perform(&mut self, actions: Vec<Action>) -> bool {
        let mut todo = VecDeque::from(actions);
        while let Some(action) = todo.pop_front() {
            if matches!(
                action,
                Action::Wait { .. } | Action::NextBatch { .. } | Action::ProbeBatch { .. }
            ) {
                // The last answer is applied (acked, quarantined, or its batch held for a
                // retry): nothing of this worker is on the wire any more.
                self.s.on_wire.store(false, Ordering::SeqCst);
            }
            let answer = match action {
                Action::Stop => return false,
                Action::Publish { state, deadline_ms } => {
                    self.s.publish(state, deadline_ms);
                    None
                }
                Action::Wait { until_ms } => {
                    if until_ms.is_none_or(|t| t > self.s.clock.now_ms()) {
                        // No delivered row stays on disk while the worker sleeps, the next
                        // request reports everything up to when it leaves, and the store's
                        // first age check runs where no request waits for it.
                        self.s.queue.settle();
                        self.s.fleet.forget_cut_ahead();
                        // Its `sent_at` would be as old as the wait.
                        self.body_ahead = None;
                        self.announce_expired(self.s.queue.expire_first_scan(self.age_cutoff()));
                    }
                    self.wait(until_ms).await;
                    None
                }
                Action::FlushAtSeen => {
                    self.s.flush_at_reached.store(false, Ordering::SeqCst);
                    None
                }
                Action::NextBatch { room_bytes } => {
                    // Cleared before the queue is read: a critical event tracked from here on
                    // sets it again and gets its own turn, one tracked before is in this batch.
                    self.s.critical_waiting.store(false, Ordering::SeqCst);
                    self.expire_queue();
                    let events = self.assemble(room_bytes);
                    // A refused spill (`durability = always`) is told now that the spill lock is free.
                    self.s.deliver_notices();
                    #[cfg(feature = "test-util")]
                    self.s.take_point.taken(events.as_deref()).await;
                    Some(Input::Batch {
                        events,
                        wall_ms: self.s.clock.wall_ms(),
                    })
                }
                Action::ProbeBatch { room_bytes } => {
                    let events = self.assemble(room_bytes);
                    #[cfg(feature = "test-util")]
                    self.s.take_point.taken(events.as_deref()).await;
                    Some(Input::Batch {
                        events,
                        wall_ms: self.s.clock.wall_ms(),
                    })
                }
                Action::Send { attempt, wall_ms } => self.send(attempt, wall_ms).await,
                Action::NoteSends { events, note } => {
                    self.note_sends(&events, note);
                    None
                }
                Action::Ack(events) => {
                    self.delivered(&events);
                    None
                }
                Action::Quarantine {
                    events,
                    reason,
                    detail,
                    status,
                    attempts,
                } => {
                    self.quarantine(events, reason, detail, status, attempts);
                    None
                }
                Action::DropExpired(expired) => {
                    if let Err(e) = self.s.queue.drop_expired(&expired) {
                        tracing::error!(error = %e, "could not delete expired events from the store");
                    }
                    self.announce_dropped(
                        DropReason::Expired,
                        expired.iter().map(|(e, _)| e.id.to_string()),
                    );
                    None
                }
                Action::UnmatchedRejections(n) => {
                    self.s
                        .counters
                        .rejections_unmatched
                        .fetch_add(n, Ordering::Relaxed);
                    tracing::warn!(
                        ids = n,
                        "the collector rejected ids that are in no event of the batch"
                    );
                    None
                }
                Action::Release(events) => {
                    self.s.queue.release(&events);
                    None
                }
                Action::DrainDone { id, outcome } => {
                    self.s.finish_drain(id, outcome);
                    None
                }
                Action::DiscardForConsent => {
                    #[cfg(feature = "test-util")]
                    crate::testing::worker_discard_due(self.s.queue.store_path());
                    self.discard_for_consent();
                    None
                }
            };
            if let Some(input) = answer {
                todo.extend(self.machine.feed(input));
                self.s.counters.slow_link_batch_bytes.store(
                    self.machine.slow_link_batch_bytes().unwrap_or(0),
                    Ordering::Relaxed,
                );
            }
        }
        true
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

    /// Drops every queued event, in memory and in the store, accepted longer than
    /// `max_event_age_ms` ago (the batch in flight is checked by the machine before it is sent).
    /// The deletion the machine decided on after a denial (or a retry of one that failed). Under
    /// the consent verbs' lock, and only while consent is still `Denied`: a grant that came
    /// between the decision and here has finished any owed deletion itself, and what it made
    /// since (its install id, the events tracked under it) is not the denial's to delete.
    fn discard_for_consent(&self) {
        let _one_at_a_time = lock(&self.s.consent_verb);
        if crate::Consent::from_u8(self.s.consent.load(Ordering::SeqCst)) != crate::Consent::Denied
        {
            return;
        }
        // One try at the WAL: the machine asks again if a reader holds it.
        // The worker is not sending: nothing of its own is on the wire.
        match self.s.queue.discard_for_consent(Duration::ZERO, None) {
            Ok(_) => self.s.discard_owed.store(false, Ordering::SeqCst),
            Err(e) => {
                // Owed: the machine asks again while consent stays denied.
                self.s.discard_owed.store(true, Ordering::SeqCst);
                tracing::error!(error = %e, "could not delete the events kept before consent was denied; retrying");
            }
        }
    }

    fn expire_queue(&self) {
        self.announce_expired(self.s.queue.expire(self.age_cutoff()));
    }

    fn announce_expired(&self, gone: Vec<EventId>) {
        self.announce_dropped(DropReason::Expired, gone.iter().map(|id| id.to_string()));
    }

    /// Events accepted before this are past `max_event_age_ms`.
    fn age_cutoff(&self) -> i64 {
        let s = &self.s;
        s.clock
            .wall_ms()
            .saturating_sub(s.config.max_event_age_ms as i64)
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

    /// Takes (leases) the next batch in delivery order from memory and store together, at most
    /// `room` bytes of event JSON.
    fn assemble(&mut self, room: u64) -> Option<Events> {
        // Part of the room goes to the client reports the batch carries (src/fleet).
        self.room = room;
        let room = room - crate::fleet::report_room(room);
        let s = &self.s;
        let limit = s.config.max_batch_events as usize;
        let picked = s.queue.next_batch(limit, room);
        if picked.is_empty() {
            return None;
        }
        Some(picked)
    }

    /// Sends the machine's batch in flight; `None` when shutdown interrupted it. Its answer
    /// becomes the machine's next input: [`Input::Withheld`] when the app said no since the
    /// batch was taken (see [`Shared::send_gate`]).
    async fn send(&mut self, attempt: u32, wall_ms: i64) -> Option<Input> {
        let s = self.s.clone();
        // A denial that came while the worker held this batch covers it, whatever consent says
        // now: withheld, it goes back to the queue, which deletes it.
        if !s.delivery_allowed() || s.queue.spared_by_denial(self.machine.in_flight()) {
            return Some(Input::Withheld {
                now_ms: s.clock.now_ms(),
            });
        }
        self.note_sends(self.machine.in_flight(), SendNote::Sending);
        // What the ledger says since the last report rides with this request (src/fleet).
        s.fleet
            .cut_before_request(&s.queue, s.clock.now_ms(), || s.counters.snapshot());
        let (report_ids, reports) = s.fleet.for_request(crate::fleet::report_room(self.room));
        let ahead = self.body_ahead.take();
        let events = self.machine.in_flight();
        let (body, body_bytes) = match ahead.filter(|a| {
            a.report_ids == report_ids && a.seqs.iter().eq(events.iter().map(|(e, _)| &e.seq))
        }) {
            Some(ahead) => (ahead.body, ahead.json_bytes),
            None => {
                let body = wire::batch_body(
                    events.iter().map(|(e, _)| &*e.json),
                    wall_ms,
                    reports.as_deref(),
                );
                let json_bytes = body.len() as u64;
                (wire::encode_body(&s.config, body), json_bytes)
            }
        };
        let api_key = lock(&s.api_key).clone();
        let request = wire::request_for(&s.config, api_key.as_deref(), body, events.len(), attempt);
        let timeout = request.timeout;
        let mut shutdown = s.shutdown.subscribe();
        let seqs = events.iter().map(|(e, _)| e.seq).collect();
        let result: Result<HttpResponse, TransportError> = match start(&s, request, seqs).await {
            Start::Withheld => {
                return Some(Input::Withheld {
                    now_ms: s.clock.now_ms(),
                });
            }
            Start::Answered(result) => result,
            Start::Started(send) => {
                // Lets the transport's connection task write the request first.
                tokio::task::yield_now().await;
                self.while_on_the_wire();
                if self.back_to_back() {
                    self.body_ahead = self.build_body_ahead();
                }
                let send = tokio::time::timeout(timeout + Duration::from_millis(250), send);
                tokio::select! {
                    result = send => result.unwrap_or(Err(TransportError::Timeout)),
                    _ = shutdown.wait_for(|stop| *stop) => return None,
                }
            }
        };
        let now_ms = s.clock.now_ms();
        let outcome = classify(&result, SystemTime::now());
        if let (Ok(response), Outcome::Delivered | Outcome::Partial { .. }) = (&result, &outcome) {
            let steer = s.fleet.answered(
                &s.queue,
                &report_ids,
                &response.body,
                (s.clock.wall_ms(), s.clock.now_ms()),
            );
            self.steer(steer);
        }
        Some(Input::Answer {
            now_ms,
            note: send_note(&result),
            outcome,
            body_bytes,
            timed_out: timed_out(&result),
        })
    }

    /// A directive's one-shot actions (src/fleet): they touch only the quarantine. Redriven
    /// events keep their ids and go out with the next batches.
    fn steer(&self, steer: Steer) {
        let s = &self.s;
        for reason in &steer.redrive {
            let selector = Selector::Reason(reason.clone());
            match s
                .queue
                .redrive(&selector, s.clock.wall_ms(), || s.next_seq())
            {
                Ok(n) => tracing::info!(reason, events = n, "redriven by a collector directive"),
                Err(e) => tracing::warn!(error = %e, reason, "directive redrive failed"),
            }
        }
        for reason in &steer.purge_quarantine {
            match s.queue.quarantine_purge(&Selector::Reason(reason.clone())) {
                Ok(n) => {
                    s.fleet.count_quarantine_purged(n);
                    tracing::info!(
                        reason,
                        events = n,
                        "quarantine purged by a collector directive"
                    );
                }
                Err(e) => tracing::warn!(error = %e, reason, "directive purge failed"),
            }
        }
        if !steer.redrive.is_empty() {
            s.control(|c| c.flush = true);
        }
    }

    /// Records a send's bookkeeping for events that stay queued.
    fn note_sends(&self, events: &[(QueuedEvent, bool)], note: SendNote) {
        if let Err(e) = self.s.queue.note_sends(events, note) {
            tracing::warn!(error = %e, "could not record the send counts");
        }
    }

    /// The store's work between two requests, done while the second is on the wire (decisions
    /// 0069, 0077), so that draining a backlog does not wait for it between an answer and the
    /// next request: the next batch's rows read ahead (store/read_ahead.rs), the rows the last
    /// answer delivered deleted and the next batch's send recorded (store/in_flight.rs), and
    /// its report cut (src/fleet). The transport has handed the request to its HTTP stack by
    /// now, so the collector works on it meanwhile.
    fn while_on_the_wire(&self) {
        let s = &self.s;
        s.queue
            .beside_the_request(s.config.max_batch_events as usize, self.back_to_back());
        s.fleet
            .cut_ahead(&s.queue, &s.counters.snapshot(), s.clock.now_ms());
    }

    /// Whether a drain's next request follows the answer at once: no pause between batches
    /// (`min_batch_interval_ms` 0). Only then is the next send recorded and its body built
    /// while a request is on the wire. Behind the throttle (1 s by default) nothing would be
    /// gained, the body would be thrown away at the pause, and a crash in the pause would
    /// count a send on rows that had not left (decision 0077).
    fn back_to_back(&self) -> bool {
        self.s.config.min_batch_interval_ms == 0
    }

    /// The next request's body, built while this one is on the wire, when the next batch can
    /// be told now (a drain of stored rows: [`crate::queue::Queue::next_batch_ahead`]) and the
    /// same room is given to it: its events and reports, with `sent_at` now, encoded. A drain
    /// with gzip on compressed each body between an answer and the next request, with the
    /// collector idle. The next send takes it only if its batch and reports are these
    /// exactly; `sent_at` is then earlier than the send by at most this request.
    fn build_body_ahead(&self) -> Option<BodyAhead> {
        let s = &self.s;
        let report_room = crate::fleet::report_room(self.room);
        let (report_ids, reports) = s.fleet.for_request(report_room);
        let wall_ms = s.clock.wall_ms();
        let limit = s.config.max_batch_events as usize;
        let (seqs, json) = s
            .queue
            .next_batch_ahead(limit, self.room - report_room, |events| {
                let json =
                    wire::batch_body(events.iter().map(|e| &*e.json), wall_ms, reports.as_deref());
                (events.iter().map(|e| e.seq).collect(), json)
            })?;
        Some(BodyAhead {
            seqs,
            report_ids,
            json_bytes: json.len() as u64,
            // Encoded with no lock held: the gzip is most of the work.
            body: wire::encode_body(&s.config, json),
        })
    }

    /// Delivered events leave the queue; their rows are deleted while the next request is on
    /// the wire ([`Worker::while_on_the_wire`]).
    fn delivered(&self, events: &[(QueuedEvent, bool)]) {
        let n = events.len() as u64;
        if let Err(e) = self.s.queue.delivered(events) {
            tracing::error!(error = %e, "could not delete delivered events; they may be sent again");
        }
        self.s.counters.left(Exit::Delivered, n);
        self.s
            .counters
            .batches_delivered
            .fetch_add(1, Ordering::Relaxed);
    }

    fn quarantine(
        &self,
        events: Events,
        why: &str,
        detail: String,
        status: Option<u16>,
        attempts: u32,
    ) {
        // A denial that came while they were on the wire deleted every dead letter: these go
        // the same way.
        let events = self.s.queue.drop_spared(events);
        if events.is_empty() {
            return;
        }
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
        self.s.fleet.count_quarantined(why, n);
        tracing::warn!(events = n, reason = why, status = ?status, "events quarantined");
        if let Err(e) = self.s.queue.ack(&events) {
            tracing::error!(error = %e, "could not remove quarantined events from the queue");
        }
        self.s.counters.left(Exit::Quarantined, n);
    }

    /// After a restart of the worker (a caught panic), nothing is in flight any more.
    fn recover_leases(&mut self) {
        self.s.queue.release_all();
    }
}

/// How a request's start went: withheld (the app said no), or handed to the transport, which
/// answered at once or is still at it.
enum Start {
    Withheld,
    Answered(Result<HttpResponse, TransportError>),
    Started(BoxFuture<'static, Result<HttpResponse, TransportError>>),
}

/// Starts the request under the read side of [`Shared::send_gate`]: the check that consent and
/// the opt-out allow it and the transport's first step (its first poll, where a transport hands
/// the request to its HTTP stack) happen while neither `set_consent` nor `set_enabled` can
/// change them, so once either has returned no request of this spool starts.
async fn start(s: &Shared, request: HttpRequest, seqs: Vec<u64>) -> Start {
    let mut request = Some(request);
    let mut seqs = Some(seqs);
    std::future::poll_fn(|cx| {
        let _gate = s.send_gate.read();
        let Some(request) = request.take().filter(|_| s.delivery_allowed()) else {
            return Poll::Ready(Start::Withheld);
        };
        s.counters.requests.fetch_add(1, Ordering::Relaxed);
        *lock(&s.wire_seqs) = seqs.take().unwrap_or_default();
        s.on_wire.store(true, Ordering::SeqCst);
        let mut send = s.transport.send(request);
        Poll::Ready(match send.as_mut().poll(cx) {
            Poll::Ready(result) => Start::Answered(result),
            Poll::Pending => Start::Started(send),
        })
    })
    .await
}

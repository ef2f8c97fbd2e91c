//! What splitting a refused batch teaches, as plain data the delivery machine
//! (`src/machine.rs`) carries out.
//!
//! A 400/422 for a batch means "something in here is bad", and the SDK halves the batch until
//! the bad events stand alone (docs/protocol.md §Responses). But a proxy in front of the collector
//! can refuse every request for a reason that has nothing to do with the events (nginx's "400
//! Request Header Or Cookie Too Large" for an oversize API key): halving then costs 2N−2 requests
//! and quarantines every event. The tell is that nothing of the split is ever accepted. [`Split`]
//! keeps that evidence: a lone event refused before any request of the split was accepted is
//! held, not quarantined; its sibling is sent next; the first accepted request releases the held
//! events to the quarantine (the collector takes requests, so their refusal is about them), and
//! a second lone refusal with none accepted means the request itself is refused: pause, with
//! every event still queued, after about log2(N) + 2 requests. A refused batch of one event
//! starts a split of its own, and a held event whose pieces are all answered waits on: the next
//! batch is its sibling, so the verdict does not depend on how the queue was cut into batches
//! (decision 0071); with nothing else pending it is judged alone, where a 413 for a body under
//! [`MIN_LEARNED_BYTES`] still tells that every body is refused.
//!
//! A 413 teaches a size: a proxy's `client_max_body_size` refuses every batch above it, so
//! starting each new batch at the full `max_batch_bytes` again costs one refused upload per
//! batch. [`SizeLimit`] remembers the size that was accepted for the life of the spool and grows
//! back slowly (see its rule).
//!
//! A timeout teaches a size too: on a slow uplink a batch that takes longer to go up than the
//! link stays quiet is cut by no stall timeout, but one that stalls (the link, or the bytes
//! it buffers, cannot move within `attempt_timeout_ms`) is sent again smaller. The same
//! [`SizeLimit`] rule with [`SizeLimit::for_stalls`]: a timeout of a body above
//! [`STALL_MIN_BODY_BYTES`] halves the next batches (down to about one event), successes grow
//! them back, sooner than after a 413, and the machine forgets it with the link it was learned
//! on (a reconnect starts afresh).

/// Lone events refused before any request of the split was accepted that are held as suspects;
/// one more such refusal pauses delivery. One suspect lets a poison event at the very head of a
/// batch (reached before any sibling could be accepted) still be isolated; two lone refusals in
/// a row with no request accepted are what a request-level refusal looks like.
pub const HELD_BEFORE_PAUSE: usize = 1;

/// The progress of one split, from the first refused multi-event batch until its last piece is
/// answered. `T` is what the worker needs to quarantine a held event later.
#[derive(Debug)]
pub struct Split<T> {
    events: usize,
    accepted: bool,
    held: Vec<T>,
}

/// What to do with a lone event the collector refused with 400/422 during a split.
#[derive(Debug, PartialEq, Eq)]
pub enum LoneRefusal<T> {
    /// A request of this split was accepted: the event itself is refused; quarantine it.
    Quarantine(T),
    /// Nothing accepted yet: keep it aside and send the next piece.
    Held,
    /// Nothing accepted and lone events refused again: the request is refused, not the events.
    /// These are the held items and this one, to give back to the queue.
    RequestRefused(Vec<T>),
}

impl<T> Split<T> {
    /// A split of a refused batch of `events` events.
    pub fn new(events: usize) -> Split<T> {
        Split {
            events,
            accepted: false,
            held: Vec::new(),
        }
    }

    /// Events sent under this split: the batch whose refusal started it and the batches that
    /// joined it as a held event's sibling.
    pub fn events(&self) -> usize {
        self.events
    }

    /// A new batch goes out as the sibling of a held event (the pieces were all answered, or
    /// the refused batch held one event): its answer counts as the split's.
    pub fn joined(&mut self, events: usize) {
        self.events += events;
    }

    /// Whether a lone refused event waits for a sibling's answer.
    pub fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// A request of the split was accepted (2xx): returns the held events, now known to be
    /// refused for what they are.
    pub fn accepted(&mut self) -> Vec<T> {
        self.accepted = true;
        std::mem::take(&mut self.held)
    }

    pub fn lone_refusal(&mut self, item: T) -> LoneRefusal<T> {
        if self.accepted {
            return LoneRefusal::Quarantine(item);
        }
        if self.held.len() < HELD_BEFORE_PAUSE {
            self.held.push(item);
            return LoneRefusal::Held;
        }
        let mut all = std::mem::take(&mut self.held);
        all.push(item);
        LoneRefusal::RequestRefused(all)
    }

    /// Nothing more to send as a sibling: the events still held are judged alone, quarantined
    /// as the collector asked.
    pub fn finish(self) -> Vec<T> {
        self.held
    }

    /// The split is abandoned (pause, offline, dismiss): the held events go back to the queue.
    pub fn abandon(self) -> Vec<T> {
        self.held
    }
}

/// The smallest body size 413s may teach (or `max_batch_bytes`, if smaller): below it a 413 is
/// not a size limit any real proxy has (nginx's `client_max_body_size` is counted in KiB and
/// defaults to a MiB), but a proxy or a collector refusing every body, which the split shows
/// and pauses on (see [`Split`]), instead of a limit that falls to a few bytes and sends every
/// event alone.
pub const MIN_LEARNED_BYTES: u64 = 1024;

/// Accepted batches at the remembered size before it may grow by an eighth.
pub const GROW_AFTER_ACCEPTED: u32 = 16;
/// The longest wait between growth steps, in accepted batches: a limit that has been found
/// again and again is still tried now and then, in case the proxy was reconfigured.
pub const MAX_GROW_AFTER_ACCEPTED: u32 = 1024;

/// Timeouts of bodies up to this size teach nothing: a few KB go up in seconds even on a
/// 2 KB/s link, so a timeout of one is a dead link or collector, which backoff and the probe
/// handle, not a batch too large for the link.
pub const STALL_MIN_BODY_BYTES: u64 = 4 * 1024;
/// As [`GROW_AFTER_ACCEPTED`] and [`MAX_GROW_AFTER_ACCEPTED`] for sizes taught by timeouts: a
/// mobile link's speed changes within minutes, a proxy's limit hardly ever.
pub const STALL_GROW_AFTER_ACCEPTED: u32 = 4;
pub const STALL_MAX_GROW_AFTER_ACCEPTED: u32 = 64;

/// How fast a [`SizeLimit`] grows back, by what taught it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Growth {
    after: u32,
    max_after: u32,
}

/// The largest request body (bytes before compression, as `max_batch_bytes` counts them) that
/// a new batch may have, learned from 413 answers.
///
/// The rule, in the spirit of SDKs that halve their batch cap on a 413 and keep it:
/// - a 413 for a body of `b` bytes sets the limit to the largest body accepted since, if it is
///   smaller than `b`, else to `b / 2` (the split halves are that size), never below
///   [`MIN_LEARNED_BYTES`];
/// - every [`GROW_AFTER_ACCEPTED`] accepted batches of at least half the limit let it grow by an
///   eighth, up to `max_batch_bytes` again (then it is forgotten);
/// - a 413 after such a growth step doubles the number of accepted batches the next step waits
///   for (up to [`MAX_GROW_AFTER_ACCEPTED`]), so a proxy's fixed limit costs a few refused
///   requests over the life of the spool, not one per batch, while a limit that was lifted is
///   found again.
///
/// The proxy counts bytes on the wire; with `compression = none` those are the bytes counted
/// here, and with gzip the ratio between the two is steady enough from one batch to the next
/// for the same rule to converge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeLimit {
    configured: u64,
    limit: u64,
    accepted_max: u64,
    streak: u32,
    grow_after: u32,
    growth: Growth,
}

impl SizeLimit {
    /// The limit 413s teach, starting at the configured `max_batch_bytes`.
    pub fn new(max_batch_bytes: u64) -> SizeLimit {
        SizeLimit::growing(
            max_batch_bytes,
            Growth {
                after: GROW_AFTER_ACCEPTED,
                max_after: MAX_GROW_AFTER_ACCEPTED,
            },
        )
    }

    /// The limit timeouts teach ([`SizeLimit::timed_out`]), starting at `max_batch_bytes`.
    pub fn for_stalls(max_batch_bytes: u64) -> SizeLimit {
        SizeLimit::growing(
            max_batch_bytes,
            Growth {
                after: STALL_GROW_AFTER_ACCEPTED,
                max_after: STALL_MAX_GROW_AFTER_ACCEPTED,
            },
        )
    }

    fn growing(max_batch_bytes: u64, growth: Growth) -> SizeLimit {
        SizeLimit {
            configured: max_batch_bytes,
            limit: max_batch_bytes,
            accepted_max: 0,
            streak: 0,
            grow_after: growth.after,
            growth,
        }
    }

    /// The body size a new batch may have now.
    pub fn bytes(&self) -> u64 {
        self.limit
    }

    /// The size learned, if it is below the configured one.
    pub fn learned(&self) -> Option<u64> {
        (self.limit < self.configured).then_some(self.limit)
    }

    /// An attempt with a body of `body_bytes` timed out: as a 413 for it, above
    /// [`STALL_MIN_BODY_BYTES`].
    pub fn timed_out(&mut self, body_bytes: u64) {
        if body_bytes > STALL_MIN_BODY_BYTES {
            self.refused(body_bytes);
        }
    }

    /// A 413 for a body of `body_bytes`.
    pub fn refused(&mut self, body_bytes: u64) {
        if body_bytes > self.limit {
            // A lone event over the limit: it says nothing about the batches that fit.
            return;
        }
        if self.accepted_max >= body_bytes {
            // The limit went down since: what was accepted before no longer tells.
            self.accepted_max = 0;
        }
        let grown = self.limit < self.configured && self.accepted_max > 0;
        if grown {
            self.grow_after = self.grow_after.saturating_mul(2).min(self.growth.max_after);
        }
        let learned = if self.accepted_max > 0 {
            self.accepted_max
        } else {
            body_bytes / 2
        };
        self.limit = learned.max(MIN_LEARNED_BYTES.min(self.configured)).max(1);
        self.streak = 0;
    }

    /// A 2xx for a body of `body_bytes`.
    pub fn accepted(&mut self, body_bytes: u64) {
        self.accepted_max = self.accepted_max.max(body_bytes);
        if self.limit >= self.configured || body_bytes < self.limit / 2 {
            return;
        }
        self.streak += 1;
        if self.streak >= self.grow_after {
            self.streak = 0;
            self.limit = (self.limit + self.limit / 8).min(self.configured);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request counts of a drain behind a fixed limit, batches cut at the current limit.
    fn drain(limit_on_wire: u64, batches: usize, full_batch: u64) -> (usize, usize, SizeLimit) {
        let mut size = SizeLimit::new(512 * 1024);
        let (mut ok, mut refused) = (0, 0);
        let mut pending: Vec<u64> = Vec::new();
        for _ in 0..batches {
            pending.push(full_batch.min(size.bytes()));
            while let Some(b) = pending.pop() {
                if b > limit_on_wire {
                    refused += 1;
                    size.refused(b);
                    pending.push(b / 2);
                    pending.push(b - b / 2);
                } else {
                    ok += 1;
                    size.accepted(b);
                }
            }
        }
        (ok, refused, size)
    }

    #[test]
    fn a_fixed_limit_costs_a_few_refusals_not_one_per_batch() {
        let (ok, refused, size) = drain(16 * 1024, 200, 28_000);
        assert!(size.bytes() <= 16 * 1024, "{size:?}");
        assert!(
            size.bytes() >= 12 * 1024,
            "stays close to the limit: {size:?}"
        );
        assert!(refused * 20 <= ok, "{refused} refused for {ok} accepted");
    }

    #[test]
    fn the_first_refusal_halves_and_a_refused_growth_returns_to_what_was_accepted() {
        let mut size = SizeLimit::new(100_000);
        size.refused(80_000);
        assert_eq!(size.bytes(), 40_000);
        for _ in 0..GROW_AFTER_ACCEPTED {
            size.accepted(40_000);
        }
        assert_eq!(size.bytes(), 45_000);
        size.refused(45_000);
        assert_eq!(size.bytes(), 40_000, "back to the size that was accepted");
        for _ in 0..GROW_AFTER_ACCEPTED {
            size.accepted(40_000);
        }
        assert_eq!(size.bytes(), 40_000, "the next step waits twice as long");
        for _ in 0..GROW_AFTER_ACCEPTED {
            size.accepted(40_000);
        }
        assert_eq!(size.bytes(), 45_000);
    }

    #[test]
    fn a_lifted_limit_is_grown_back_to_the_configured_size_and_forgotten() {
        let mut size = SizeLimit::new(100_000);
        size.refused(100_000);
        for _ in 0..10_000 {
            let b = size.bytes();
            size.accepted(b);
        }
        assert_eq!(
            size,
            SizeLimit {
                accepted_max: 100_000,
                ..SizeLimit::new(100_000)
            }
        );
    }

    #[test]
    fn small_batches_and_oversize_lone_events_teach_nothing() {
        let mut size = SizeLimit::new(100_000);
        size.refused(60_000);
        let learned = size.clone();
        for _ in 0..100 {
            size.accepted(1_000);
        }
        assert_eq!(
            size.bytes(),
            learned.bytes(),
            "small batches do not grow it"
        );
        size.refused(90_000);
        assert_eq!(
            size.bytes(),
            learned.bytes(),
            "a lone event above the limit"
        );
    }

    #[test]
    fn a_lower_limit_than_before_is_learned_afresh() {
        let mut size = SizeLimit::new(100_000);
        size.refused(100_000);
        size.accepted(50_000);
        size.refused(40_000);
        assert_eq!(size.bytes(), 20_000);
    }

    #[test]
    fn timeouts_of_large_bodies_halve_down_to_about_one_event_and_successes_grow_back() {
        let mut size = SizeLimit::for_stalls(512 * 1024);
        size.timed_out(110_000);
        assert_eq!(size.learned(), Some(55_000));
        for _ in 0..10 {
            size.timed_out(size.bytes());
        }
        assert_eq!(size.bytes(), 3_437, "110,000 halved five times");
        assert!(size.bytes() <= STALL_MIN_BODY_BYTES && size.bytes() >= MIN_LEARNED_BYTES);
        let floor = size.clone();
        size.timed_out(size.bytes());
        assert_eq!(size, floor, "a timeout of a few KB teaches nothing");
        for _ in 0..10_000 {
            let b = size.bytes();
            size.accepted(b);
            if size.learned().is_none() {
                break;
            }
        }
        assert_eq!(size.learned(), None, "grown back: {size:?}");
        let mut grow = SizeLimit::for_stalls(512 * 1024);
        grow.timed_out(100_000);
        for _ in 0..STALL_GROW_AFTER_ACCEPTED {
            grow.accepted(50_000);
        }
        assert_eq!(grow.bytes(), 56_250, "an eighth after a few successes");
    }

    #[test]
    fn a_refusal_of_every_request_pauses_on_the_second_lone_event() {
        let mut split = Split::new(100);
        assert_eq!(split.lone_refusal("e0"), LoneRefusal::Held);
        assert_eq!(
            split.lone_refusal("e1"),
            LoneRefusal::RequestRefused(vec!["e0", "e1"])
        );
    }

    #[test]
    fn an_accepted_sibling_releases_the_held_event_to_the_quarantine() {
        let mut split = Split::new(100);
        assert_eq!(split.lone_refusal("e0"), LoneRefusal::Held);
        assert_eq!(split.accepted(), vec!["e0"]);
        assert_eq!(split.lone_refusal("e7"), LoneRefusal::Quarantine("e7"));
        assert_eq!(split.lone_refusal("e8"), LoneRefusal::Quarantine("e8"));
        assert!(split.finish().is_empty());
    }

    #[test]
    fn after_an_acceptance_every_lone_refusal_is_quarantined() {
        let mut split = Split::new(4);
        assert!(split.accepted().is_empty());
        assert_eq!(split.lone_refusal(1), LoneRefusal::Quarantine(1));
    }

    #[test]
    fn held_events_are_given_back_or_quarantined_at_the_end() {
        let mut split = Split::new(3);
        assert_eq!(split.lone_refusal("e0"), LoneRefusal::Held);
        assert_eq!(split.abandon(), vec!["e0"]);
        let mut split = Split::new(3);
        assert_eq!(split.lone_refusal("e0"), LoneRefusal::Held);
        assert_eq!(split.finish(), vec!["e0"]);
        assert_eq!(Split::<u8>::new(5).events(), 5);
    }
}

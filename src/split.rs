//! What splitting a refused batch teaches, as plain data the worker carries out.
//!
//! A 400/422 for a batch means "something in here is bad", and the SDK halves the batch until
//! the bad events stand alone (DESIGN §3). But a proxy in front of the collector can refuse
//! every request for a reason that has nothing to do with the events (nginx's "400 Request
//! Header Or Cookie Too Large" for an oversize API key): halving then costs 2N−2 requests and
//! quarantines every event. The tell is that nothing of the split is ever accepted. [`Split`]
//! keeps that evidence: a lone event refused before any request of the split was accepted is
//! held, not quarantined; its sibling is sent next; the first accepted request releases the held
//! events to the quarantine (the collector takes requests, so their refusal is about them), and
//! a second lone refusal with none accepted means the request itself is refused: pause, with
//! every event still queued, after about log2(N) + 2 requests.

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

    /// Events in the batch whose refusal started the split.
    pub fn events(&self) -> usize {
        self.events
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

    /// Every piece is answered: events still held were refused while the collector answered
    /// the other pieces with a verdict of their own (a 413 for a lone event), so they are
    /// quarantined as the collector asked.
    pub fn finish(self) -> Vec<T> {
        self.held
    }

    /// The split is abandoned (pause, offline, dismiss): the held events go back to the queue.
    pub fn abandon(self) -> Vec<T> {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

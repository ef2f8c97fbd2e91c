//! Rows for the orderings the worker really produces and for answers from a network that is
//! wrong rather than down: a server's `Retry-After` that outlives the episode it came in, a
//! collector's pause shown as a state, a proxy that refuses every body as too large, and a slow
//! probe that stays one request.

use super::*;

/// `Retry-After` above the retry budget, and a probe answered with one: no automatic request
/// before the server's time (capped at `retry_after_cap_ms`).
fn long_retry_after() -> Policy {
    Policy {
        retry_after_cap_ms: 300_000,
        max_retry_elapsed_ms: 100_000,
        ..policy()
    }
}

/// docs/delivery.md §Slow probe: the probe waits for a server's `Retry-After` too.
#[test]
fn retry_after_holds_the_probe() {
    let rows = [
        // A 503 asking for 120 s ends the budget at once: the probe waits for the server.
        row(
            sending(3),
            RetryAfter(503, 120),
            &["note answered 3"],
            "waiting_for_user 0 +120000 ep1",
        ),
        // A probe answered `Retry-After: 250` goes no sooner than that.
        row(
            probing(),
            RetryAfter(503, 250),
            &["note answered 3"],
            "waiting_for_user 3 +250000 ep4",
        ),
        // One shorter than the probe's own delay changes nothing.
        row(
            probing(),
            RetryAfter(503, 10),
            &["note answered 3"],
            "waiting_for_user 3 +120000 ep4",
        ),
    ];
    assert_eq!(drive(long_retry_after(), &rows), rows.len());
}

/// "No verb except `retry_now()` sends before a server's `Retry-After`": a fresh episode
/// (foreground, a reconnect, the conditions allowing again, a flush after `dismiss()`) keeps it.
#[test]
fn retry_after_outlives_a_fresh_episode() {
    let asked_50s = || then(sending(3), &[RetryAfter(503, 50)]);
    let rows = [
        row(
            then(asked_50s(), &[Foreground(false), Foreground(true)]),
            Tick,
            &["publish deferred collector +50000", "wait +50000"],
            "sending held +50000",
        ),
        row(
            then(asked_50s(), &[Online(false), Online(true)]),
            Tick,
            &["publish deferred collector +50000", "wait +50000"],
            "sending held +50000",
        ),
        row(
            then(asked_50s(), &[Metered(true), Metered(false)]),
            Tick,
            &["publish deferred collector +50000", "wait +50000"],
            "sending held +50000",
        ),
        row(
            then(asked_50s(), &[Dismiss, Flush]),
            Tick,
            &["publish deferred collector +50000", "wait +50000"],
            "sending held +50000",
        ),
        row(
            then(asked_50s(), &[Dismiss]),
            TickFlushAt,
            &["publish idle", "wait +10000"],
            "idle held +50000",
        ),
        // The time passes: the send goes.
        row(
            then(asked_50s(), &[Dismiss, Flush]),
            TickAfter(50_000),
            &["next batch <=524224"],
            "sending",
        ),
        // retry_now() is the user's word: it goes now, from every state the hold shows in.
        row(
            then(asked_50s(), &[Dismiss, RetryNow]),
            Tick,
            &["next batch <=524224"],
            "sending held +50000",
        ),
        row(
            then(asked_50s(), &[Dismiss, Flush, Tick, RetryNow]),
            Tick,
            &["next batch <=524224"],
            "sending held +50000",
        ),
        row(
            then(asked_50s(), &[RetryNow]),
            Tick,
            &["publish sending", "send 3 #2"],
            "sending held +50000 ep1",
        ),
        // A bounded drain meanwhile is told when the next request can go.
        row(
            then(asked_50s(), &[Dismiss]),
            Drain(5_000),
            &["flush_at seen", "drain 1 retry_after +50000"],
            "sending held +50000",
        ),
        // An answer that is not transient ends the hold.
        row(
            then(asked_50s(), &[RetryNow, Tick]),
            Status(200),
            &["ack 3"],
            "sending",
        ),
    ];
    assert_eq!(drive(policy(), &rows), rows.len());
}

/// A collector's `pause_until` is a state a UI can word: `Deferred{collector}` while events
/// wait, and a bounded drain is told when it ends.
#[test]
fn a_collector_pause_is_a_visible_state() {
    let rows = [
        row(
            vec![PauseFor(5_000)],
            TickFlushAt,
            &["publish deferred collector +5000", "wait +5000"],
            "idle held +5000",
        ),
        row(
            vec![PauseFor(5_000), Flush],
            Tick,
            &["publish deferred collector +5000", "wait +5000"],
            "sending held +5000",
        ),
        // Nothing pending: idle as ever (a drained spool is a drained spool).
        row(
            vec![PauseFor(5_000)],
            TickEmpty,
            &["publish idle", "wait"],
            "idle held +5000",
        ),
        row(
            vec![PauseFor(30_000)],
            Drain(5_000),
            &["flush_at seen", "drain 1 retry_after +30000"],
            "sending held +30000",
        ),
        // retry_now() does not break a collector's pause (only a server's Retry-After).
        row(
            vec![PauseFor(5_000), Flush, Tick, RetryNow],
            Tick,
            &["publish deferred collector +5000", "wait +5000"],
            "sending held +5000",
        ),
    ];
    assert_eq!(drive(policy(), &rows), rows.len());
}

/// A proxy answering 413 to every body: the split goes down to one event, nothing is accepted,
/// and the spool pauses with every event still queued instead of quarantining them all.
#[test]
fn too_large_for_every_body_pauses() {
    let down_to_one = || then(sending(4), &[Status(413), Tick, Status(413), Tick]);
    let rows = [
        // The first lone refusal with nothing accepted is held; its sibling goes next.
        row(down_to_one(), Status(413), &["note answered 1"], "sending"),
        row(
            then(down_to_one(), &[Status(413)]),
            Tick,
            &["publish sending", "send 1 #3"],
            "sending",
        ),
        row(
            then(down_to_one(), &[Status(413), Tick]),
            Status(413),
            &["note answered 1", "release 4"],
            "paused config",
        ),
        // The sibling, as large, accepted: the 413 was not about the held event's size; it
        // goes again (the quarantine after a second 413: `bisection`).
        row(
            then(down_to_one(), &[Status(413), Tick]),
            Status(200),
            &["ack 1", THEN_TICK, "publish sending", "send 1 #4"],
            "sending",
        ),
        // resume(): the learned size is forgotten with the pause.
        row(
            then(down_to_one(), &[Status(413), Tick, Status(413), Resume]),
            Tick,
            &["next batch <=524224"],
            "sending",
        ),
    ];
    assert_eq!(drive(policy(), &rows), rows.len());
}

/// The learned size has a floor: a run of 413s for small bodies does not teach a limit no
/// real proxy has.
#[test]
fn the_learned_size_has_a_floor() {
    let mut rig = Rig::new(policy());
    for step in then(sending(2), &[Status(413), Tick, Status(413)]) {
        rig.input(&step);
    }
    assert_eq!(rig.m.size_limit.bytes(), crate::split::MIN_LEARNED_BYTES);
}

/// docs/delivery.md §Slow probe: one probe is one request, also when it isolates an event past
/// `max_event_sends`.
#[test]
fn one_probe_is_one_request() {
    let p = Policy {
        max_event_sends: 2,
        max_auto_attempts: 0,
        ..policy()
    };
    // One unanswered send hands over at once; the probe is the second.
    let probe_of = |n| then(sending(n), &[Timeout, Fire, Tick]);
    let rows = [
        row(
            sending(2),
            Timeout,
            &[
                "then tick:",
                "publish waiting_for_user 0 +60000",
                "wait +60000",
            ],
            "waiting_for_user 0 +60000 ep1",
        ),
        // Unanswered past the limit: halved, and the halves wait for the next slot.
        row(
            probe_of(2),
            Timeout,
            &[
                "then tick:",
                "publish waiting_for_user 0 +120000",
                "wait +120000",
            ],
            "waiting_for_user 0 +120000 ep1",
        ),
        row(
            then(probe_of(2), &[Timeout]),
            Tick,
            &["publish waiting_for_user 0 +120000", "wait +120000"],
            "waiting_for_user 0 +120000 ep1",
        ),
        row(
            then(probe_of(2), &[Timeout, Fire]),
            Tick,
            &["send 1 #3"],
            "probing ep1",
        ),
        // Alone and unanswered after another request was answered: quarantined, and the next
        // request waits for the next slot.
        row(
            then(probe_of(2), &[Timeout, Fire, Tick, Status(503), Fire, Tick]),
            Timeout,
            &["quarantine max_sends 1"],
            "waiting_for_user 0 +480000 ep1",
        ),
    ];
    assert_eq!(drive(p, &rows), rows.len());
}

/// The orderings the worker produces around the app's verbs: it takes the app's controls only
/// at the top of its loop, so a verb lands either between taking a batch and sending it (the
/// worker then withholds the send: README §Consent) or while the request is on the wire, and
/// then the answer comes before the control.
#[test]
fn verbs_between_a_batch_and_its_send_and_answers_before_controls() {
    let taken = || then(asked(), &[Batch(3)]);
    let rows = [
        // Denied (or opted out) after the batch was taken: the send is withheld, its count
        // taken back, the batch given back...
        row(taken(), Withheld, &["note not_sent 3", "release 3"], "idle"),
        // ...and the control that follows discards it with the rest.
        row(
            then(taken(), &[Withheld]),
            SetConsent(Consent::Denied),
            &["discard for consent"],
            "disabled",
        ),
        row(
            then(taken(), &[Withheld]),
            Enabled(false),
            &["then tick:", "publish disabled", "wait"],
            "disabled",
        ),
        row(
            then(taken(), &[Withheld, Enabled(false)]),
            Tick,
            &["publish disabled", "wait"],
            "disabled",
        ),
        // The next send of those events is still their first.
        row(
            then(
                taken(),
                &[Withheld, Enabled(false), Enabled(true), Flush, Tick],
            ),
            Batch(3),
            &["publish sending", "send 3 #1"],
            "sending",
        ),
        // A withheld probe leaves nothing of the probe behind.
        row(
            then(probing(), &[Withheld, SetConsent(Consent::Pending)]),
            Tick,
            &["publish deferred consent", "wait"],
            "deferred consent",
        ),
        // The request was on the wire when the app denied: its answer comes first. Delivered:
        // acked; the control then discards the rest.
        row(sending(3), Status(200), &["ack 3"], "sending"),
        row(
            then(sending(3), &[Status(200)]),
            SetConsent(Consent::Denied),
            &["discard for consent"],
            "disabled",
        ),
        // Failed: the batch waits for its retry, and the control gives it back to be deleted.
        row(
            then(sending(3), &[Status(503)]),
            SetConsent(Consent::Denied),
            &["release 3", "discard for consent"],
            "disabled",
        ),
        row(
            then(sending(3), &[Timeout]),
            Enabled(false),
            &["release 3"],
            "disabled",
        ),
        // A 2xx with a pause, then the opt-out: the pause outlives it, as it outlives going
        // offline.
        row(
            then(sending(3), &[Status(200), PauseFor(5_000), Enabled(false)]),
            Enabled(true),
            &["then tick:", "publish idle", "wait +10000"],
            "idle held +5000",
        ),
    ];
    assert_eq!(drive(policy(), &rows), rows.len());
}

/// The hand-over a `Retry-After` past the budget causes is worded for what it is: no retry was
/// made, so the status line never says "gave up after 0 attempts".
#[test]
fn a_hand_over_without_retries_is_not_worded_as_zero_attempts() {
    let mut rig = Rig::new(long_retry_after());
    for step in then(sending(3), &[RetryAfter(503, 120)]) {
        rig.input(&step);
    }
    let shown = rig
        .input(&Tick)
        .into_iter()
        .find_map(|a| match a {
            Action::Publish { state, .. } => Some(state),
            _ => None,
        })
        .expect("the state is published");
    assert!(matches!(
        shown,
        DeliveryState::WaitingForUser { attempts: 0, .. }
    ));
    let line = crate::state::DeliveryStatus::new(shown, 3).to_string();
    assert!(!line.contains("0 attempts"), "{line}");
    assert!(line.contains("HTTP 503"), "{line}");
}

/// README §Consent: a denial whose deletion failed stays disabled and asks for the deletion
/// again every `DISCARD_RETRY_MS` until the driver says it is done.
#[test]
fn a_failed_deletion_is_asked_for_again() {
    let failed = || {
        vec![
            SetConsent(Consent::Pending),
            SetConsent(Consent::Denied),
            DiscardOwed(true),
        ]
    };
    let rows = [
        row(
            failed(),
            Tick,
            &["publish disabled", "wait +5000"],
            "disabled",
        ),
        row(
            failed(),
            TickAfter(5_000),
            &["discard for consent", "publish disabled", "wait +5000"],
            "disabled",
        ),
        row(
            then(failed(), &[TickAfter(5_000), DiscardOwed(false)]),
            TickAfter(5_000),
            &["publish disabled", "wait"],
            "disabled",
        ),
        // Owed at open (the record said denied, the deletion failed): tried at the first turn.
        row(
            vec![SetConsent(Consent::Denied), DiscardOwed(true)],
            TickAfter(5_000),
            &["discard for consent", "publish disabled", "wait +5000"],
            "disabled",
        ),
    ];
    assert_eq!(drive(policy(), &rows), rows.len());
}

/// docs/protocol.md §Responses: a `rejected` id is compared as a UUID, not as text; one that
/// names no event of the batch is counted, never taken for one of them.
#[test]
fn rejected_ids_are_compared_as_uuids() {
    let rows = [
        row(
            sending(3),
            RejectedRespelled(1),
            &["quarantine rejected 1", "ack 2"],
            "sending",
        ),
        row(
            sending(3),
            RejectedUnknown,
            &["unmatched rejections 1", "ack 3"],
            "sending",
        ),
    ];
    assert_eq!(drive(policy(), &rows), rows.len());
}

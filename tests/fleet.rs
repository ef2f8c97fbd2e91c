//! The fleet reconnect simulation at a reduced size, as a check of its invariants (every client
//! drains, no client retries beyond its budget), never of speed. The full-size run with the
//! comparison table is `cargo run --release --example fleet`.

use eventspool_testkit::fleet_sim as sim;
use sim::{Jitter, Params};

fn small(jitter: Jitter) -> Params {
    // 2,000 clients against a collector with 2x headroom over their normal rate (133 req/s).
    let mut p = Params::new(2_000, 0, jitter);
    p.capacity_per_s = (2.0 * p.steady_rate_per_s()) as u64;
    p
}

#[test]
fn every_client_drains_within_its_retry_budget() {
    for jitter in [Jitter::Full, Jitter::Equal, Jitter::None] {
        let p = small(jitter);
        let r = sim::run(&p);
        let label = jitter.label();
        assert_eq!(r.drained_clients, p.clients, "{label}: every client drains");
        assert!(r.drain_ms.is_some(), "{label}: drained before the horizon");
        assert_eq!(
            r.budget_violations, 0,
            "{label}: no retry beyond max_auto_attempts or max_retry_elapsed_ms"
        );
        assert!(
            r.max_retries_in_episode <= p.max_auto_attempts,
            "{label}: {} retries",
            r.max_retries_in_episode
        );
        assert!(r.max_retry_elapsed_ms <= p.max_retry_elapsed_ms, "{label}");
        // Every batch is delivered exactly once: successes equal the batches the fleet held.
        assert_eq!(
            r.requests - r.rejected,
            p.clients as u64 * p.batches_per_client as u64,
            "{label}"
        );
        assert_eq!(
            r.per_tick.iter().sum::<u64>(),
            r.requests,
            "{label}: the series accounts for every request"
        );
    }
}

#[test]
fn a_tight_budget_hands_over_to_the_user_and_still_drains() {
    let mut p = small(Jitter::Full);
    p.max_auto_attempts = 1;
    let r = sim::run(&p);
    assert!(
        r.clients_waiting_for_user > 0,
        "an overloaded collector exhausts a budget of one retry"
    );
    assert_eq!(
        r.drained_clients, p.clients,
        "the periodic flush after WaitingForUser still drains everyone"
    );
    assert_eq!(r.budget_violations, 0);
    assert!(r.max_retries_in_episode <= 1);
}

#[test]
fn full_jitter_spreads_the_retries_of_a_herd() {
    let full = sim::run(&small(Jitter::Full));
    let none = sim::run(&small(Jitter::None));
    // Lock-step retries land in the same instant; full jitter spreads them over the window.
    // (The reconnect itself, the first seconds, is the same herd for every policy.)
    let (f, n) = (full.peak_rate_from(15), none.peak_rate_from(15));
    assert!(
        f * 2 < n,
        "peak after the reconnect wave: full jitter {f}/s vs no jitter {n}/s"
    );
    assert!(
        full.requests < none.requests,
        "fewer wasted requests: {} vs {}",
        full.requests,
        none.requests
    );
}

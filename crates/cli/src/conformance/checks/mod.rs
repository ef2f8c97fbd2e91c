//! The checks, in the order they run, each with what the protocol says and its request bound.
//! docs/cli.md §conformance describes each one; keep the two in step.

mod delivery;
mod limits;

use super::context::Ctx;
use super::verdict::Judged;

pub struct Check {
    pub name: &'static str,
    /// What docs/protocol.md promises, in one line.
    pub protocol: &'static str,
    /// Requests the check sends at most (`load`: `--load-requests`).
    pub max_requests: usize,
    /// Runs only when asked for (`--load`, or named in `--only`).
    pub opt_in: bool,
    pub run: fn(&mut Ctx) -> Judged,
}

pub const CHECKS: &[Check] = &[
    Check {
        name: "answer_body",
        protocol: "a 2xx is read whole (64 KiB + 1,152 B per event); accepted, duplicates and \
                   rejected have their types; other members are ignored",
        max_requests: 1,
        opt_in: false,
        run: delivery::answer_body,
    },
    Check {
        name: "dedup",
        protocol: "a batch resent with the same event_ids, after a 2xx or after no answer, gets \
                   2xx, is stored once and counted in duplicates",
        max_requests: 5,
        opt_in: false,
        run: delivery::dedup,
    },
    Check {
        name: "malformed_event",
        protocol: "one bad event is listed in rejected, or the batch gets 400/422 and halving \
                   isolates it; a 2xx never drops it silently",
        max_requests: 7,
        opt_in: false,
        run: delivery::malformed_event,
    },
    Check {
        name: "encodings",
        protocol: "a gzip body (Content-Encoding: gzip, over 1 KiB) and an identity body are \
                   both accepted",
        max_requests: 2,
        opt_in: false,
        run: delivery::encodings,
    },
    Check {
        name: "field_order",
        protocol: "an event's members may come in any order",
        max_requests: 1,
        opt_in: false,
        run: delivery::field_order,
    },
    Check {
        name: "body_limit",
        protocol: "a body over the collector's limit gets 413 (the SDK halves and remembers the \
                   size)",
        max_requests: 3,
        opt_in: false,
        run: limits::body_limit,
    },
    Check {
        name: "auth",
        protocol: "a missing or wrong Authorization gets 401/403 (the SDK pauses), never 2xx or \
                   5xx",
        max_requests: 3,
        opt_in: false,
        run: limits::auth,
    },
    Check {
        name: "directives",
        protocol: "directives in a 2xx are within the SDK's bounds (it ignores the rest)",
        max_requests: 1,
        opt_in: false,
        run: limits::directives,
    },
    Check {
        name: "load",
        protocol: "busy or down: 429/503 with Retry-After, within the deadline; never a hang",
        max_requests: 0,
        opt_in: true,
        run: limits::load,
    },
];

/// The check of that name.
pub fn by_name(name: &str) -> Option<&'static Check> {
    CHECKS.iter().find(|c| c.name == name)
}

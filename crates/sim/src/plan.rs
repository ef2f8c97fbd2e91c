//! What happens to one device over a run, drawn from its seed before the run starts: the app's
//! verbs at their moments, and the episodes of the world around it (a partition, a proxy that
//! refuses every body, a slow link, a disk that fills or fails, a crash). Drawn up front so a
//! failing run can be shrunk by leaving steps out.

use eventspool::Consent;

pub const SECOND_MS: u64 = 1_000;
pub const MINUTE_MS: u64 = 60 * SECOND_MS;
pub const HOUR_MS: u64 = 60 * MINUTE_MS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    Now,
    /// An explicit timestamp this many minutes in the past (an importer, a late upload).
    Past(u32),
    /// An explicit timestamp in the future (a wrong clock).
    Future(u32),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// `n` events through `track_event`, named `name`.
    Track {
        n: u32,
        name: &'static str,
        when: When,
    },
    /// One `track_batch` of `n` events.
    Batch {
        n: u32,
    },
    /// A critical event (`Priority::Critical`).
    Critical,
    /// Many events at once while memory is small: a spill of several transactions.
    Burst {
        n: u32,
    },
    Persist,
    Online(bool),
    Foreground(bool),
    Metered(bool),
    Consent(Consent),
    Enabled(bool),
    RetryNow,
    Dismiss,
    Resume,
    Flush,
    Redrive,
    PurgeQuarantine,
    ClearDirective,
    /// `shutdown()` and open again.
    Restart,
    /// The process dies: no shutdown; open again from the files.
    Crash,
    /// The user moves the device's wall clock.
    SkewWall(i64),
    /// The network is cut (connections refused or unanswered) for this long.
    Partition {
        ms: u64,
    },
    /// A proxy answers 413 to every body for this long.
    RefuseBodies {
        ms: u64,
    },
    /// Bodies above 8 KB never finish uploading for this long.
    SlowLink {
        ms: u64,
    },
    /// The next `k` store writes fail (`SQLITE_IOERR`), from the next write on.
    FailWrites {
        k: u64,
    },
    /// The k-th store write from now fails with `SQLITE_FULL` (mid-transaction, mid-spill).
    FailNthWrite {
        n: u64,
    },
    /// A checkpoint fails.
    FailCheckpoint,
    /// The disk is full for this long.
    DiskFull {
        ms: u64,
    },
    /// The next time the worker takes a batch, it stops there, before it looks at consent and
    /// starts the request, and this step happens then: the seam between taking a batch and
    /// sending it, which a spool on its own threads leaves open for microseconds.
    AtTake(Box<Step>),
    /// The next time a request is on the wire (sent, its answer not come yet), these steps
    /// happen then, in order: a "no" and a "yes" before the answer, which the worker reads only
    /// as the latest word; a crash before the answer.
    OnWire(Vec<Step>),
    /// The collector answers every request with 503 and a `Retry-After` of 30 s to 10 min for
    /// this long: a fleet coming back at once after an outage. Retries then run out on answers
    /// that say when to come back, and the probe that follows must wait for them.
    Overloaded {
        ms: u64,
    },
    /// The app's next release rotates the store's key: `shutdown()`, then open again with a
    /// new key first in `encryption_keys` and the old ones after it (docs/encryption.md
    /// §Rotation). On a device that stored in plain text, the release adds encryption.
    Rekey,
    /// The process dies and, before it starts again, one byte of the stored body of one sealed
    /// row, queued or dead letter, changes on disk (flash gone bad): the row no longer opens
    /// with its key.
    Damage,
}

/// Steps at their simulated times (ms since the run began), in time order.
pub type Plan = Vec<(u64, Step)>;

/// One stream of a plan: a step every `gap` (drawn anew each time) until `hours` are over,
/// each step drawn by `make` from the same generator, in that order.
fn stream(
    rng: &mut fastrand::Rng,
    hours: u64,
    gap: std::ops::RangeInclusive<u64>,
    mut make: impl FnMut(&mut fastrand::Rng) -> Step,
) -> Plan {
    let end = hours * HOUR_MS;
    let mut plan = Vec::new();
    let mut t = 0;
    loop {
        t += rng.u64(gap.clone());
        if t >= end {
            break;
        }
        plan.push((t, make(rng)));
    }
    plan
}

/// The plan of one device over `hours`: about one step every four minutes, an app's day in some
/// three hundred and fifty steps (bursts and batches make each step many events).
pub fn draw(rng: &mut fastrand::Rng, hours: u64) -> Plan {
    stream(rng, hours, 1..=8 * MINUTE_MS, step)
}

/// The steps that land between the worker's take and its send, drawn from their own stream so
/// that adding them left every other step of a seed's plan as it was: about one every half hour.
pub fn draw_at_take(rng: &mut fastrand::Rng, hours: u64) -> Plan {
    stream(rng, hours, 1..=60 * MINUTE_MS, |rng| {
        Step::AtTake(Box::new(at_take(rng)))
    })
}

/// The steps that land while a request is on the wire, from their own stream (the other
/// streams' steps stay as they were): about one every hour.
pub fn draw_on_wire(rng: &mut fastrand::Rng, hours: u64) -> Plan {
    stream(rng, hours, 1..=120 * MINUTE_MS, |rng| {
        let mut steps = vec![
            Step::Consent(Consent::Denied),
            Step::Consent(Consent::Granted),
        ];
        if rng.u32(0..4) == 0 {
            steps.push(Step::Crash);
        }
        Step::OnWire(steps)
    })
}

/// The collector's overloads, from their own stream of the seed (so the other streams' steps
/// stay as they were): one every six hours or so, of 5 to 60 minutes.
pub fn draw_overloads(rng: &mut fastrand::Rng, hours: u64) -> Plan {
    stream(rng, hours, HOUR_MS..=12 * HOUR_MS, |rng| Step::Overloaded {
        ms: rng.u64(5 * MINUTE_MS..=60 * MINUTE_MS),
    })
}

/// Keys and the damage they reveal, from their own stream (the other streams' steps stay as
/// they were): about one every three hours, a rotation one time in three, else a damaged row
/// (nothing to damage on a device that stores in plain text: a crash alone).
pub fn draw_keys(rng: &mut fastrand::Rng, hours: u64) -> Plan {
    stream(rng, hours, 1..=6 * HOUR_MS, |rng| match rng.u32(0..3) {
        0 => Step::Rekey,
        _ => Step::Damage,
    })
}

/// Any of the seam steps of [`draw_at_take`], one or two, while a request is on the wire: a
/// stream of its own, so the other streams' steps stay as they were; about one every half
/// hour.
pub fn draw_on_wire_any(rng: &mut fastrand::Rng, hours: u64) -> Plan {
    stream(rng, hours, 1..=60 * MINUTE_MS, |rng| {
        let n = rng.usize(1..=2);
        Step::OnWire((0..n).map(|_| at_take(rng)).collect())
    })
}

/// A step for the moment between a take and its send.
fn at_take(rng: &mut fastrand::Rng) -> Step {
    match rng.u32(0..100) {
        // A "no" lasts until the plan's next "yes" (hours): rarer here than the rest.
        0..6 => Step::Consent(Consent::Denied),
        6..8 => Step::Consent(Consent::Pending),
        8..12 => Step::Enabled(false),
        12..45 => Step::Track {
            n: rng.u32(1..=3),
            name: "ok",
            when: match rng.u32(0..3) {
                0 => When::Now,
                1 => When::Past(rng.u32(1..=60)),
                _ => When::Future(rng.u32(1..=60)),
            },
        },
        45..52 => Step::Critical,
        52..58 => Step::Persist,
        58..64 => Step::Online(false),
        64..68 => Step::Foreground(false),
        68..73 => Step::RetryNow,
        73..77 => Step::Dismiss,
        77..81 => Step::Redrive,
        81..84 => Step::PurgeQuarantine,
        84..87 => Step::ClearDirective,
        87..93 => Step::Crash,
        93..97 => Step::FailNthWrite { n: rng.u64(1..=4) },
        _ => Step::Restart,
    }
}

/// Two plans as one, in time order (at equal times, `a`'s step first).
pub fn merge(a: Plan, b: Plan) -> Plan {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let take_a = match (a.peek(), b.peek()) {
            (Some((ta, _)), Some((tb, _))) => ta <= tb,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return out,
        };
        out.extend(if take_a { a.next() } else { b.next() });
    }
}

fn step(rng: &mut fastrand::Rng) -> Step {
    let r = rng.u32(0..1000);
    match r {
        0..380 => Step::Track {
            n: rng.u32(1..=8),
            name: match rng.u32(0..100) {
                0..88 => "ok",
                88..92 => "reject",
                92..94 => "poison",
                94..98 => "samp_x",
                _ => "legacy_ping",
            },
            when: match rng.u32(0..100) {
                0..90 => When::Now,
                90..97 => When::Past(rng.u32(1..=600)),
                _ => When::Future(rng.u32(1..=120)),
            },
        },
        380..430 => Step::Batch { n: rng.u32(1..=40) },
        430..460 => Step::Critical,
        460..463 => Step::Burst {
            n: rng.u32(200..=1_200),
        },
        463..475 => Step::Track {
            n: 1,
            name: "ok",
            when: When::Now,
        },
        475..490 => Step::Persist,
        490..560 => Step::Online(rng.u32(0..3) > 0),
        560..610 => Step::Foreground(rng.bool()),
        610..625 => Step::Metered(rng.bool()),
        625..640 => Step::Consent(match rng.u32(0..10) {
            0..2 => Consent::Denied,
            2..4 => Consent::Pending,
            _ => Consent::Granted,
        }),
        640..655 => Step::Enabled(rng.u32(0..3) > 0),
        655..680 => Step::RetryNow,
        680..690 => Step::Dismiss,
        690..705 => Step::Resume,
        705..725 => Step::Flush,
        725..735 => Step::Redrive,
        735..742 => Step::PurgeQuarantine,
        742..747 => Step::ClearDirective,
        747..760 => Step::Restart,
        760..772 => Step::Crash,
        772..777 => Step::SkewWall(rng.i64(-3_600_000..=3_600_000)),
        777..800 => Step::Partition {
            ms: match rng.u32(0..10) {
                0..6 => rng.u64(MINUTE_MS..=30 * MINUTE_MS),
                6..9 => rng.u64(HOUR_MS..=6 * HOUR_MS),
                _ => rng.u64(12 * HOUR_MS..=40 * HOUR_MS),
            },
        },
        800..810 => Step::RefuseBodies {
            ms: rng.u64(MINUTE_MS..=HOUR_MS),
        },
        810..825 => Step::SlowLink {
            ms: rng.u64(MINUTE_MS..=2 * HOUR_MS),
        },
        825..845 => Step::FailWrites { k: rng.u64(1..=4) },
        845..865 => Step::FailNthWrite { n: rng.u64(1..=40) },
        865..875 => Step::FailCheckpoint,
        875..890 => Step::DiskFull {
            ms: rng.u64(10 * SECOND_MS..=2 * HOUR_MS),
        },
        _ => Step::Track {
            n: 1,
            name: "ok",
            when: When::Now,
        },
    }
}

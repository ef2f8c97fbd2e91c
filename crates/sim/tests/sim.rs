//! The simulation as tests: the same seed gives the same trace; and a fleet's budget of
//! simulated device-hours, whose findings are the SDK's open defects (see RELIABILITY.md
//! §Simulation).

use eventspool_sim::{Params, run};

/// Same seed, same trace hash, twice in one process; another seed, another trace.
#[test]
fn the_same_seed_gives_the_same_trace() {
    let params = Params {
        seed: 0x5eed_0001,
        devices: 4,
        hours: 25,
        only: None,
    };
    let outcome = |p: &Params| match run(p, None) {
        Ok(r) => format!("passed, trace {:016x}", r.hash),
        Err(f) => format!("failed: {f}"),
    };
    let first = outcome(&params);
    let second = outcome(&params);
    assert_eq!(first, second, "one seed gave two runs");
    let other = outcome(&Params {
        seed: 0x5eed_0002,
        ..params
    });
    assert_ne!(
        first, other,
        "two seeds gave one trace: the seed steers nothing"
    );
}

/// Devices whose runs found a defect, replayed alone: each must pass now (RELIABILITY.md
/// §Simulation). Kept here as they are found, replayed in every CI run.
const FOUND: &[(u64, usize, u64, usize, &str)] = &[
    (
        0x5,
        16,
        25,
        15,
        "a denial left bytes of rows rewritten or deleted before it in events.db",
    ),
    (
        0x5eed_0003,
        80,
        25,
        47,
        "client reports kept during a partition took the store past max_disk_bytes",
    ),
    (
        0x5eed_0004,
        80,
        25,
        42,
        "a write that failed part-way left uncommitted frames taking the WAL past the cap",
    ),
    (
        0x5eed_0004,
        80,
        25,
        21,
        "a denial left a delivered event's bytes in the unused space of a spared row's page",
    ),
    (
        0x5eed_0001,
        80,
        25,
        51,
        "an open that deleted a spared batch handed its seqs out again, below the frontier",
    ),
    (
        0x5eed_000a,
        80,
        25,
        11,
        "a send note failed part-way and the batch given back left the WAL past the cap",
    ),
    (
        0x5eed_0006,
        80,
        25,
        79,
        "the open after a crash wrote a batch's owed counts and left the WAL past the cap",
    ),
    (
        0x5eed_0005,
        80,
        25,
        30,
        "a damaged row the full disk kept from the quarantine threw the read away: memory went first",
    ),
    (
        0x5eed_0001,
        80,
        25,
        4,
        "behind a proxy refusing every body, a lone event was quarantined as too large after one 413",
    ),
];

#[test]
fn the_devices_that_found_bugs_pass() {
    for &(seed, devices, hours, device, what) in FOUND {
        let params = Params {
            seed,
            devices,
            hours,
            only: Some(device),
        };
        if let Err(f) = run(&params, None) {
            panic!("{what}: {f}");
        }
    }
}

/// The CI budget: 10,000 simulated device-hours (5 runs of 80 devices for 25 hours), on two
/// threads, in the optimised build. `EVENTSPOOL_SIM_DEVICE_HOURS` changes the budget,
/// `EVENTSPOOL_SIM_SOAK=1` multiplies it by 100, `EVENTSPOOL_SIM_SEED` sets the first seed.
/// Runs in the optimised build only (`bash .ci/run` runs it there): a debug build takes some
/// twenty times as long.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "the budget runs in the release build: cargo test --release -p eventspool-sim"
)]
fn a_fleet_keeps_every_promise() {
    let base = std::env::var("EVENTSPOOL_SIM_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0x5eed_0001);
    let mut budget: u64 = std::env::var("EVENTSPOOL_SIM_DEVICE_HOURS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    if std::env::var_os("EVENTSPOOL_SIM_SOAK").is_some_and(|v| v == "1") {
        budget *= 100;
    }
    let (devices, hours) = (80usize, 25u64);
    let runs = budget.div_ceil(devices as u64 * hours);
    let started = std::time::Instant::now();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|t| {
                s.spawn(move || {
                    (0..runs)
                        .filter(|r| r % 2 == t)
                        .map(|r| {
                            run(
                                &Params {
                                    seed: base + r,
                                    devices,
                                    hours,
                                    only: None,
                                },
                                None,
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a simulation thread"))
            .collect()
    });
    let mut total = eventspool_sim::device::Figures::default();
    let mut hours_done = 0;
    for r in &results {
        match r {
            Ok(r) => {
                hours_done += r.device_hours;
                total.events += r.figures.events;
                total.requests += r.figures.requests;
                total.faults += r.figures.faults;
                total.crashes += r.figures.crashes;
                total.restarts += r.figures.restarts;
                total.damaged += r.figures.damaged;
                total.undecryptable += r.figures.undecryptable;
            }
            Err(f) => panic!("{f}"),
        }
    }
    println!(
        "simulated {hours_done} device-hours in {runs} runs of {devices} devices: {} events, {} requests, {} store faults, {} crashes, {} restarts, {} sealed rows damaged ({} found quarantined as undecryptable) in {:.1} s of wall time",
        total.events,
        total.requests,
        total.faults,
        total.crashes,
        total.restarts,
        total.damaged,
        total.undecryptable,
        started.elapsed().as_secs_f64()
    );
}

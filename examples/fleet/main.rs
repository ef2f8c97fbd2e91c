//! Fleet reconnect simulation: 100,000 clients offline together for 10 minutes reconnect within
//! the same second and drain into a collector of limited capacity. Compares the SDK's full
//! jitter with no jitter and equal jitter (those two exist only in the simulation).
//!
//! `cargo run --release --example fleet [-- --clients N --capacity C --reconnect-spread-ms MS]`
//! Human table on stderr, JSON on stdout. See `eventspool_testkit::fleet_sim` for the model.
//!
//! `cargo run --release --example fleet -- --real [--clients N
//! --batches N --reconnect-spread-ms MS]` drives the real topology instead (nats-server, three
//! JetStream collectors; `real.rs`) and reports the herd's peak against measured capacity.

#[path = "real.rs"]
mod real;

use eventspool_testkit::fleet_sim as sim;
use sim::{Jitter, Params, Report};

fn arg(name: &str) -> Option<u64> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    if std::env::args().any(|a| a == "--real") {
        real::run(real::RealParams {
            clients: arg("--clients").unwrap_or(2_000) as usize,
            batches_per_client: arg("--batches").unwrap_or(3) as usize,
            reconnect_spread_ms: arg("--reconnect-spread-ms").unwrap_or(1_000),
        });
        return;
    }
    let clients = arg("--clients").unwrap_or(100_000) as usize;
    let mut base = Params::new(clients, 0, Jitter::Full);
    if let Some(spread) = arg("--reconnect-spread-ms") {
        base.reconnect_spread_ms = spread;
    }
    let steady = base.steady_rate_per_s();
    // A collector sized with 2x headroom over the fleet's normal traffic.
    let capacity = arg("--capacity").unwrap_or((2.0 * steady).round() as u64);
    // The reconnect wave: every client sends at once when the network returns, whatever its
    // retry policy; the first four backoff windows (1 + 2 + 4 + 8 s) are its aftershock. The
    // peak that a retry policy shapes is the one after that.
    let settle_s = 15u64;
    eprintln!(
        "fleet: {clients} clients, {} batches each, offline {} min, reconnect within {} ms; collector {capacity} req/s \
         (503 above); normal fleet rate {steady:.0} req/s (one batch per client per {} s); peak rates over 100 ms windows",
        base.batches_per_client,
        base.offline_ms / 60_000,
        base.reconnect_spread_ms,
        base.flush_interval_ms / 1000
    );
    eprintln!(
        "{:<26} {:>10} {:>10} {:>11} {:>11} {:>8} {:>10} {:>8} {:>9} {:>10} {:>8}",
        "policy",
        "requests",
        "503s",
        "wave req/s",
        "peak>15s",
        "x normal",
        "x capacity",
        "drain s",
        "drained",
        "WFU clnts",
        "max rtry"
    );
    let mut rows = Vec::new();
    for jitter in [Jitter::Full, Jitter::Equal, Jitter::None] {
        let mut p = Params::new(clients, capacity, jitter);
        p.seed = 42;
        if let Some(spread) = arg("--reconnect-spread-ms") {
            p.reconnect_spread_ms = spread;
        }
        let started = std::time::Instant::now();
        let r: Report = sim::run(&p);
        let wave = r.peak_rate_from(0);
        let peak = r.peak_rate_from(settle_s);
        eprintln!(
            "{:<26} {:>10} {:>10} {:>11} {:>11} {:>8.2} {:>10.2} {:>8} {:>9} {:>10} {:>8}   ({:.1} s to simulate)",
            jitter.label(),
            r.requests,
            r.rejected,
            wave,
            peak,
            peak as f64 / steady,
            peak as f64 / capacity as f64,
            r.drain_ms
                .map(|d| format!("{:.1}", d as f64 / 1000.0))
                .unwrap_or_else(|| "never".into()),
            r.drained_clients,
            r.clients_waiting_for_user,
            r.max_retries_in_episode,
            started.elapsed().as_secs_f64()
        );
        let per_second = r.per_second();
        let series: Vec<String> = [0usize, 1, 2, 3, 5, 8, 15, 20, 30, 45, 60, 75]
            .iter()
            .filter_map(|&s| per_second.get(s).map(|n| format!("{s}s:{n}")))
            .collect();
        eprintln!("    requests in second t: {}", series.join(" "));
        rows.push(serde_json::json!({
            "policy": jitter.label(),
            "requests": r.requests,
            "rejected_503": r.rejected,
            "wave_peak_req_per_s": wave,
            "peak_req_per_s_after_15s": peak,
            "peak_over_normal_fleet_rate": peak as f64 / steady,
            "peak_over_capacity": peak as f64 / capacity as f64,
            "drain_s": r.drain_ms.map(|d| d as f64 / 1000.0),
            "drained_clients": r.drained_clients,
            "clients_waiting_for_user": r.clients_waiting_for_user,
            "waiting_for_user_entries": r.waiting_for_user_entries,
            "max_retries_in_episode": r.max_retries_in_episode,
            "budget_violations": r.budget_violations,
            "requests_per_second_first_120_s": per_second.iter().take(120).collect::<Vec<_>>(),
        }));
    }
    let report = serde_json::json!({
        "clients": clients, "capacity_req_per_s": capacity, "normal_fleet_req_per_s": steady,
        "peak_measured_from_s": settle_s, "peak_window_ms": 100,
        "batches_per_client": base.batches_per_client, "policies": rows,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
}

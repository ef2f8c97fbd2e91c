//! `eventspool-sim`: runs one simulated world and prints its figures; a failure prints the
//! replay command and the shrunk story of the failing device, and exits 1.
//!
//! `eventspool-sim --seed 0x5eed0001 --devices 80 --hours 25 [--device 17] [--no-shrink]`

use std::process::ExitCode;
use std::time::Duration;

use eventspool_sim::{Params, run, shrink};

fn main() -> ExitCode {
    let mut params = Params {
        seed: 0x5eed_0001,
        devices: 8,
        hours: 24,
        only: None,
    };
    let mut do_shrink = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            let v = args.next().ok_or(format!("{name} needs a value"))?;
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.map_err(|_| format!("{name}: '{v}' is not a number"))
        };
        let result = match arg.as_str() {
            "--seed" => value("--seed").map(|v| params.seed = v),
            "--devices" => value("--devices").map(|v| params.devices = v as usize),
            "--hours" => value("--hours").map(|v| params.hours = v),
            "--device" => value("--device").map(|v| params.only = Some(v as usize)),
            "--no-shrink" => {
                do_shrink = false;
                Ok(())
            }
            other => Err(format!(
                "unknown argument '{other}'; usage: eventspool-sim [--seed N] [--devices N] [--hours N] [--device N] [--no-shrink]"
            )),
        };
        if let Err(e) = result {
            eprintln!("eventspool-sim: {e}");
            return ExitCode::from(2);
        }
    }
    match run(&params, None) {
        Ok(r) => {
            println!(
                "seed {:#x}: {} device-hours, {} events, {} requests, {} faults, {} crashes, {} restarts, {} sealed rows damaged ({} found quarantined as undecryptable) in {:.1} s; trace {:016x}",
                params.seed,
                r.device_hours,
                r.figures.events,
                r.figures.requests,
                r.figures.faults,
                r.figures.crashes,
                r.figures.restarts,
                r.figures.damaged,
                r.figures.undecryptable,
                r.wall.as_secs_f64(),
                r.hash
            );
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("FAILED: {failure}");
            if do_shrink {
                let (plan, last) = shrink(&failure, Duration::from_secs(120));
                eprintln!("shrunk to {} steps ({}):", plan.len(), last.what);
                for (t, step) in &plan {
                    eprintln!("  {:>10.3}s {step:?}", *t as f64 / 1000.0);
                }
            }
            ExitCode::FAILURE
        }
    }
}

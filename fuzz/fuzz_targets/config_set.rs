//! Config values by name (as the CLI and bindings set them), then validation.
#![no_main]

use eventspool::Config;
use eventspool::CONFIG_NAMES;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut config = Config::new("https://collector.example/v1/batch");
    for line in text.lines() {
        let (name, value) = line.split_once('=').unwrap_or((line, ""));
        let name = match name.parse::<usize>() {
            Ok(i) => CONFIG_NAMES[i % CONFIG_NAMES.len()],
            Err(_) => name,
        };
        let _ = config.set(name, value);
    }
    let _ = config.validate();
});

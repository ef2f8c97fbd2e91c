#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 60 s each) and prints libFuzzer's summary.
# Needs nightly and cargo-fuzz: `rustup toolchain install nightly && cargo install cargo-fuzz`.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
for target in track_input classify_response retry_after config_set; do
    mkdir -p "corpus/$target"
    cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$secs" -print_final_stats=1 2>&1 \
        | grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|Done|==.*ERROR|SUMMARY)" \
        | sed "s/^/$target: /"
done

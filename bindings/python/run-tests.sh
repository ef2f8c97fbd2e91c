#!/usr/bin/env bash
# The Python suite as CI runs it (.ci/run): builds the eventspool wheel from this repository
# (pip's PEP 517 build of bindings/python: maturin, UniFFI mode, `--profile dev`), installs it
# with pytest into a fresh virtualenv, and runs tests/ against the installed package.
#
#   bash bindings/python/run-tests.sh [pytest arguments]
#
# Needs the collector process the tests start: `cargo build --workspace --all-features --example
# collector_process` (or EVENTSPOOL_COLLECTOR=<path>). Leaves the wheel in target/python/wheels/.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TERM_COLOR=never PIP_DISABLE_PIP_VERSION_CHECK=1

out=target/python
rm -rf "$out/venv" "$out/wheels"
mkdir -p "$out"

# A debug wheel. maturin builds the FFI crate alone (`cargo rustc --manifest-path
# bindings/ffi/Cargo.toml`), where a workspace build unifies features over every member, so its
# dependencies compile once more (into the same target/, beside the workspace build's); the
# generator is the one bindings/generate.sh built (build_support/uniffi-bindgen).
start=$SECONDS
MATURIN_PEP517_ARGS="--profile dev" python3 -m pip wheel --quiet --no-deps ./bindings/python -w "$out/wheels"
wheel=("$out"/wheels/eventspool-*.whl)
printf 'built %s (%d bytes) in %ds\n' "${wheel[0]}" "$(stat -c %s "${wheel[0]}")" $((SECONDS - start)) >&2

start=$SECONDS
python3 -m venv "$out/venv"
"$out/venv/bin/pip" install --quiet pytest "${wheel[0]}"
printf 'virtualenv with the wheel and pytest in %ds\n' $((SECONDS - start)) >&2

# The venv's own pytest script, run from the tests' folder: nothing of the source tree is on
# sys.path for `import eventspool` (tests/test_package.py checks it came from site-packages).
cd bindings/python
exec "../../$out/venv/bin/pytest" -q -p no:cacheprovider "$@"

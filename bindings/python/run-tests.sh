#!/usr/bin/env bash
# The Python suite as CI runs it (.ci/run): builds the eventspool sdist, then from it the wheel the
# way it is published (manylinux_2_17, stripped: maturin with zig from PyPI as the linker, so the
# library needs no glibc newer than 2.17), checks its tag and symbols (check_wheel.py), then
# installs the wheel with pytest into a fresh virtualenv and runs tests/ against the installed
# package.
#
#   bash bindings/python/run-tests.sh [pytest arguments]
#
# Needs the collector process the tests start: `cargo build --workspace --all-features --example
# collector_process` (or EVENTSPOOL_COLLECTOR=<path>). Leaves the wheel and the sdist in
# target/python/wheels/. The build uses the dev profile (a release build only costs CI time; the
# tag, the symbols and the stripping are the same).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
export CARGO_TERM_COLOR=never PIP_DISABLE_PIP_VERSION_CHECK=1

out=target/python
rm -rf "$out/venv" "$out/wheels" "$out/sdist-wheel"
mkdir -p "$out"

# The build tools, pinned: maturin (the build backend pyproject.toml names) and zig, which
# maturin uses as the C compiler and linker for an older glibc (`--zig`).
start=$SECONDS
if [[ ! -x "$out/build-venv/bin/maturin" || ! -x "$out/build-venv/bin/python-zig" ]]; then
    python3 -m venv "$out/build-venv"
    "$out/build-venv/bin/pip" install --quiet maturin==1.16.0 ziglang==0.15.2
    # maturin finds zig as `python -m ziglang`; a name on PATH makes that explicit.
    printf '#!/bin/sh\nexec "%s" -m ziglang "$@"\n' "$root/$out/build-venv/bin/python" > "$out/build-venv/bin/python-zig"
    chmod +x "$out/build-venv/bin/python-zig"
fi
printf 'build tools (maturin, ziglang) in %ds\n' $((SECONDS - start)) >&2

# The sdist, then the wheel pip builds from nothing but it (what pip does on a platform without
# a wheel): maturin with zig as the C compiler and linker (`--zig`, manylinux_2_17), dev profile.
# The wheel the tests install is that one, so one build checks both that the sdist builds and the
# wheel as published. maturin builds the FFI crate alone (`cargo rustc --manifest-path
# bindings/ffi/Cargo.toml` in the unpacked sdist, its dependencies compiled once more beside the
# workspace build, for the zig target) and generates the module with the crate's own generator
# (build_support/uniffi-bindgen, which bindings/generate.sh built).
start=$SECONDS
(
    cd bindings/python
    PATH="$root/bindings/python/build_support:$root/$out/build-venv/bin:$PATH" \
        "$root/$out/build-venv/bin/maturin" sdist --out "$root/$out/wheels" >&2
)
sdist=("$out"/wheels/eventspool-*.tar.gz)
PATH="$root/$out/build-venv/bin:$PATH" CARGO_TARGET_DIR="$root/target" \
    MATURIN_PEP517_ARGS="--profile dev --zig --compatibility manylinux_2_17" \
    "$out/build-venv/bin/pip" wheel --quiet --no-deps --no-build-isolation "${sdist[0]}" -w "$out/wheels"
wheel=("$out"/wheels/eventspool-*.whl)
# Stripped once the generator has read the library (strip_wheel.py says why not maturin's --strip).
python3 bindings/python/strip_wheel.py "${wheel[0]}"
printf 'sdist %s (%d bytes) built %s (%d bytes) in %ds\n' "${sdist[0]}" "$(stat -c %s "${sdist[0]}")" \
    "$(basename "${wheel[0]}")" "$(stat -c %s "${wheel[0]}")" $((SECONDS - start)) >&2
python3 bindings/python/check_wheel.py "${wheel[0]}" --glibc 2.17

start=$SECONDS
python3 -m venv "$out/venv"
"$out/venv/bin/pip" install --quiet pytest "${wheel[0]}"
printf 'virtualenv with the wheel and pytest in %ds\n' $((SECONDS - start)) >&2

# The venv's own pytest script, run from the tests' folder: nothing of the source tree is on
# sys.path for `import eventspool` (tests/test_package.py checks it came from site-packages).
cd bindings/python
exec "../../$out/venv/bin/pytest" -q -p no:cacheprovider "$@"

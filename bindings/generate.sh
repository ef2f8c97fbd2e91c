#!/usr/bin/env bash
# Builds the eventspool library and generates its Kotlin, Swift and Python bindings.
#
#   bash bindings/generate.sh            # debug cdylib, all features: fast, reuses the build of
#                                        # `cargo test --all-features` (what CI and the suites use)
#   bash bindings/generate.sh --release  # the mobile-like library: release, `--no-default-features
#                                        # --features ffi` (no collector, no CLI)
#
# Outputs (build output, ignored by git, regenerated in CI):
#   bindings/kotlin/src/main/kotlin/uniffi/eventspool/eventspool.kt
#   bindings/python/eventspool.py + bindings/python/libeventspool.so (the module loads it from beside itself)
#   bindings/swift/Sources/EventSpool/eventspool.swift + bindings/swift/include/ (header + modulemap for the XCFramework)
#   bindings/native/libeventspool.so (the library the Kotlin tests load through JNA)
# The generator reads the interface from the library itself (UniFFI library mode), so the
# bindings always match the library they ship with.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

if [[ "${1:-}" == "--release" ]]; then
    cargo build --release --lib --no-default-features --features ffi
    lib_dir=target/release
else
    cargo build --lib --all-features
    lib_dir=target/debug
fi
case "$(uname -s)" in
    Darwin) lib="$lib_dir/libeventspool.dylib" ;;
    *) lib="$lib_dir/libeventspool.so" ;;
esac

# The generator is built with the same features as `cargo test --all-features`, so CI reuses
# that build instead of compiling the crate a second time.
cargo build --all-features --bin uniffi-bindgen
bindgen=target/debug/uniffi-bindgen

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for language in kotlin python swift; do
    "$bindgen" generate "$lib" --language "$language" --out-dir "$tmp/$language" --no-format >/dev/null
done

mkdir -p bindings/kotlin/src/main/kotlin bindings/native bindings/swift/Sources/EventSpool bindings/swift/include
rm -rf bindings/kotlin/src/main/kotlin/uniffi
cp -R "$tmp/kotlin/uniffi" bindings/kotlin/src/main/kotlin/
cp "$tmp/python/eventspool.py" bindings/python/eventspool.py
cp "$lib" bindings/python/
cp "$lib" bindings/native/
cp "$tmp/swift/eventspool.swift" bindings/swift/Sources/EventSpool/eventspool.swift
cp "$tmp/swift/eventspoolFFI.h" bindings/swift/include/
# An XCFramework's headers need a module.modulemap by that exact name.
cp "$tmp/swift/eventspoolFFI.modulemap" bindings/swift/include/module.modulemap

echo "bindings generated from $lib" >&2

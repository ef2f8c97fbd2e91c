#!/usr/bin/env bash
# Builds the eventspool FFI library (crate bindings/ffi) and generates its Kotlin and Swift
# bindings. Python is a wheel that maturin builds and generates itself (bindings/python/pyproject.toml).
#
#   bash bindings/generate.sh            # debug cdylib, all features: fast, reuses the build of
#                                        # `cargo test --workspace --all-features` (what CI and the suites use)
#   bash bindings/generate.sh --release  # the mobile-like library: release, `-p eventspool-ffi`
#                                        # alone (no collector, no CLI, no generator)
#
# Outputs (build output, ignored by git, regenerated in CI):
#   bindings/kotlin/src/main/kotlin/uniffi/eventspool/eventspool.kt
#   bindings/swift/Sources/EventSpool/eventspool.swift + bindings/swift/include/ (header + modulemap for the XCFramework)
#   bindings/native/libeventspool_ffi.so (the library the Kotlin tests load through JNA)
# The generator reads the interface from the library itself (UniFFI library mode), so the
# bindings always match the library they ship with.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

if [[ "${1:-}" == "--release" ]]; then
    cargo build --release -p eventspool-ffi --lib
    lib_dir=target/release
else
    # The whole workspace's features, as `cargo test --workspace --all-features` resolves them,
    # so this reuses that build instead of compiling the SDK a second time.
    cargo build --workspace --all-features --lib
    lib_dir=target/debug
fi
case "$(uname -s)" in
    Darwin) lib="$lib_dir/libeventspool_ffi.dylib" ;;
    *) lib="$lib_dir/libeventspool_ffi.so" ;;
esac

# The generator is built with the same features as `cargo test --workspace --all-features`, so
# CI reuses that build instead of compiling the crate a second time.
cargo build --workspace --all-features --bin eventspool-uniffi-bindgen
bindgen=target/debug/eventspool-uniffi-bindgen

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for language in kotlin swift; do
    "$bindgen" generate "$lib" --language "$language" --out-dir "$tmp/$language" --no-format >/dev/null
done

mkdir -p bindings/kotlin/src/main/kotlin bindings/native bindings/swift/Sources/EventSpool bindings/swift/include
rm -rf bindings/kotlin/src/main/kotlin/uniffi
cp -R "$tmp/kotlin/uniffi" bindings/kotlin/src/main/kotlin/
cp "$lib" bindings/native/
cp "$tmp/swift/eventspool.swift" bindings/swift/Sources/EventSpool/eventspool.swift
cp "$tmp/swift/eventspoolFFI.h" bindings/swift/include/
# An XCFramework's headers need a module.modulemap by that exact name.
cp "$tmp/swift/eventspoolFFI.modulemap" bindings/swift/include/module.modulemap

echo "bindings generated from $lib" >&2

#!/usr/bin/env bash
# Builds bindings/swift/eventspoolFFI.xcframework on macOS (needs Xcode and rustup):
# the mobile-like release library (`-p eventspool-ffi`: no collector, no
# CLI) for iOS devices, the iOS simulator (arm64 + x86_64) and macOS (arm64 + x86_64), each a
# static library carrying the header and module map that generate.sh wrote to bindings/swift/include.
#
#   bash bindings/generate.sh                  # Swift sources + header + module map
#   bash bindings/swift/build-xcframework.sh   # the XCFramework Package.swift points at
set -euo pipefail
cd "$(dirname "$0")/../.."

if [[ "$(uname -s)" != Darwin ]]; then
    echo "build-xcframework.sh needs macOS with Xcode (xcodebuild, lipo)" >&2
    exit 1
fi
if [[ ! -f bindings/swift/include/eventspoolFFI.h ]]; then
    echo "run bindings/generate.sh first: bindings/swift/include is missing" >&2
    exit 1
fi

targets=(aarch64-apple-ios aarch64-apple-ios-sim x86_64-apple-ios aarch64-apple-darwin x86_64-apple-darwin)
rustup target add "${targets[@]}"
for target in "${targets[@]}"; do
    cargo build --release -p eventspool-ffi --lib --target "$target"
done

out=bindings/swift/build
rm -rf "$out" bindings/swift/eventspoolFFI.xcframework
mkdir -p "$out/ios-sim" "$out/macos"
lipo -create target/aarch64-apple-ios-sim/release/libeventspool_ffi.a target/x86_64-apple-ios/release/libeventspool_ffi.a \
    -output "$out/ios-sim/libeventspool_ffi.a"
lipo -create target/aarch64-apple-darwin/release/libeventspool_ffi.a target/x86_64-apple-darwin/release/libeventspool_ffi.a \
    -output "$out/macos/libeventspool_ffi.a"

headers=bindings/swift/include
xcodebuild -create-xcframework \
    -library target/aarch64-apple-ios/release/libeventspool_ffi.a -headers "$headers" \
    -library "$out/ios-sim/libeventspool_ffi.a" -headers "$headers" \
    -library "$out/macos/libeventspool_ffi.a" -headers "$headers" \
    -output bindings/swift/eventspoolFFI.xcframework
echo "bindings/swift/eventspoolFFI.xcframework is ready; add bindings/swift as a Swift package" >&2

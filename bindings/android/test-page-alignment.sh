#!/usr/bin/env bash
# The 16 KB alignment check against two libraries built here with the host's C compiler, the same
# code linked for 4 KB and for 16 KB pages: the first must be refused, the second accepted.
set -euo pipefail
cd "$(dirname "$0")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo 'int eventspool_probe(void) { return 42; }' > "$work/probe.c"
cc -shared -fPIC -Wl,-z,max-page-size=4096 -o "$work/lib4k.so" "$work/probe.c"
cc -shared -fPIC -Wl,-z,max-page-size=16384 -o "$work/lib16k.so" "$work/probe.c"
if bash check-page-alignment.sh "$work/lib4k.so" 2>"$work/out"; then
    echo "test-page-alignment: a 4 KB-aligned library passed the check" >&2
    exit 1
fi
grep -q "below 16 KB" "$work/out" || { cat "$work/out" >&2; exit 1; }
bash check-page-alignment.sh "$work/lib16k.so"
# build-aar.sh runs the check on what it packs: a 4 KB-aligned library that is no host build (no
# libc.so.6) is refused for an --abi. It packs the classes mvn compiled (CI runs mvn test first).
if [[ -d ../kotlin/target/classes && -d target/classes ]]; then
    cc -shared -fPIC -nostdlib -Wl,-z,max-page-size=4096 -o "$work/lib4k-nolibc.so" "$work/probe.c"
    # --out is relative to the repository root (build-aar.sh works from there).
    dist=bindings/android/target/page-alignment-test
    trap 'rm -rf "$work" ../../"$dist"' EXIT
    if bash build-aar.sh --no-compile --abi arm64-v8a="$work/lib4k-nolibc.so" --out "$dist" 2>"$work/aar-out"; then
        echo "test-page-alignment: build-aar.sh packed a 4 KB-aligned library for arm64-v8a" >&2
        exit 1
    fi
    grep -q "is not aligned for 16 KB pages" "$work/aar-out" || { cat "$work/aar-out" >&2; exit 1; }
    # A 16 KB-aligned one is packed, into an absolute --out (the zip step runs elsewhere).
    cc -shared -fPIC -nostdlib -Wl,-z,max-page-size=16384 -o "$work/lib16k-nolibc.so" "$work/probe.c"
    bash build-aar.sh --no-compile --abi arm64-v8a="$work/lib16k-nolibc.so" --out "$work/dist" 2>"$work/aar-out" \
        || { cat "$work/aar-out" >&2; echo "test-page-alignment: build-aar.sh refused a 16 KB-aligned library or an absolute --out" >&2; exit 1; }
    unzip -Z1 "$work/dist/eventspool-android.aar" | grep -qx "jni/arm64-v8a/libeventspool_ffi.so" \
        || { echo "test-page-alignment: the aar lacks jni/arm64-v8a/libeventspool_ffi.so" >&2; exit 1; }
    echo "test-page-alignment: 4 passed, 0 failed" >&2
else
    echo "test-page-alignment: 2 passed, 0 failed (build-aar.sh not run: no compiled classes, run mvn test first)" >&2
fi

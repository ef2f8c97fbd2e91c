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
echo "test-page-alignment: 2 passed, 0 failed" >&2

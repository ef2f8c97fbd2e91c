#!/usr/bin/env bash
# Checks that each ELF shared library's loadable segments are aligned for 16 KB pages: Google Play
# requires it for apps targeting Android 15+ on 16 KB-page devices, and the NDK r26/r27 linkers
# align to 4 KB unless told `-Wl,-z,max-page-size=16384` (r28 does it by default).
#
#   bash bindings/android/check-page-alignment.sh LIB.so [LIB.so ...]
#
# Exit 1 naming each library and segment that is aligned below 16 KB (0x4000).
set -euo pipefail
status=0
for lib in "$@"; do
    [[ -f "$lib" ]] || { echo "check-page-alignment: no file '$lib'" >&2; exit 2; }
    # readelf -lW: "LOAD  Offset VirtAddr PhysAddr FileSiz MemSiz Flg Align"; Align is the last field.
    segments="$(readelf -lW "$lib" | awk '$1 == "LOAD" { print $NF }')"
    [[ -n "$segments" ]] || { echo "check-page-alignment: $lib has no LOAD segment (not an ELF library?)" >&2; exit 2; }
    low=""
    while read -r align; do
        if (( align < 0x4000 )); then low+=" $align"; fi
    done <<<"$segments"
    if [[ -n "$low" ]]; then
        echo "check-page-alignment: $lib: LOAD segments aligned to$low, below 16 KB (0x4000): link with -Wl,-z,max-page-size=16384" >&2
        status=1
    else
        echo "check-page-alignment: $lib: every LOAD segment aligned to 16 KB or more" >&2
    fi
done
exit $status

"""Checks a built eventspool wheel the way PyPI and pip will see it (run by run-tests.sh):

- its platform tag is a manylinux one no newer than the policy asked for (manylinux_2_17 by
  default): PyPI refuses a plain `linux_x86_64` wheel, and pip on an older system skips it;
- the library inside needs no glibc symbol version above that policy (`objdump -T`), which is
  what the tag promises;
- the library is stripped: no `.symtab` and no `.debug_*` section (an unstripped debug library
  is ten times the size of what it runs).

    python3 check_wheel.py WHEEL [--glibc 2.17]
"""

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def fail(message):
    print(f"check_wheel: {message}", file=sys.stderr)
    sys.exit(1)


def version(text):
    return tuple(int(p) for p in text.split("."))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("wheel")
    parser.add_argument("--glibc", default="2.17")
    args = parser.parse_args()
    wheel = Path(args.wheel)
    policy = version(args.glibc)

    # name-version(-build)?-python-abi-platform.whl; the platform may hold several tags joined by dots.
    platforms = wheel.name[: -len(".whl")].split("-")[-1].split(".")
    manylinux = [p for p in platforms if re.fullmatch(r"manylinux_\d+_\d+_\w+|manylinux2014_\w+", p)]
    if not manylinux:
        fail(f"{wheel.name}: platform tag {'.'.join(platforms)} is not manylinux (PyPI refuses linux_* wheels)")
    for tag in manylinux:
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", tag)
        tagged = (int(m.group(1)), int(m.group(2))) if m else (2, 17)
        if tagged > policy:
            fail(f"{wheel.name}: tag {tag} is newer than manylinux_{policy[0]}_{policy[1]}")

    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        metadata = next((n for n in z.namelist() if n.endswith(".dist-info/WHEEL")), None)
        if metadata is None:
            fail(f"{wheel.name}: no .dist-info/WHEEL")
        tags = [line.split(":", 1)[1].strip() for line in z.read(metadata).decode().splitlines() if line.startswith("Tag:")]
        if not tags or not all("manylinux" in t for t in tags):
            fail(f"{wheel.name}: WHEEL metadata tags {tags} are not all manylinux")
        libraries = [n for n in z.namelist() if re.search(r"libeventspool_ffi[^/]*\.so$", n)]
        if len(libraries) != 1:
            fail(f"{wheel.name}: expected one libeventspool_ffi .so, found {libraries}")
        lib = Path(z.extract(libraries[0], tmp))

        dynamic = subprocess.run(["objdump", "-T", str(lib)], check=True, capture_output=True, text=True).stdout
        needed = sorted({version(v) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", dynamic)})
        if not needed:
            fail(f"{lib.name}: no GLIBC symbol versions found (objdump -T): not a glibc library?")
        if needed[-1] > policy:
            newest = ".".join(map(str, needed[-1]))
            users = sorted({line.split()[-1] for line in dynamic.splitlines() if f"GLIBC_{newest}" in line})[:5]
            fail(f"{lib.name}: needs GLIBC_{newest} (e.g. {', '.join(users)}), above the tag's {args.glibc}")

        sections = subprocess.run(["readelf", "-SW", str(lib)], check=True, capture_output=True, text=True).stdout
        names = set(re.findall(r"\]\s+(\.\S+)", sections))
        unstripped = sorted(n for n in names if n == ".symtab" or n.startswith(".debug"))
        if unstripped:
            fail(f"{lib.name}: not stripped, has {', '.join(unstripped)}")

        size = lib.stat().st_size
    print(
        f"check_wheel: {wheel.name}: tags {', '.join(tags)}; {lib.name} {size:,} bytes, stripped, "
        f"newest glibc symbol {'.'.join(map(str, needed[-1]))} (policy {args.glibc})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

"""Strips the native library inside a built wheel, in place, and rewrites the wheel's RECORD.

Why not maturin's `--strip`: that strips at link time, and the UniFFI generator maturin runs
afterwards reads the interface from the library's symbol table (`No UniFFI metadata found`).
Here the wheel is complete first; `strip --strip-unneeded` then drops the symbol table and the
debug info and keeps the dynamic symbols the generated module calls.

    python3 strip_wheel.py WHEEL
"""

import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    wheel = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with zipfile.ZipFile(wheel) as z:
            entries = [(info, z.read(info)) for info in z.infolist()]
        record_name = next(info.filename for info, _ in entries if info.filename.endswith(".dist-info/RECORD"))
        stripped = {}
        for info, data in entries:
            if info.filename.endswith(".so") or ".so." in info.filename:
                path = tmp / Path(info.filename).name
                path.write_bytes(data)
                subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
                stripped[info.filename] = path.read_bytes()
                print(f"strip_wheel: {info.filename}: {len(data):,} -> {len(stripped[info.filename]):,} bytes", file=sys.stderr)
        if not stripped:
            sys.exit(f"strip_wheel: no native library in {wheel.name}")
        out = tmp / wheel.name
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for info, data in entries:
                if info.filename == record_name:
                    lines = []
                    for line in data.decode().splitlines():
                        name = line.rsplit(",", 2)[0]
                        if name in stripped:
                            body = stripped[name]
                            line = f"{name},{record_hash(body)},{len(body)}"
                        lines.append(line)
                    data = ("\n".join(lines) + "\n").encode()
                elif info.filename in stripped:
                    data = stripped[info.filename]
                z.writestr(info, data)
        shutil.move(str(out), wheel)


if __name__ == "__main__":
    main()

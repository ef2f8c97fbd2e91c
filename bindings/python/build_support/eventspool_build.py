"""The PEP 517 build backend of the eventspool wheel: maturin's, with this folder first on PATH
so that maturin's UniFFI mode finds `uniffi-bindgen` here (the FFI crate's own generator; the
comment on its `[[bin]]` in bindings/ffi/Cargo.toml says why maturin would not find it alone)."""

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ["PATH"] = str(HERE) + os.pathsep + os.environ.get("PATH", "")
# An sdist keeps no mode bits: the generator script must be runnable for maturin to call it.
_bindgen = HERE / "uniffi-bindgen"
if _bindgen.exists() and not os.access(_bindgen, os.X_OK):
    _bindgen.chmod(0o755)

# Built from the sdist: maturin lays it out as the workspace (the FFI crate lives outside this
# folder) with a copy of pyproject.toml at its root whose paths (python-source) only hold from
# bindings/python. Build from there, as from a checkout.
if Path.cwd().resolve() != HERE.parent and (Path.cwd() / "bindings" / "python" / "pyproject.toml").exists():
    os.chdir(HERE.parent)

from maturin import (  # noqa: E402 - after PATH is set, for the maturin process it starts
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

"""The suite runs against the installed wheel: these fail when `eventspool` came from anywhere
but the virtualenv's site-packages (a generated eventspool.py on sys.path, a source checkout)."""

import importlib
import sys
import sysconfig
import warnings
from pathlib import Path

import eventspool
import eventspool.batching

SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"]).resolve()
PLATLIB = Path(sysconfig.get_paths()["platlib"]).resolve()


def _installed(path):
    path = Path(path).resolve()
    return path.is_relative_to(SITE_PACKAGES) or path.is_relative_to(PLATLIB)


def test_runs_in_a_virtualenv():
    assert sys.prefix != sys.base_prefix, f"not in a virtualenv: sys.prefix is {sys.prefix}"
    assert SITE_PACKAGES.is_relative_to(Path(sys.prefix).resolve())


def test_the_imported_package_is_the_installed_wheel():
    generated = importlib.import_module("eventspool._uniffi.eventspool")
    for module in (eventspool, eventspool.batching, generated):
        assert _installed(module.__file__), f"{module.__name__} imported from {module.__file__}, not from {SITE_PACKAGES}"
    package_dir = Path(eventspool.__file__).resolve().parent
    libraries = sorted(p.name for p in (package_dir / "_uniffi").glob("libeventspool_ffi.*"))
    assert libraries, f"no libeventspool_ffi in {package_dir / '_uniffi'}"
    # The generated loader opens the library beside itself: the one in the wheel.
    assert Path(generated.__file__).resolve().parent == package_dir / "_uniffi"


def test_the_package_exports_the_generated_api_and_the_tracker():
    generated = importlib.import_module("eventspool._uniffi.eventspool")
    assert set(generated.__all__) <= set(eventspool.__all__)
    for name in ("EventSpool", "SpoolConfig", "SpoolError", "DeliveryState", "HttpTransport", "BatchingTracker"):
        assert hasattr(eventspool, name), name
    assert eventspool.EventSpool is generated.EventSpool
    assert eventspool.BatchingTracker is eventspool.batching.BatchingTracker


def test_the_former_module_name_still_imports_and_warns():
    sys.modules.pop("eventspool_batching", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("eventspool_batching")
    assert _installed(old.__file__), old.__file__
    assert old.BatchingTracker is eventspool.BatchingTracker
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)

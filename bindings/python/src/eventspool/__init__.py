"""eventspool for Python: the UniFFI bindings of the `eventspool-ffi` crate (bindings/ffi).

The generated module and `libeventspool_ffi` live in `eventspool._uniffi`, written into the
wheel by maturin (`bindings = "uniffi"`, bindings/python/pyproject.toml) from the library it
ships with, so the two always match. Everything they export is re-exported here: an app
writes `eventspool.EventSpool`, `eventspool.SpoolConfig`, `eventspool.SpoolError.InvalidEvent`.
`BatchingTracker` (`eventspool.batching`) is the hand-written layer for high tracking rates.
"""

from ._uniffi.eventspool import *  # noqa: F401,F403 - the generated API is the package's API
from ._uniffi.eventspool import __all__ as _generated
from .batching import BatchingTracker

__all__ = [*_generated, "BatchingTracker"]

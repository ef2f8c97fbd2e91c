"""The former home of `BatchingTracker`, kept so `import eventspool_batching` goes on working.

New code imports `from eventspool import BatchingTracker` (or `eventspool.batching`).
"""

import warnings

from eventspool.batching import MAX_NAME_BYTES, BatchingTracker  # noqa: F401

warnings.warn(
    "eventspool_batching is now eventspool.batching: `from eventspool import BatchingTracker`",
    DeprecationWarning,
    stacklevel=2,
)

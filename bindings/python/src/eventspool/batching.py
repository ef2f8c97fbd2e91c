"""Tracking at a high rate from Python: `eventspool.batching.BatchingTracker`.

Every call across the generated UniFFI glue costs microseconds of Python (handle clone, buffer
allocation per string, the call, freeing the result), several times what the SDK itself spends
on an event. `BatchingTracker.track()` only serializes the event and appends it to a list; a
background thread hands the gathered events to `EventSpool.track_batch` in one call, at most
`max_delay_s` after the first of them (or sooner, once `max_events` are waiting).

What this trades, on purpose:
- An event is in the spool (and so in its memory queue or store) about `max_delay_s` after
  `track()` returned (the bound is below); `flush()`, `close()` and interpreter exit hand over
  what is waiting, and `flush()` returns only once everything tracked before it is in the spool.
- What it holds is bounded: at most `max_held` events (default 4 x `max_events`) are outside
  the spool at any moment, counting those waiting here and those inside a hand-over that has
  not returned, for any number of tracking threads. A `track()` that finds `max_held` there
  hands the waiting events over itself before returning, or waits for the hand-over in
  progress (back-pressure on a thread that tracks faster than the spool takes them; nothing is
  dropped). Each call to the spool carries at most `max_events` events, and one hand-over runs
  at a time, so the spool takes the events in the order `track()` accepted them.
- When the process dies:
  - a normal exit (atexit), `close()` and `flush()` hand everything over; from then on the
    spool's `durability` decides (README "What is durable when");
  - a hard kill (SIGKILL, a crash, `os._exit`, power loss) loses what the tracker holds, on top
    of what the spool itself would lose: at most `max_held` events (2,048 with the defaults;
    `held()` says how many now), and only events whose `track()` returned less than
    `max_delay_s` (50 ms by default) plus the time the spool takes to record `max_held` events
    (the hand-over in progress and the event's own, in `track_batch` calls of `max_events`)
    before the kill. A spool slower than the tracking thread makes `track()` block instead of
    holding more. `track_batch` is all or none, so an event inside the call at the kill is
    either recorded or not.
  - with `durability = always`, an event is stored once its hand-over returned, not when
    `track()` returned: call `flush()` where the app needs that guarantee.
- The event's timestamp is the time of the `track()` call (taken then, formatted later).
- Bad input that Python can see (empty or over-long name, properties that are not a dict or not
  JSON-serializable, a NaN or infinite float, named by its key path) raises at `track()`. Anything the SDK refuses later (an event over
  `max_event_bytes`, a malformed explicit `event_id`) is reported by `errors()` and skipped,
  without holding back the good events gathered with it.

    spool = eventspool.EventSpool(config)
    with BatchingTracker(spool) as tracker:
        tracker.track("file_opened", {"kind": "csv", "rows": 1200})
"""

import atexit
import json
import math
import threading
import time

MAX_NAME_BYTES = 256


def _timestamp(t):
    ms = int(t * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + ".%03dZ" % (ms % 1000)


def _non_finite(value, path):
    """The key path and the value of the first float JSON has no number for, or None."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return path, value
    if isinstance(value, dict):
        for key, item in value.items():
            found = _non_finite(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _non_finite(item, f"{path}[{i}]")
            if found:
                return found
    return None


def _non_finite_message(properties):
    found = _non_finite(properties, "")
    if not found:
        return "properties hold a float JSON has no number for (NaN or infinity)"
    path, value = found
    word = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return f"property {path}: {word} is not a JSON number (send None, or a string)"


class BatchingTracker:
    """Gathers events in Python and hands them to the spool in batches (module docstring: what
    it trades, what a crash can lose: at most `max_held` events of the last ~`max_delay_s`)."""

    def __init__(self, spool, max_events=512, max_delay_s=0.05, max_held=None):
        if max_held is None:
            max_held = 4 * max_events
        if max_events < 1 or max_delay_s <= 0 or max_held < max_events:
            raise ValueError("max_events must be >= 1, max_delay_s > 0 and max_held >= max_events")
        self._spool = spool
        self._max_events = max_events
        self._max_held = max_held
        self._max_delay_s = max_delay_s
        self._waiting = []  # (line without timestamp, time.time(), has_timestamp)
        self._handing = 0  # events taken out of _waiting whose hand-over has not returned
        self._errors = []
        lock = threading.Lock()
        self._wake = threading.Condition(lock)  # the background thread: events are waiting
        self._idle = threading.Condition(lock)  # no hand-over in progress any more
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="eventspool-batching", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def track(self, name, properties=None, *, timestamp=None, event_id=None, session_id=None):
        """Queues one event; raises ValueError/TypeError for input Python can check, and
        RuntimeError once the tracker is closed (the event was not taken)."""
        if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"name must be a non-empty string of at most {MAX_NAME_BYTES} bytes")
        if properties is None:
            properties = {}
        elif not isinstance(properties, dict):
            raise TypeError(f"properties must be a dict, got {type(properties).__name__}")
        event = {"name": name, "properties": properties}
        if timestamp is not None:
            event["timestamp"] = timestamp
        if event_id is not None:
            event["event_id"] = event_id
        if session_id is not None:
            event["session_id"] = session_id
        try:
            # allow_nan=False: json.dumps would write NaN / Infinity, which no JSON parser reads.
            line = json.dumps(event, separators=(",", ":"), allow_nan=False)  # TypeError for what JSON cannot hold
        except ValueError:
            raise ValueError(_non_finite_message(properties)) from None
        item = (line, time.time(), timestamp is not None)
        # Each turn either takes the event, waits for the hand-over in progress to return, or
        # hands the waiting events over on this thread: a hand-over returns, so this ends.
        while True:
            with self._wake:
                if self._closed:
                    raise RuntimeError("the tracker is closed")
                if len(self._waiting) + self._handing < self._max_held:
                    self._waiting.append(item)
                    if len(self._waiting) == 1 or len(self._waiting) == self._max_events:
                        self._wake.notify()
                    return
                if self._handing:
                    self._idle.wait()
                    continue
                # Full and nobody is handing over: the background thread is behind.
                batch = self._take()
            self._hand_over(batch)

    def held(self):
        """How many events are outside the spool now: waiting here or inside a hand-over that
        has not returned (what a hard kill would lose on top of the spool's own)."""
        with self._wake:
            return len(self._waiting) + self._handing

    def flush(self):
        """Hands everything waiting to the spool now, after any hand-over in progress; returns
        how many events this call recorded. Everything tracked before it is then in the spool."""
        with self._wake:
            while self._handing:
                self._idle.wait()
            batch = self._take()
        return self._hand_over(batch)

    def errors(self):
        """Events the SDK refused after `track()` returned: (error text, event line) pairs."""
        with self._wake:
            errors, self._errors = self._errors, []
        return errors

    def close(self):
        """Hands over what is waiting and stops the background thread (the spool stays open)."""
        with self._wake:
            if self._closed:
                return
            self._closed = True
            self._wake.notify()
            self._idle.notify_all()
        self._thread.join(timeout=5)
        self.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _take(self):
        """Moves what is waiting into a hand-over (the caller holds the lock and has checked that
        none is in progress, so hand-overs run one at a time, in order)."""
        batch, self._waiting = self._waiting, []
        self._handing = len(batch)
        return batch

    def _run(self):
        while True:
            with self._wake:
                while not self._waiting and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                deadline = time.monotonic() + self._max_delay_s
                while len(self._waiting) < self._max_events and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                while self._handing and not self._closed:
                    self._idle.wait()
                if self._closed:
                    return  # close() hands over the rest
                if not self._waiting:
                    continue  # the hand-over that just ended took them
                batch = self._take()
            self._hand_over(batch)

    def _hand_over(self, batch):
        """Hands events to the spool in calls of at most `max_events`; returns how many it took.
        Ends the hand-over `_take` began, whatever the spool did."""
        recorded = 0
        try:
            for start in range(0, len(batch), self._max_events):
                recorded += self._hand_over_chunk(batch[start:start + self._max_events])
        finally:
            with self._wake:
                self._handing = 0
                self._idle.notify_all()
        return recorded

    def _hand_over_chunk(self, waiting):
        if not waiting:
            return 0
        lines = [line if has_ts else '{"timestamp":"%s",%s' % (_timestamp(t), line[1:])
                 for line, t, has_ts in waiting]
        try:
            return self._spool.track_batch("\n".join(lines))
        except Exception:  # one bad event: isolate it, keep the rest
            recorded = 0
            for line in lines:
                try:
                    recorded += self._spool.track_batch(line)
                except Exception as e:  # noqa: BLE001 - reported through errors()
                    with self._wake:
                        self._errors.append((str(e), line))
            return recorded

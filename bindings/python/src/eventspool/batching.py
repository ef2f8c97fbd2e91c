"""Tracking at a high rate from Python.

Every call across the generated UniFFI glue costs microseconds of Python (handle clone, buffer
allocation per string, the call, freeing the result), several times what the SDK itself spends
on an event. `BatchingTracker.track()` only serializes the event and appends it to a list; a
background thread hands the gathered events to `EventSpool.track_batch` in one call, at most
`max_delay_s` after the first of them (or sooner, once `max_events` are waiting).

What this trades, on purpose:
- An event is in the spool (and so in its memory queue or store) up to `max_delay_s` after
  `track()` returned; `flush()`, `close()` and interpreter exit hand over what is waiting.
- What it holds is bounded: at most `max_held` events wait here (default 4 x `max_events`).
  A `track()` that finds that many waiting hands them over itself before returning
  (back-pressure on a thread that tracks faster than the spool takes them), and each call to
  the spool carries at most `max_events` events.
- At process death: a normal exit (atexit), `close()` and `flush()` hand everything over; a
  hard kill (SIGKILL, a crash) loses what was waiting here, at most `max_held` events plus the
  chunk being handed over, whatever the spool's `durability`.
- The event's timestamp is the time of the `track()` call (taken then, formatted later).
- Bad input that Python can see (empty or over-long name, properties that are not a dict or not
  JSON-serializable) raises at `track()`. Anything the SDK refuses later (an event over
  `max_event_bytes`, a malformed explicit `event_id`) is reported by `errors()` and skipped,
  without holding back the good events gathered with it.

    spool = eventspool.EventSpool(config)
    with BatchingTracker(spool) as tracker:
        tracker.track("file_opened", {"kind": "csv", "rows": 1200})
"""

import atexit
import json
import threading
import time

MAX_NAME_BYTES = 256


def _timestamp(t):
    ms = int(t * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + ".%03dZ" % (ms % 1000)


class BatchingTracker:
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
        self._errors = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="eventspool-batching", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def track(self, name, properties=None, *, timestamp=None, event_id=None, session_id=None):
        """Queues one event; raises ValueError/TypeError for input Python can check."""
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
        line = json.dumps(event, separators=(",", ":"))  # TypeError for what JSON cannot hold
        full = None
        with self._cond:
            if self._closed:
                raise RuntimeError("the tracker is closed")
            self._waiting.append((line, time.time(), timestamp is not None))
            if len(self._waiting) >= self._max_held:
                # The background thread is behind: this thread hands over what waits itself.
                full, self._waiting = self._waiting, []
            elif len(self._waiting) == 1 or len(self._waiting) >= self._max_events:
                self._cond.notify()
        if full:
            self._hand_over(full)

    def flush(self):
        """Hands everything waiting to the spool now; returns how many events it recorded."""
        with self._cond:
            waiting, self._waiting = self._waiting, []
        return self._hand_over(waiting)

    def errors(self):
        """Events the SDK refused after `track()` returned: (error text, event line) pairs."""
        with self._cond:
            errors, self._errors = self._errors, []
        return errors

    def close(self):
        """Hands over what is waiting and stops the background thread (the spool stays open)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _run(self):
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                deadline = time.monotonic() + self._max_delay_s
                while len(self._waiting) < self._max_events and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                waiting, self._waiting = self._waiting, []
            self._hand_over(waiting)

    def _hand_over(self, waiting):
        """Hands events to the spool in calls of at most `max_events`; returns how many it took."""
        recorded = 0
        for start in range(0, len(waiting), self._max_events):
            recorded += self._hand_over_chunk(waiting[start:start + self._max_events])
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
                    with self._cond:
                        self._errors.append((str(e), line))
            return recorded

"""Fixtures: the reference collector as a real separate process (so an outage is a killed
process and a refused port), and spool configs with millisecond backoffs so the retry story
takes well under a second."""

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
COLLECTOR = os.environ.get("EVENTSPOOL_COLLECTOR", str(ROOT / "target/debug/examples/collector_process"))


class Collector:
    """`collector_process` on 127.0.0.1; `stop()` is an outage, `start()` the recovery on the
    same port with the same database, so events stored before the outage still count."""

    def __init__(self, db_path):
        self.db_path = str(db_path)
        self.port = 0
        self.url = None
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [COLLECTOR, "--listen", f"127.0.0.1:{self.port}", "--db", self.db_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self.proc.kill()
            raise RuntimeError(f"collector did not start: {line!r}")
        self.url = line
        self.port = int(line.split(":")[2].split("/")[0])
        return self

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def stats(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=5) as r:
            return json.load(r)

    def distinct(self):
        return self.stats()["distinct"]

    def wait_distinct(self, n, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.distinct() >= n:
                return True
            time.sleep(0.02)
        return False


@pytest.fixture
def collector(tmp_path):
    c = Collector(tmp_path / "collector.db").start()
    yield c
    c.stop()


@pytest.fixture
def fast_config(tmp_path):
    """A config whose retries take milliseconds: base 50 ms, cap 200 ms, 3 automatic attempts."""
    import eventspool

    def make(url, **overrides):
        fields = dict(
            endpoint=url,
            db_path=str(tmp_path / "events.db"),
            backoff_base_ms=50,
            backoff_cap_ms=200,
            max_auto_attempts=3,
            min_batch_interval_ms=0,
            attempt_timeout_ms=2000,
            flush_interval_ms=3_600_000,
        )
        fields.update(overrides)
        return eventspool.SpoolConfig(**fields)

    return make


def wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False

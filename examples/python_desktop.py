"""A desktop tool using eventspool from Python: track while offline, go online, watch the
delivery state, drain, shut down.

    python3 -m venv /tmp/es && /tmp/es/bin/pip install ./bindings/python
    cargo build --example collector_process
    /tmp/es/bin/python examples/python_desktop.py

Starts the reference collector on loopback as a child process, so it runs anywhere.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import eventspool

ROOT = Path(__file__).resolve().parents[1]


class PrintStatus(eventspool.DeliveryObserver):
    """Called on the SDK's delivery thread: a GUI would hand the status to its UI thread here."""

    def on_state(self, status):
        print(f"  state: {status.summary}", file=sys.stderr)

    def on_notice(self, notice):
        print(f"  notice: {notice}", file=sys.stderr)


def main():
    collector = subprocess.Popen(
        [str(ROOT / "target/debug/examples/collector_process"), "--listen", "127.0.0.1:0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    url = collector.stdout.readline().strip()
    with tempfile.TemporaryDirectory() as tmp:
        config = eventspool.SpoolConfig(endpoint=url, db_path=f"{tmp}/events.db", min_batch_interval_ms=0)
        spool = eventspool.EventSpool(config, observer=PrintStatus(), start_offline=True)
        try:
            for i in range(500):
                spool.track("file_opened", json.dumps({"kind": ["txt", "csv", "png"][i % 3], "n": i}))
            print(f"tracked offline: {spool.stats().pending} pending", file=sys.stderr)

            spool.set_online(True)
            drained = spool.wait_drained(30_000)
            stats = spool.stats()
            print(json.dumps({"drained": drained, "delivered": stats.delivered, "pending": stats.pending}))
        except eventspool.SpoolError as e:
            print(f"eventspool: {e}", file=sys.stderr)
            return 1
        finally:
            spool.shutdown(5_000)  # persists anything left and releases the store
            collector.stdin.close()
            collector.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tests' --verify-cmd for `eventspool conformance` (docs/cli.md §conformance).

Reads event ids on stdin, one per line, and prints `EVENT_ID COUNT` for each one stored:
  read_back.py sqlite DB     the reference collector's --db file (table events)
  read_back.py lines FILE    a file with one line per stored copy (the tests' small collector)
"""
import sqlite3
import sys

kind, path = sys.argv[1], sys.argv[2]
ids = [line.strip() for line in sys.stdin if line.strip()]
if kind == "sqlite":
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    for event_id in ids:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM events WHERE event_id = ?", (event_id,)
        ).fetchone()
        if count:
            print(event_id, count)
elif kind == "lines":
    counts = {}
    with open(path) as stored:
        for line in stored:
            counts[line.strip()] = counts.get(line.strip(), 0) + 1
    for event_id in ids:
        if event_id in counts:
            print(event_id, counts[event_id])
else:
    sys.exit(f"unknown kind {kind!r}: sqlite or lines")

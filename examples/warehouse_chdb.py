"""The warehouse stage on one machine: loads the JSON lines of `stream_to_warehouse` into an
in-process ClickHouse (chdb, `pip install chdb`) table `ReplacingMergeTree ORDER BY (project,
event_id)`, which removes the copies that reached the stream later than JetStream's duplicate
window. The key is the project and the id together, as in the stream's `Nats-Msg-Id`: two apps
that send the same id keep both events.

    cargo run --all-features --example stream_to_warehouse -- --nats URL --stream NAME \
        | python3 examples/warehouse_chdb.py DB_DIR

Prints one JSON line: rows stored, rows seen by a query with FINAL (one per project and
event_id), and exact distinct (project, event_id) pairs. With `--ids FILE` it also writes the
(project:event_id, copies) of every row seen with FINAL to FILE, one per line, so a test can
check each event is there exactly once. Queries must use FINAL (or GROUP BY event_id): merges happen in the
background, so without it a duplicate can still be counted.
"""

import json
import sys

from chdb import session

TABLE = """
CREATE TABLE IF NOT EXISTS eventspool.events (
    project LowCardinality(String),
    event_id UUID,
    name String,
    timestamp DateTime64(3, 'UTC'),
    session_id Nullable(String),
    properties String,
    stream_seq UInt64
) ENGINE = ReplacingMergeTree ORDER BY (project, event_id)
"""


def main() -> None:
    args = sys.argv[1:]
    ids_file = None
    if len(args) == 3 and args[1] == "--ids":
        ids_file = args[2]
        args = args[:1]
    if len(args) != 1:
        sys.exit("usage: warehouse_chdb.py DB_DIR [--ids FILE] < rows.jsonl")
    rows = sys.stdin.read()
    s = session.Session(args[0])
    s.query("CREATE DATABASE IF NOT EXISTS eventspool")
    s.query(TABLE)
    if rows.strip():
        s.query(
            "INSERT INTO eventspool.events SETTINGS date_time_input_format = 'best_effort' "
            "FORMAT JSONEachRow\n" + rows
        )

    def count(sql: str) -> int:
        return int(str(s.query(sql, "CSV")).strip())

    print(
        json.dumps(
            {
                "rows": count("SELECT count() FROM eventspool.events"),
                "final": count("SELECT count() FROM eventspool.events FINAL"),
                "distinct": count(
                    "SELECT uniqExact(project, event_id) FROM eventspool.events"
                ),
            }
        )
    )
    if ids_file:
        out = str(
            s.query(
                "SELECT concat(project, ':', toString(event_id)), count() "
                "FROM eventspool.events FINAL GROUP BY project, event_id",
                "TSV",
            )
        )
        with open(ids_file, "w") as f:
            f.write(out)
    s.close()


if __name__ == "__main__":
    main()

"""The warehouse stage on one machine: loads the JSON lines of `stream_to_warehouse` into an
in-process ClickHouse (chdb, `pip install chdb`) table `ReplacingMergeTree ORDER BY event_id`,
which removes the copies that reached the stream later than JetStream's duplicate window.

    cargo run --all-features --example stream_to_warehouse -- --nats URL --stream NAME \
        | python3 examples/warehouse_chdb.py DB_DIR

Prints one JSON line: rows stored, rows seen by a query with FINAL (one per event_id), and
exact distinct ids. Queries must use FINAL (or GROUP BY event_id): merges happen in the
background, so without it a duplicate can still be counted.
"""

import json
import sys

from chdb import session

TABLE = """
CREATE TABLE IF NOT EXISTS eventspool.events (
    event_id UUID,
    name String,
    timestamp DateTime64(3, 'UTC'),
    session_id Nullable(String),
    properties String,
    stream_seq UInt64
) ENGINE = ReplacingMergeTree ORDER BY event_id
"""


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: warehouse_chdb.py DB_DIR < rows.jsonl")
    rows = sys.stdin.read()
    s = session.Session(sys.argv[1])
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
                "distinct": count("SELECT uniqExact(event_id) FROM eventspool.events"),
            }
        )
    )
    s.close()


if __name__ == "__main__":
    main()

"""Writers survive an upgrade on PostgreSQL (issue 13, item 2).

Eight writer processes append through the Store API for 60 s while `upgrade` applies the
revision that builds the two search indexes (CREATE INDEX CONCURRENTLY) on the table they
write. No writer may see an error, no row may be lost, and afterwards search finds every
writer's marker word.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from hermes_store import migrate
from hermes_store.engine import create_store_engine
from hermes_store.search import search_messages

pytestmark = [pytest.mark.postgresql, pytest.mark.slow]

WRITERS = 8
SECONDS = 60.0

#: One writer: appends with its marker word until the time is up, one commit per message;
#: prints how many it appended and the errors it met (their class names).
WRITER = """
import json, sys, time
from hermes_store.store import NewMessage, Store
url, number, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
marker = f"writermarker{number}"
appended, errors = 0, []
with Store.open(url) as store:
    store.create_session(f"writer-{number}", "cli")
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            store.append_message(
                f"writer-{number}", NewMessage("user", f"{marker} message {appended}")
            )
            appended += 1
        except Exception as exc:  # counted, not raised: the test says which
            errors.append(type(exc).__name__)
            time.sleep(0.05)
print(json.dumps({"appended": appended, "errors": errors}), flush=True)
"""


def test_eight_writers_keep_writing_while_the_search_indexes_are_built(pg_url: str) -> None:
    migrate.upgrade(pg_url, revision="30")  # the relational schema; no search indexes yet
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, pg_url, str(number), str(SECONDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for number in range(WRITERS)
    ]
    for writer in writers:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
    time.sleep(SECONDS / 4)  # the table fills while the writers run
    result = migrate.upgrade(pg_url)  # fts1 (CONCURRENTLY) and the merge, under writes
    assert result.after == (migrate.head_revision(),)
    reports = []
    for writer in writers:
        out, err = writer.communicate(timeout=SECONDS * 3)
        assert writer.returncode == 0, err[-2000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))

    assert [report["errors"] for report in reports] == [[]] * WRITERS
    engine = create_store_engine(pg_url, create=False)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT session_id, count(*) FROM messages GROUP BY 1"))
        counts = {str(session): int(count) for session, count in rows}
        assert counts == {f"writer-{n}": reports[n]["appended"] for n in range(WRITERS)}
        invalid = conn.execute(
            text("SELECT count(*) FROM pg_index WHERE NOT indisvalid OR NOT indisready")
        ).scalar_one()
        assert invalid == 0
        for number in range(WRITERS):
            hits = search_messages(conn, f"writermarker{number}", limit=-1)
            assert len(hits) == reports[number]["appended"] > 0
    engine.dispose()
    print(f"appended while upgrading: {sorted(r['appended'] for r in reports)}")

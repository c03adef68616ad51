"""pepsi-queue enqueue STAGE - with many JSON lines: progress, a count, all or nothing."""

from __future__ import annotations

import os
import subprocess

import psycopg
from dispatch_harness import VENV_BIN

QUEUE = VENV_BIN / "pepsi-queue"


def enqueue_stdin(dsn: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(QUEUE), "enqueue", "bulk", "-", "--force", "-q"],
        input=text,
        env={**os.environ, "PEPSI_DSN": dsn, "PEPSI_CONFIG": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )


def count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'bulk'").fetchone()[0]


def test_a_large_enqueue_from_stdin_ends_with_its_count(dsn: str, conn: psycopg.Connection) -> None:
    n = 60_000
    out = enqueue_stdin(dsn, "".join(f'{{"n": {i}}}\n' for i in range(n)))
    assert out.returncode == 0, out.stderr
    assert f"enqueued {n:,} message(s) at stage bulk" in out.stderr
    assert out.stdout.strip() == f"enqueued {n} message(s) at stage bulk"
    assert count(conn) == n
    first, last = conn.execute(
        "SELECT min(payload->>'n'), max((payload->>'n')::int) FROM pepsi.workqueue"
    ).fetchone()
    assert last == n - 1


def test_a_bad_line_is_named_and_nothing_is_enqueued(dsn: str, conn: psycopg.Connection) -> None:
    lines = [f'{{"n": {i}}}\n' for i in range(30_000)]
    lines[23_456] = '{"n": oops}\n'
    out = enqueue_stdin(dsn, "".join(lines))
    assert out.returncode != 0
    assert "line 23457" in out.stderr, out.stderr
    assert count(conn) == 0, "all or nothing: no message of the input was enqueued"


def enqueue_args(dsn: str, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(QUEUE), "enqueue", "bulk", "-", "--force", *args],
        input=text,
        env={**os.environ, "PEPSI_DSN": dsn, "PEPSI_CONFIG": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_bad_line_in_a_later_chunk_leaves_nothing_of_the_input(
    dsn: str, conn: psycopg.Connection
) -> None:
    """Chunks of 1,000 lines in one transaction: the bad line is in the 8th; what,
    where and how to fix are said, and the 7 chunks before it are not enqueued."""
    lines = [f'{{"n": {i}}}\n' for i in range(10_000)]
    lines[7_500] = "[7500]\n"
    lines[3] = "\n"  # a blank line is skipped and counted
    out = enqueue_args(dsn, "".join(lines), "-q", "--chunk-size", "1000")
    assert out.returncode == 2, out.stderr
    assert "stdin line 7501 must be a JSON object, not a JSON array" in out.stderr, out.stderr
    assert "wrap the value in an object" in out.stderr
    assert count(conn) == 0


def test_a_line_that_is_not_json_is_named_with_what_is_wrong(
    dsn: str, conn: psycopg.Connection
) -> None:
    out = enqueue_args(dsn, '{"n": 1}\n{"n": 2,}\n', "-q")
    assert out.returncode == 2
    assert 'stdin line 2 is not JSON: Expected string, but found "}".' in out.stderr, out.stderr
    assert "nothing of this call was enqueued" in out.stderr
    assert count(conn) == 0


def test_a_number_jsonb_cannot_hold_is_named(dsn: str, conn: psycopg.Connection) -> None:
    """Python's json reads 1e999999 (as inf), jsonb refuses it: the COPY is
    refused, and the statements that then run name the line."""
    out = enqueue_args(dsn, '{"n": 1}\n\n{"n": 1e999999}\n{"n": 4}\n', "-q")
    assert out.returncode == 2, out.stderr
    assert "stdin line 3 holds a number jsonb cannot store" in out.stderr, out.stderr
    assert "nothing of this call was enqueued" in out.stderr
    assert count(conn) == 0


def test_a_line_nested_too_deeply_for_jsonb_is_named(dsn: str, conn: psycopg.Connection) -> None:
    """The COPY's parse raises 54001 (not a DataError): the statements that then
    run name the line, counted on stdin (a blank line before it included)."""
    deep = '{"deep": ' + "[" * 300_000 + "]" * 300_000 + "}"
    out = enqueue_args(dsn, '{"n": 1}\n\n' + deep + "\n", "-q")
    assert out.returncode == 2, out.stderr
    assert "stdin line 3 is nested too deeply for jsonb" in out.stderr, out.stderr[:500]
    assert count(conn) == 0


def test_a_line_that_is_not_utf8_is_named(dsn: str, conn: psycopg.Connection) -> None:
    out = subprocess.run(
        [str(QUEUE), "enqueue", "bulk", "-", "--force", "-q"],
        input=b'{"n": 1}\n{"n": 2}\n{"s": "\xff"}\n',
        env={**os.environ, "PEPSI_DSN": dsn, "PEPSI_CONFIG": ""},
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert b"stdin line 3 is not UTF-8" in out.stderr, out.stderr
    assert count(conn) == 0


def test_a_byte_order_mark_before_the_first_line_is_not_part_of_it(
    dsn: str, conn: psycopg.Connection
) -> None:
    """A UTF-8 file saved with a byte order mark (PowerShell 5's ``Out-File
    -Encoding utf8``, some editors): its first line is enqueued as written, by
    the lines' path and by the one that parses each line (--key). A mark
    anywhere else is still refused."""
    bom = "\ufeff"
    out = enqueue_args(dsn, bom + '{"n": 1}\n{"n": 2}\n', "-q")
    assert out.returncode == 0, out.stderr
    out = enqueue_args(dsn, bom + '{"n": 3}\n', "-q", "--key", "k-3")
    assert out.returncode == 0, out.stderr
    payloads = conn.execute(
        "SELECT payload FROM pepsi.workqueue WHERE stage = 'bulk' ORDER BY workqueue_id"
    ).fetchall()
    assert [p[0] for p in payloads] == [{"n": 1}, {"n": 2}, {"n": 3}]
    out = enqueue_args(dsn, '{"n": 4}\n' + bom + '{"n": 5}\n', "-q")
    assert out.returncode == 2
    assert "stdin line 2 is not JSON" in out.stderr, out.stderr
    assert count(conn) == 3


def test_keys_from_a_field_and_a_priority_land(dsn: str, conn: psycopg.Connection) -> None:
    held = conn.execute("SELECT pepsi.enqueue('bulk', '{}', dedupe_key => 'order-2')").fetchone()[0]
    text = "".join(f'{{"order": "order-{i % 5}"}}\n' for i in range(10)) + "{}\n"
    out = enqueue_args(dsn, text, "--key-field", "order", "--priority", "7")
    assert out.returncode == 0, out.stderr
    ids = [int(x) for x in out.stdout.split()]
    assert len(ids) == 11, "one id per line"
    assert ids[2] == ids[7] == held, "a key a live message holds: that message's id"
    assert ids[0] == ids[5] and ids[1] == ids[6], "a key twice in the input: one message"
    rows = conn.execute(
        "SELECT dedupe_key, priority FROM pepsi.workqueue WHERE stage = 'bulk'"
        " AND workqueue_id <> %s ORDER BY workqueue_id",
        (held,),
    ).fetchall()
    assert rows == [(f"order-{i}", 7) for i in (0, 1, 3, 4)] + [(None, 7)]
    out = enqueue_args(dsn, "{}\n", "--key-field", "order", "--key", "x")
    assert out.returncode == 2 and "cannot be combined" in out.stderr


def test_progress_between_chunks_and_the_count_at_the_end(
    dsn: str, conn: psycopg.Connection
) -> None:
    """What a million lines show, with chunks of 2,000 and progress at every chunk."""
    n = 20_000
    text = "".join(f'{{"n": {i}}}\n' for i in range(n))
    out = enqueue_args(dsn, text, "-q", "--chunk-size", "2000", "--progress-every", "0")
    assert out.returncode == 0, out.stderr
    progress = [line for line in out.stderr.splitlines() if " of 20,000" in line]
    assert progress[0].endswith("enqueued 2,000 of 20,000"), out.stderr
    assert len(progress) == 9, out.stderr  # 2,000 .. 18,000; the last chunk says the total
    assert out.stderr.splitlines()[-1].endswith("enqueued 20,000 message(s) at stage bulk")
    assert out.stdout.strip() == f"enqueued {n} message(s) at stage bulk"
    assert count(conn) == n
    order = conn.execute(
        "SELECT bool_and(n = r) FROM (SELECT (payload->>'n')::int AS n,"
        " row_number() OVER (ORDER BY workqueue_id) - 1 AS r FROM pepsi.workqueue) AS x"
    ).fetchone()[0]
    assert order, "ids ascend in line order across chunks"


def test_the_closing_count_is_what_went_in(dsn: str, conn: psycopg.Connection) -> None:
    """A line of U+3000 alone is blank to the database (its locale) but not to
    Python's ASCII test: the count said is the count inserted, not the guess."""
    text = '{"n": 1}\n\u3000\n{"n": 2}\n\u2003\n{"n": 3}\n'
    out = enqueue_args(dsn, text, "--chunk-size", "2", "--progress-every", "0")
    inserted = count(conn)
    if out.returncode == 0:
        assert f"enqueued {inserted:,} message(s) at stage bulk" in out.stderr, out.stderr
        assert len(out.stdout.split()) == inserted
    else:  # a locale whose whitespace is narrower: the line is named, nothing in
        assert "is not JSON" in out.stderr and inserted == 0, out.stderr


def test_every_id_reaches_stdout_and_blank_lines_are_not_counted(
    dsn: str, conn: psycopg.Connection
) -> None:
    """The command ends without the interpreter's teardown: what it printed is
    flushed all the same, to the last id. Blank lines among the objects (the
    total is then counted line by line) are skipped, and the progress total
    says so."""
    n = 30_000
    lines = [f'{{"n": {i}}}\n' for i in range(n)]
    lines[100:100] = ["\n", "  \t\n"]
    out = enqueue_args(dsn, "".join(lines), "--chunk-size", "5000", "--progress-every", "0")
    assert out.returncode == 0, out.stderr
    ids = [int(x) for x in out.stdout.split()]
    assert len(ids) == n == count(conn) and out.stdout.endswith("\n")
    assert ids == sorted(ids)
    assert f"enqueued 4,998 of {n:,}" in out.stderr, out.stderr  # chunks count lines
    with_ids = conn.execute(
        "SELECT count(*) FROM pepsi.workqueue WHERE workqueue_id = ANY(%s)", (ids,)
    )
    assert with_ids.fetchone()[0] == n

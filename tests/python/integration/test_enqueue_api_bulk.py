"""pepsi_dispatch.enqueue.enqueue_many and enqueue_lines, by COPY and by pepsi.enqueue_lines."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pepsi_dispatch import enqueue as enqueue_module
from pepsi_dispatch.enqueue import enqueue, enqueue_lines, enqueue_many


def test_enqueue_many_keys_and_priority_land_in_order(conn: psycopg.Connection) -> None:
    held = conn.execute("SELECT pepsi.enqueue('s', '{}', dedupe_key => 'k-3')").fetchone()[0]
    docs = [{"n": i, "s": 'é\\\t\n"x'} for i in range(25)] + [None]
    keys = [f"k-{i}" if i % 2 else None for i in range(25)] + ["k-1"]
    ids = enqueue_many(conn, "s", docs, chunk_size=7, priority=-2, dedupe_keys=keys)
    assert len(ids) == 26
    assert ids[3] == held, "a key a live message holds: that message's id"
    assert ids[25] == ids[1], "a key an earlier element took (in another chunk): its id"
    new = [i for n, i in enumerate(ids) if n not in (3, 25)]
    assert new == sorted(new), "ids ascend in payload order"
    rows = conn.execute(
        "SELECT payload, priority, dedupe_key FROM pepsi.workqueue"
        " WHERE workqueue_id = ANY(%s) ORDER BY workqueue_id",
        (new,),
    ).fetchall()
    assert [r[0] for r in rows] == [d for n, d in enumerate(docs[:25]) if n != 3]
    assert {r[1] for r in rows} == {-2}
    assert [r[2] for r in rows] == [k for n, k in enumerate(keys[:25]) if n != 3]


def test_enqueue_many_refuses_a_non_object_before_asking(conn: psycopg.Connection) -> None:
    with pytest.raises(ValueError, match="payload 4 must be a JSON object"):
        enqueue_many(conn, "s", [{}, {}, {}, [1]], chunk_size=10)
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 0


def test_enqueue_lines_is_all_or_nothing_across_chunks(conn: psycopg.Connection) -> None:
    lines = [f'{{"n": {i}}}' for i in range(50)]
    lines[42] = '"just a string"'
    seen: list[int] = []
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="line 43 must be a JSON object"):
        enqueue_lines(conn, "s", lines, chunk_size=10, progress=seen.append)
    assert seen == [10, 20, 30, 40], "progress after each chunk that went in"
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 0
    lines[42] = ""
    ids = enqueue_lines(conn, "s", lines, chunk_size=10, key_field="n")
    assert len(ids) == 49
    assert (
        conn.execute("SELECT count(DISTINCT dedupe_key) FROM pepsi.workqueue").fetchone()[0] == 49
    )


# -- the COPY path --------------------------------------------------------------------


@pytest.fixture
def login(conn: psycopg.Connection, dsn: str) -> Iterator[Callable[[str], str]]:
    """make(sql granting a fresh login role) -> that role's DSN; roles dropped after."""
    made: list[str] = []

    def make(grant: str) -> str:
        name = f"producer_{uuid.uuid4().hex[:8]}"
        conn.execute(f"CREATE ROLE {name} LOGIN")
        conn.execute(grant.format(role=name))
        made.append(name)
        return make_conninfo(dsn, user=name)

    yield make
    for name in made:
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")


def _no_statement_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("went through pepsi.enqueue_lines, not COPY")

    monkeypatch.setattr(enqueue_module, "_send", refuse)


def _rows(conn: psycopg.Connection, ids: list[int]) -> list[tuple]:
    return conn.execute(
        "SELECT workqueue_id, stage, status, priority, payload, dedupe_key FROM pepsi.workqueue"
        " WHERE workqueue_id = ANY(%s) ORDER BY workqueue_id",
        (ids,),
    ).fetchall()


def test_a_producer_role_copies_and_gets_its_ids_in_order(
    conn: psycopg.Connection, login: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_statement_path(monkeypatch)
    docs = [{"n": i, "s": 'é\\\t\n"x\u2028'} for i in range(23)] + [None]
    with psycopg.connect(login("GRANT pepsi_ingress TO {role}"), autocommit=True) as producer:
        ids = enqueue_many(producer, "s", docs, chunk_size=10, priority=-3)
        assert ids == list(range(ids[0], ids[0] + 24)), "one id per payload, in order"
        lines = ['{"a": 1}', "", "  \r", '{"b": "x"}\r', '\t{"c": [1, 2]} ']
        more = enqueue_lines(producer, "t", lines, chunk_size=2, priority=4)
    assert [r[4] for r in _rows(conn, ids)] == docs[:23] + [{}]
    assert {(r[1], r[2], r[3], r[5]) for r in _rows(conn, ids)} == {("s", "pending", -3, None)}
    assert [(r[1], r[3], r[4]) for r in _rows(conn, more)] == [
        ("t", 4, {"a": 1}),
        ("t", 4, {"b": "x"}),
        ("t", 4, {"c": [1, 2]}),
    ], "blank lines skipped, CR LF and surrounding whitespace taken as JSON takes them"


def test_ids_drawn_by_another_producer_during_the_copy_are_not_returned(
    conn: psycopg.Connection, dsn: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as other:
        theirs: list[int] = []

        def batches() -> Iterator[list[str]]:
            yield ['{"mine": 1}', '{"mine": 2}']
            theirs.append(enqueue(other, "s", {"theirs": 1}))  # committed mid-COPY
            yield ['{"mine": 3}']

        with conn.transaction():
            ids = enqueue_module._copy(conn, "s", batches(), 0)
    assert theirs[0] not in ids
    assert [r[4] for r in _rows(conn, ids)] == [{"mine": 1}, {"mine": 2}, {"mine": 3}]
    assert ids == sorted(ids)


def test_inside_the_callers_transaction_the_statement_path_is_taken(dsn: str) -> None:
    with psycopg.connect(dsn) as caller:  # not autocommit: the caller commits
        caller.execute("SELECT 1")
        enqueue_many(caller, "s", [{"n": 1}, {"n": 2}])
        enqueue_lines(caller, "s", ['{"n": 3}'])
        assert caller.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 3
        caller.rollback()
        assert caller.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 0


def test_a_role_that_may_not_insert_falls_back_and_is_not_asked_again(
    conn: psycopg.Connection, login: Callable[[str], str]
) -> None:
    only_execute = login(
        "GRANT USAGE ON SCHEMA pepsi TO {role};"
        " GRANT EXECUTE ON FUNCTION pepsi.enqueue_lines(text, text[], timestamptz, integer,"
        " text[], text, bigint), pepsi.copy_mark() TO {role}"
    )
    with psycopg.connect(only_execute, autocommit=True) as producer:
        ids = enqueue_many(producer, "s", [{"n": i} for i in range(5)])
        assert producer in enqueue_module._no_copy
        ids += enqueue_lines(producer, "s", ['{"n": 5}'])
    assert [r[4] for r in _rows(conn, ids)] == [{"n": i} for i in range(6)]


def test_a_sequence_that_caches_ahead_falls_back(conn: psycopg.Connection) -> None:
    conn.execute("ALTER SEQUENCE pepsi.workqueue_workqueue_id_seq CACHE 20")
    with psycopg.connect(conn.info.dsn, autocommit=True) as producer:
        ids = enqueue_many(producer, "s", [{"n": i} for i in range(3)])
        assert producer in enqueue_module._no_copy
    assert [r[4] for r in _rows(conn, ids)] == [{"n": 0}, {"n": 1}, {"n": 2}]


@pytest.mark.parametrize(
    ("bad", "error", "says"),
    [
        ('{"n": "\x01"}', psycopg.errors.InvalidTextRepresentation, "line 23 is not JSON"),
        ('{"n": 1}\r{"n": 2}', psycopg.errors.InvalidTextRepresentation, "line 23 is not JSON"),
        ("[1]", psycopg.errors.InvalidParameterValue, "line 23 must be a JSON object"),
        ('{"n": oops}', psycopg.errors.InvalidTextRepresentation, "line 23 is not JSON"),
        (
            '{"n": 1e999999}',
            psycopg.errors.NumericValueOutOfRange,
            "line 23 holds a number jsonb cannot store",
        ),
        (
            '{"deep": ' + "[" * 300_000 + "]" * 300_000 + "}",
            psycopg.errors.StatementTooComplex,
            "line 23 is nested too deeply for jsonb",
        ),
    ],
)
def test_a_line_the_copy_refuses_is_named_and_nothing_stays(
    conn: psycopg.Connection, bad: str, error: type[Exception], says: str
) -> None:
    lines = [f'{{"n": {i}}}' for i in range(30)]
    lines[22] = bad
    seen: list[int] = []
    with pytest.raises(error, match=says):
        enqueue_lines(conn, "s", lines, chunk_size=10, progress=seen.append)
    assert seen == [10, 20], "progress never goes back when the other path names the line"
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 0


def test_a_connection_shared_with_another_thread_loses_nothing(dsn: str) -> None:
    """Thread A's COPY transactions take in thread B's statements on the same
    connection; B's rows must not be rolled back with a chunk, and A's ids
    must still be A's."""
    with psycopg.connect(dsn, autocommit=True) as shared:
        a_ids: list[int] = []
        b_ids: list[int] = []
        done = threading.Event()

        def producer_b() -> None:
            i = 0
            while not done.is_set():
                b_ids.append(enqueue(shared, "b", {"b": i}))
                i += 1

        thread = threading.Thread(target=producer_b)
        thread.start()
        try:
            for call in range(15):
                docs = [{"a": call * 1000 + i} for i in range(1000)]
                a_ids += enqueue_many(shared, "a", docs, chunk_size=250)
        finally:
            done.set()
            thread.join(timeout=30)
    with psycopg.connect(dsn) as check:
        a_rows = dict(
            check.execute(
                "SELECT workqueue_id, (payload->>'a')::int FROM pepsi.workqueue WHERE stage = 'a'"
            ).fetchall()
        )
        b_found = check.execute(
            "SELECT count(*) FROM pepsi.workqueue WHERE workqueue_id = ANY(%s) AND stage = 'b'",
            (b_ids,),
        ).fetchone()[0]
    assert b_found == len(b_ids) > 0, "every id thread B got back is in the table"
    assert [a_rows[i] for i in a_ids] == list(range(15_000)), "A's ids are A's, in order"
    assert len(a_rows) == 15_000


def test_pipeline_mode_takes_the_statement_path(conn: psycopg.Connection) -> None:
    with conn.pipeline():
        ids = enqueue_many(conn, "s", [{"n": 1}, {"n": 2}])
        ids += enqueue_lines(conn, "s", ['{"n": 3}'])
    assert [r[4] for r in _rows(conn, ids)] == [{"n": 1}, {"n": 2}, {"n": 3}]


@pytest.mark.parametrize("odd", ["\x1f", "\u00a0", "\u2007"])
def test_a_line_of_other_whitespace_is_judged_by_the_database(
    conn: psycopg.Connection, odd: str
) -> None:
    """Only ASCII whitespace is blank on the COPY path; anything else is what
    pepsi.enqueue_lines makes of it, so both paths agree."""
    lines = ['{"n": 1}', odd, '{"n": 2}']
    try:
        fast = ("ids", len(enqueue_lines(conn, "s", lines)))
    except psycopg.Error as exc:
        fast = ("error", str(exc).splitlines()[0])
    conn.execute("TRUNCATE pepsi.workqueue")
    with conn.transaction():  # inside a transaction: the statement path
        try:
            with conn.transaction():
                slow = ("ids", len(enqueue_lines(conn, "s", lines)))
        except psycopg.Error as exc:
            slow = ("error", str(exc).splitlines()[0])
    assert fast == slow


def test_two_threads_bulk_enqueuing_on_one_connection_leave_it_usable(dsn: str) -> None:
    """Two bulk calls at once on one connection would nest their transaction
    blocks; psycopg then loses track of the open transaction and nothing after
    it commits. They run one at a time instead."""
    with psycopg.connect(dsn, autocommit=True) as shared:
        got: dict[str, list[int]] = {"x": [], "y": []}
        errors: list[BaseException] = []

        def producer(stage: str) -> None:
            try:
                for call in range(40):
                    got[stage] += enqueue_many(shared, stage, [{"c": call}] * 50, chunk_size=50)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=producer, args=(s,)) for s in got]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        assert shared.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        last = enqueue(shared, "z", {})
    with psycopg.connect(dsn) as check:
        for stage, ids in got.items():
            found = check.execute(
                "SELECT count(*) FROM pepsi.workqueue WHERE workqueue_id = ANY(%s) AND stage = %s",
                (ids, stage),
            ).fetchone()[0]
            assert found == len(ids) == 2000
        assert (
            check.execute(
                "SELECT count(*) FROM pepsi.workqueue WHERE workqueue_id = %s", (last,)
            ).fetchone()[0]
            == 1
        ), "the connection still commits"


def test_an_element_holding_a_line_break_is_one_bad_line(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.InvalidTextRepresentation, match="line 2 is not JSON"):
        enqueue_lines(conn, "s", ['{"a": 0}', '{"a": 1}\n{"b": 2}'])
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 0


def test_a_copy_block_that_ended_inside_another_transaction_says_so(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread's transaction opened between the call's check and its
    BEGIN makes the call's block a savepoint: nothing of it is committed by
    the call, so it raises instead of returning ids (simulated in one thread)."""
    monkeypatch.setattr(enqueue_module, "_copy_possible", lambda c: True)
    with conn.transaction():
        with pytest.raises(enqueue_module.SharedTransactionError):
            enqueue_many(conn, "s", [{"n": 1}, {"n": 2}])
        with pytest.raises(enqueue_module.SharedTransactionError):
            enqueue_lines(conn, "s", ['{"n": 3}'])
        assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 3
        raise psycopg.Rollback
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone()[0] == 0


def test_none_lines_are_blank_on_both_paths(conn: psycopg.Connection) -> None:
    fast = enqueue_lines(conn, "s", ['{"n": 1}', None, '{"n": 2}'])  # type: ignore[list-item]
    with conn.transaction():
        slow = enqueue_lines(conn, "s", ['{"n": 3}', None, '{"n": 4}'])  # type: ignore[list-item]
    assert len(fast) == len(slow) == 2


def test_an_async_connection_is_refused_plainly(dsn: str) -> None:
    async def attempt() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            with pytest.raises(TypeError, match="psycopg.Connection is needed"):
                enqueue_many(aconn, "s", [{}])  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="psycopg.Connection is needed"):
                enqueue_lines(aconn, "s", ["{}"])  # type: ignore[arg-type]

    asyncio.run(attempt())


# -- the keyed COPY path ----------------------------------------------------------------


def _count_statements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Let pepsi.enqueue_lines run, counting its calls (the first line of each)."""
    calls: list[int] = []
    real = enqueue_module._send

    def counted(*args: object) -> list[int]:
        calls.append(args[-1])  # type: ignore[arg-type]
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(enqueue_module, "_send", counted)
    return calls


def test_new_keys_are_copied_each_once_by_a_producer_login(
    conn: psycopg.Connection, login: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys no live message holds go in by COPY, with no statement and no
    look-up; an element whose key an earlier element of the call took answers
    with that element's id; None is no key."""
    _no_statement_path(monkeypatch)
    docs = [{"n": i} for i in range(30)]
    keys = [f"new-{i // 10}-{i % 4}" if i % 5 else None for i in range(30)]  # repeats in a chunk
    with psycopg.connect(login("GRANT pepsi_ingress TO {role}"), autocommit=True) as producer:
        ids = enqueue_many(producer, "s", docs, chunk_size=10, priority=3, dedupe_keys=keys)
        assert producer not in enqueue_module._no_keyed_copy
    first_of: dict[str, int] = {}
    for n, k in enumerate(keys):
        if k is not None:
            assert ids[n] == ids[first_of.setdefault(k, n)], (n, k)
    inserted = sorted(set(ids))
    rows = _rows(conn, inserted)
    assert len(rows) == len(inserted) == 6 + len(set(filter(None, keys)))
    by_id = {r[0]: r for r in rows}
    for n in sorted(set(first_of.values()) | {n for n, k in enumerate(keys) if k is None}):
        assert by_id[ids[n]][4] == docs[n] and by_id[ids[n]][5] == keys[n]
        assert by_id[ids[n]][3] == 3


def test_a_held_key_sends_its_chunk_through_statements_and_later_chunks_look_up(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = enqueue(conn, "s", {"old": 1}, dedupe_key="k-held")
    later = enqueue(conn, "s", {"old": 2}, dedupe_key="k-later")
    statements = _count_statements(monkeypatch)
    keys = ["k-a", "k-held", "k-b", "k-c", "k-later", "k-c", None, "k-d"]
    ids = enqueue_many(conn, "s", [{"n": i} for i in range(8)], chunk_size=3, dedupe_keys=keys)
    assert statements == [1], "only the chunk that met the held key took the statement path"
    assert ids[1] == held and ids[4] == later, "held keys answer with their holder's id"
    assert ids[5] == ids[3], "a key repeated across chunks answers with the first one's id"
    rows = _rows(conn, [i for i in ids if i not in (held, later)])
    assert [(r[4], r[5]) for r in rows] == [
        ({"n": 0}, "k-a"),
        ({"n": 2}, "k-b"),
        ({"n": 3}, "k-c"),
        ({"n": 6}, None),
        ({"n": 7}, "k-d"),
    ]


@pytest.mark.parametrize(
    ("key", "goes_in"),
    [
        ("two\nlines", True),
        ("\x01odd", True),
        ("   ", False),
        ("k" * 513, False),
        ("\u3000\u2003", None),  # whitespace to Python; to the database, by its locale
        ("\u00a0", None),
    ],
)
def test_a_key_the_copy_cannot_take_goes_through_statements(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch, key: str, goes_in: bool | None
) -> None:
    """Such keys are decided where enqueue decides them, whoever inserts (the
    table's trigger does not check its owner's rows)."""
    if goes_in is None:
        goes_in = conn.execute("SELECT %s::text ~ '\\S'", (key,)).fetchone()[0]
    statements = _count_statements(monkeypatch)
    docs, keys = [{"n": 1}, {"n": 2}], ["fine", key]
    if goes_in:
        ids = enqueue_many(conn, "s", docs, dedupe_keys=keys)
        assert [r[5] for r in _rows(conn, ids)] == keys, "the key exactly as given"
    else:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="line 2"):
            enqueue_many(conn, "s", docs, dedupe_keys=keys)
        assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone() == (0,)
    assert statements == [1]


def test_a_role_that_may_not_insert_keys_still_copies_without(
    conn: psycopg.Connection, login: Callable[[str], str]
) -> None:
    """A role granted as before 0042 (no INSERT on dedupe_key): its keyed calls
    take statements from then on, its keyless calls still COPY."""
    old_grants = login(
        "GRANT USAGE ON SCHEMA pepsi TO {role};"
        " GRANT EXECUTE ON FUNCTION pepsi.enqueue_lines(text, text[], timestamptz, integer,"
        " text[], text, bigint), pepsi.copy_mark(), pepsi.copied_ids(bigint, bigint) TO {role};"
        " GRANT INSERT (stage, payload, priority) ON pepsi.workqueue TO {role}"
    )
    with psycopg.connect(old_grants, autocommit=True) as producer:
        ids = enqueue_many(producer, "s", [{"n": 0}, {"n": 1}], dedupe_keys=["a", None])
        assert producer in enqueue_module._no_keyed_copy
        assert producer not in enqueue_module._no_copy
        ids += enqueue_many(producer, "s", [{"n": 2}])
        assert producer not in enqueue_module._no_copy
    assert [(r[4], r[5]) for r in _rows(conn, ids)] == [
        ({"n": 0}, "a"),
        ({"n": 1}, None),
        ({"n": 2}, None),
    ]


def test_producers_racing_for_the_same_keys_get_one_message_per_key(dsn: str) -> None:
    """Four producers enqueue the same keyed batches at once: each key is one
    live message, and every producer got that message's id for it."""
    keys = [f"race-{i}" for i in range(600)]
    results: list[list[int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def produce(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                start.wait(10)
                results.append(
                    enqueue_many(own, "s", [{"p": n}] * len(keys), chunk_size=100, dedupe_keys=keys)
                )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(results) == 4 and all(r == results[0] for r in results)
    with psycopg.connect(dsn, autocommit=True) as check:
        rows = check.execute("SELECT dedupe_key, workqueue_id FROM pepsi.workqueue").fetchall()
    assert sorted(k for k, _ in rows) == sorted(keys), "one message per key, none lost"
    assert dict(rows) == dict(zip(keys, results[0], strict=True))


# enqueue_lines with key_field: the keys read in Python, the lines copied as read.

_KEYED_LINES = [
    '{"n": 0, "id": "a"}',
    "",
    '{"n": 1, "id": "held"}',
    '{"n": 2}',
    '{"n": 3, "id": "a"}',
    '  {"n": 4, "id": null, "x": 1.000000000000000000001}',
    '{"n": 5, "id": "b", "id": "c"}',
    '{"n": 6, "id": "é\\"\\u2028"}\r',
    '{"n": 7, "id": "c"}',
]


def _keyed_lines_result(conn: psycopg.Connection, ids: list[int]) -> list[tuple]:
    """Each id's row (payload as text, key), in line order."""
    return [
        conn.execute(
            "SELECT payload::text, dedupe_key FROM pepsi.workqueue WHERE workqueue_id = %s", (i,)
        ).fetchone()
        for i in ids
    ]


def test_keyed_lines_copy_as_the_statement_path_enqueues_them(
    conn: psycopg.Connection, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blank lines, a key repeated within and across chunks, a key a live
    message holds, no key, null, a repeated member (the last wins), escapes,
    CR LF and a number no float holds: the COPY path gives what the statement
    path gives, ids and rows alike. The held key makes the first COPY refuse;
    the call is then copied again with its keys looked up, with no statement."""
    results = []
    for copy in (True, False):
        conn.execute("DELETE FROM pepsi.workqueue")
        held = enqueue(conn, "s", {"old": 1}, dedupe_key="held")
        statements = _count_statements(monkeypatch)
        if copy:
            ids = enqueue_lines(conn, "s", _KEYED_LINES, chunk_size=3, key_field="id", priority=2)
            # lines 1-3 met the held key: copied again, every chunk's keys looked up first
            assert statements == []
        else:
            with psycopg.connect(dsn) as in_tx:  # not autocommit: statements only
                ids = enqueue_lines(
                    in_tx, "s", _KEYED_LINES, chunk_size=3, key_field="id", priority=2
                )
            assert statements == [1, 4, 7]
        assert ids[1] == held
        order = sorted(set(ids) - {held})  # ids drawn by a refused COPY leave gaps
        shape = [order.index(i) if i != held else "held" for i in ids]
        results.append((shape, _keyed_lines_result(conn, ids)))
    assert results[0] == results[1]
    shape, rows = results[0]
    assert len(ids) == 8 and shape[3] == shape[0], "line 5 ('a' again) answers with line 1's id"
    assert rows[5][1] == "c" and rows[7][1] == "c" and shape[7] == shape[5]
    assert "1.000000000000000000001" in rows[4][0] and rows[4][1] is None
    assert rows[6][1] == 'é"\u2028'


@pytest.mark.parametrize(
    "bad",
    [
        '{"n": 9, "id": 5}',
        '{"n": 9, "id": {"a": 1}}',
        '{"n": 9, "id": "   "}',
        "[1, 2]",
        '{"n": NaN}',
    ],
)
def test_keyed_lines_python_cannot_read_exactly_go_through_statements(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    """A key that is not a string (the database's text of it decides): that
    chunk takes pepsi.enqueue_lines, which keys it, and the other chunks still
    COPY. A key of whitespace, a line that is not an object or not JSON to the
    database: the call is rolled back and goes through pepsi.enqueue_lines,
    which names the line."""
    statements = _count_statements(monkeypatch)
    lines = ['{"n": 0, "id": "x"}', '{"n": 1}', bad, '{"n": 3, "id": "y"}']
    try:
        ids = enqueue_lines(conn, "s", lines, chunk_size=2, key_field="id")
    except (psycopg.errors.InvalidParameterValue, psycopg.errors.InvalidTextRepresentation) as exc:
        assert "line 3" in str(exc)
        assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone() == (0,)
        assert statements[-2:] == [1, 3], "the whole call, through statements"
        return
    assert statements == [3]
    keys = [r[1] for r in _keyed_lines_result(conn, ids)]
    assert keys[0] == "x" and keys[1] is None and keys[3] == "y"
    assert keys[2] == conn.execute("SELECT (%s::jsonb) ->> 'id'", (bad,)).fetchone()[0]


def test_a_bad_line_after_copied_chunks_leaves_nothing(conn: psycopg.Connection) -> None:
    lines = [f'{{"n": {i}, "id": "k{i}"}}' for i in range(10)]
    lines[7] = '{"n": 7, "id": "k7"'
    with pytest.raises(psycopg.errors.InvalidTextRepresentation, match="line 8"):
        enqueue_lines(conn, "s", lines, chunk_size=3, key_field="id")
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone() == (0,)


def test_keyed_lines_by_a_producer_login_copy(
    conn: psycopg.Connection, login: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_statement_path(monkeypatch)
    lines = [f'{{"n": {i}, "id": "p{i // 3}"}}' for i in range(40)]  # repeats within a chunk
    with psycopg.connect(login("GRANT pepsi_ingress TO {role}"), autocommit=True) as producer:
        ids = enqueue_lines(producer, "s", lines, chunk_size=9, key_field="id")
    assert len(set(ids)) == 14 and ids == sorted(ids)
    assert all(ids[i] == ids[i - i % 3] for i in range(40))
    rows = _keyed_lines_result(conn, ids[::3])
    assert [r[1] for r in rows] == [f"p{i}" for i in range(14)]


def test_keyed_lines_get_their_ids_while_another_producer_draws_ids(
    conn: psycopg.Connection, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another producer inserting while the COPY runs draws ids in between: the
    COPY's ids are still told from its rows (the COPY runs in the call's own
    transaction, not under a savepoint)."""
    real_mark = enqueue_module._copy_mark
    with psycopg.connect(dsn, autocommit=True) as other:

        def mark_then_another_insert(c: psycopg.Connection, stage: str) -> int:
            mark = real_mark(c, stage)
            enqueue(other, "s2", {"meanwhile": True})
            return mark

        monkeypatch.setattr(enqueue_module, "_copy_mark", mark_then_another_insert)
        statements = _count_statements(monkeypatch)
        lines = [f'{{"n": {i}, "id": "k{i // 2}"}}' for i in range(20)]
        ids = enqueue_lines(conn, "s", lines, chunk_size=8, key_field="id")
    assert statements == []
    assert len(ids) == 20 and all(ids[i] == ids[i - i % 2] for i in range(20))
    rows = _keyed_lines_result(conn, ids[::2])
    assert [r[1] for r in rows] == [f"k{i}" for i in range(10)]


@pytest.mark.parametrize(
    ("lines", "line"),
    [
        (['{"k": "a"}', '{"k": "a", "x": NaN}'], 2),  # a repeated key: the line is not copied
        (['{"k": "a"}', '{"k": "a", "x": "\\u0000"}'], 2),
        (['{"k": "A"}', '{"k": "A", "s": "', '"}, {"k": "A"}'], 2),  # one object when joined
        (['{"k": "\\ud800"}'], 1),  # a key Python reads, UTF-8 cannot hold
        (['{"k": "b"}', '{"k": "c", "x": 1e999999}'], None),  # Python reads it, jsonb not
    ],
)
def test_keyed_lines_are_all_parsed_by_the_database(
    conn: psycopg.Connection, lines: list[str], line: int | None
) -> None:
    """Lines a keyed COPY leaves out (a key repeated or held) are parsed by the
    database all the same, as pepsi.enqueue_lines parses every line: one that
    Python reads but the database does not is named (a number jsonb cannot
    hold fails there as it does in pepsi.enqueue_lines, unnamed), and nothing
    is in."""
    if line is None:
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            enqueue_lines(conn, "s", lines, key_field="k")
    else:
        with pytest.raises(psycopg.errors.InvalidTextRepresentation, match=f"line {line}"):
            enqueue_lines(conn, "s", lines, key_field="k")
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone() == (0,)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_key_repeated_across_chunks_is_answered_without_a_look_up(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key an earlier chunk of the call inserted is answered with that
    line's id from what the call knows: the COPY is not refused, not redone,
    and nothing is looked up."""
    _no_statement_path(monkeypatch)

    def no_look_up(*args: object) -> dict[str, int]:
        raise AssertionError("looked keys up: the call was copied again")

    monkeypatch.setattr(enqueue_module, "_key_holders", no_look_up)
    lines = [f'{{"n": {i}, "id": "p{i % 7}"}}' for i in range(40)]
    ids = enqueue_lines(conn, "s", lines, chunk_size=9, key_field="id")
    assert len(set(ids)) == 7 and all(ids[i] == ids[i % 7] for i in range(40))
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone() == (7,)


def test_progress_never_goes_back_when_the_call_is_copied_again(
    conn: psycopg.Connection,
) -> None:
    enqueue(conn, "s", {"old": 1}, dedupe_key="z")
    seen: list[int] = []
    lines = ["", "", '{"k": "a"}', '{"k": "b"}', '{"k": "c"}', '{"k": "z"}']
    ids = enqueue_lines(conn, "s", lines, chunk_size=2, key_field="k", progress=seen.append)
    assert len(ids) == 4
    assert seen == sorted(set(seen)) and seen[0] == 0 and seen[-1] == 4, seen


@pytest.mark.parametrize("key_field", ["a\x00", 1])
def test_a_key_field_the_database_cannot_take_fails_as_on_statements(
    conn: psycopg.Connection, key_field: object
) -> None:
    """Not copied without keys: the statement path refuses it, nothing is in."""
    with pytest.raises(psycopg.Error):
        enqueue_lines(conn, "s", ['{"a": "x"}', '{"a": "x"}'], key_field=key_field)  # type: ignore[arg-type]
    assert conn.execute("SELECT count(*) FROM pepsi.workqueue").fetchone() == (0,)

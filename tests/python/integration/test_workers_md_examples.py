"""The non-Python stage of docs/WORKERS.md runs as written.

The Node example (one transaction per message: the stage's own write and
the transition commit together) is taken from the document itself, run by a
real dispatcher, and must leave every message done with its row written, and
a message it cannot handle failed with its answer, not half-done.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dispatch_harness import Harness, harness_fixture  # noqa: F401
from psycopg.conninfo import conninfo_to_dict
from test_pgbouncer import node_pg  # noqa: F401 -- the fixture: node with node-postgres

ROOT = Path(__file__).resolve().parents[3]


def node_example() -> str:
    text = (ROOT / "docs" / "WORKERS.md").read_text(encoding="utf-8")
    section = text.split("### A stage in another language", 1)[1]
    match = re.search(r"```js\n(.*?)```", section, re.S)
    assert match, "WORKERS.md has the Node example"
    return match.group(1)


def uri(dsn: str) -> str:
    """The URI form WORKERS.md asks for (node-postgres reads no key=value DSN)."""
    d = conninfo_to_dict(dsn)
    query = "&".join(f"{k}={d[k]}" for k in ("host", "port") if d.get(k))
    return f"postgresql://{d.get('user', 'postgres')}@/{d['dbname']}?{query}"


def test_the_node_stage_of_workers_md_commits_its_write_with_the_transition(
    h: Harness,
    node_pg: dict[str, str] | str,  # noqa: F811
    tmp_path: Path,
) -> None:
    if isinstance(node_pg, str):
        pytest.skip(node_pg)
    program = tmp_path / "thumbs.js"
    program.write_text(node_example())
    program.chmod(0o755)
    h.conn.execute(
        "CREATE TABLE public.thumbnails (message_id bigint PRIMARY KEY, url text NOT NULL)"
    )
    h.conn.execute("GRANT ALL ON public.thumbnails TO PUBLIC")
    env_path = node_pg.get("NODE_PATH")
    prefix = f"env NODE_PATH={env_path} " if env_path else ""
    stages = {"thumbs": {"PROGRAM": f"{prefix}node {program}", "PARALLELISM": "2"}}
    h.start(h.conf(stages, WORKER_DSN=uri(h.dsn)))
    good = h.enqueue("thumbs", [{"url": f"https://example.test/{n}.png"} for n in range(6)])
    [bad] = h.enqueue("thumbs", [{"no_url": True}])  # its INSERT fails: url is NOT NULL
    h.wait_all(timeout=60)
    rows = dict(h.conn.execute("SELECT message_id, url FROM public.thumbnails").fetchall())
    for i, mid in enumerate(good):
        assert h.row(mid)["status"] == "done"
        assert rows[mid] == f"https://example.test/{i}.png"
    failed = h.row(bad)
    assert failed["status"] == "failed" and bad not in rows, "rolled back: no half-done write"
    assert "null value" in failed["state"]["dispatch_error"]

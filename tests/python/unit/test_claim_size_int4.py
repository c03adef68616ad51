"""Integer options take their whole range (1 ... 2,147,483,647), and the claim
stays an int4: a stage whose PARALLELISM x QUEUE_LIMIT is above it claims at
most 2,147,483,647 ids. The dispatcher's loop on a fake clock and store."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_store import FakeStore
from test_loop_planning import FakeClock, dispatcher

from pepsi_dispatch.config import load_config
from pepsi_dispatch.config.values import INT_MAX

HEAD = "[pepsi-dispatch]\nSERVICE_USER = root\n[database]\nDSN = postgresql:///none\n"


@pytest.mark.parametrize(
    "options",
    [
        "QUEUE_LIMIT = 2147483647",
        "PARALLELISM = 2147483647",
        "QUEUE_LIMIT = 65536\nPARALLELISM = 65536",
    ],
)
def test_the_top_of_the_range_is_a_valid_configuration(tmp_path: Path, options: str) -> None:
    conf = tmp_path / "pepsi.conf"
    conf.write_text(HEAD + f"[stage-a]\nPROGRAM = /bin/true\n{options}\n")
    stage = load_config(conf).stages["a"]
    assert stage.parallelism * stage.queue_limit > INT_MAX


def test_a_claim_above_int4_asks_for_int_max(tmp_path: Path) -> None:
    from pepsi_dispatch.coordinator.dispatcher import ReloadCause  # late: see dispatcher()

    clock = FakeClock()
    d = dispatcher(tmp_path, clock, FakeStore())
    (tmp_path / "pepsi.conf").write_text(
        HEAD + "[stage-a]\nPROGRAM = /bin/true\nPARALLELISM = 2\nQUEUE_LIMIT = 2147483647\n"
        "[stage-b]\nPROGRAM = /bin/true\nPARALLELISM = 2\nQUEUE_LIMIT = 3\n"
    )
    d._reload(clock(), cause=ReloadCause.SIGHUP)
    assert d.supervisor.capacity(clock()) == (["a", "b"], [INT_MAX, 6])

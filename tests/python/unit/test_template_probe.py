"""The template probe: when a new pool offers its template to a worker handed
nothing (StagePool.probe_wanted), and that the supervisor starts it once per
pool and stops it at once (no database; the supervisor's spawn is a stand-in)."""

from __future__ import annotations

import selectors
from pathlib import Path
from typing import Any

from pepsi_dispatch.config import load_config
from pepsi_dispatch.config.model import StageConfig
from pepsi_dispatch.coordinator.failwatch import FailureWatch
from pepsi_dispatch.coordinator.ledger import Ledger
from pepsi_dispatch.coordinator.stats import Stats
from pepsi_dispatch.coordinator.workers.stage_pool import GREETING_WAIT, StagePool
from pepsi_dispatch.coordinator.workers.supervisor import TEMPLATE_POLL, SpawnFor, Supervisor


def _pool(min_workers: int = 0, paused: bool = False) -> StagePool:
    config = StageConfig("s", "/bin/true", (), 4, 4, 1000, min_workers=min_workers, paused=paused)
    return StagePool(config, 1)


def test_a_new_pool_wants_its_probe_once() -> None:
    pool = _pool()
    assert pool.probe_wanted(10.0)
    pool.probed = True
    assert not pool.probe_wanted(10.0)


def test_no_probe_where_a_worker_or_a_template_would_take_the_offer_anyway() -> None:
    warm = _pool(min_workers=1)  # its warm workers are offered the template
    assert not warm.probe_wanted(10.0)
    busy = _pool()
    busy.workers.append(object())  # type: ignore[arg-type]
    assert not busy.probe_wanted(10.0)
    tried = _pool()
    tried.template_tried = True
    assert not tried.probe_wanted(10.0)


def test_no_probe_for_a_paused_stage_or_during_a_cooldown() -> None:
    assert not _pool(paused=True).probe_wanted(10.0)
    cooling = _pool()
    cooling.cooldown_until = 11.0
    assert not cooling.probe_wanted(10.0)
    assert cooling.probe_wanted(11.0)


class _Stopped:
    def __init__(self) -> None:
        self.why = ""


def _supervisor(tmp_path: Path, sections: str) -> tuple[Supervisor, list[tuple[str, SpawnFor]]]:
    """A supervisor of the stages in ``sections`` whose spawn and stop are stand-ins."""
    conf = tmp_path / "pepsi.conf"
    conf.write_text("[pepsi-dispatch]\nSERVICE_USER = root\n" + sections)
    config = load_config(str(conf))
    sup = Supervisor(
        config,
        selectors.DefaultSelector(),
        Stats(),
        Ledger(),
        lambda: True,
        lambda: None,
        FailureWatch(60.0, 0.0),
    )
    sup._subreaper = True
    spawned: list[tuple[str, SpawnFor]] = []

    def spawn(pool: StagePool, now: float, purpose: SpawnFor = SpawnFor.MESSAGES) -> Any:
        spawned.append((pool.name, purpose))
        w = _Stopped()
        pool.workers.append(w)  # type: ignore[arg-type]
        return w

    def stop(w: Any, now: float, why: str) -> None:
        w.why = why

    sup.spawn = spawn  # type: ignore[method-assign]
    sup.stop = stop  # type: ignore[method-assign]
    sup.build(config)
    return sup, spawned


def test_the_supervisor_probes_each_new_pool_once_and_wakes_at_once_for_it(
    tmp_path: Path,
) -> None:
    sup, spawned = _supervisor(
        tmp_path,
        "[stage-a]\nPROGRAM = /bin/true\n[stage-b]\nPROGRAM = /bin/true\nPAUSED = yes\n",
    )
    assert sup.next_deadline(5.0) == 5.0  # the loop does not sleep before the probes
    sup.fire_due(5.0)
    assert spawned == [("a", SpawnFor.PROBE)]
    assert [w.why for w in sup.pools["a"].workers] == ["template probe, handed nothing"]  # type: ignore[attr-defined]
    sup.pools["a"].workers.clear()  # the probe exited
    assert sup.next_deadline(5.0) > 5.0
    sup.fire_due(6.0)  # once per pool: not again when its probe is gone
    assert spawned == [("a", SpawnFor.PROBE)]


def test_no_probe_while_the_dispatcher_cannot_have_templates(tmp_path: Path) -> None:
    sup, spawned = _supervisor(tmp_path, "[stage-a]\nPROGRAM = /bin/true\n")
    sup._subreaper = False  # forked workers would not be ours
    sup.fire_due(5.0)
    assert spawned == []


class _Template:
    """What a reload reads of an old pool's template (its greeting, without
    blocking), and ends."""

    def __init__(self, greeted: bool = False, worker_gone: bool = False) -> None:
        self.greeted = greeted
        self.offered = True  # no process of its own until its greeting is read
        self.pid = 4242
        self.closed = worker_gone

    @property
    def sock(self) -> _Template:
        return self

    def fileno(self) -> int:
        return -1 if self.closed else 7

    def ready(self) -> bool:
        self.offered = not self.greeted
        return self.greeted

    def close(self) -> None:
        self.closed = True


def test_a_reload_probes_again_only_the_stages_that_had_a_template(tmp_path: Path) -> None:
    sections = "".join(f"[stage-{s}]\nPROGRAM = /bin/true\n" for s in "abcd")
    sup, spawned = _supervisor(tmp_path, sections)
    sup.fire_due(5.0)
    assert sorted(spawned) == [(s, SpawnFor.PROBE) for s in "abcd"]
    for pool in sup.pools.values():
        pool.workers.clear()  # the probes exited
    old = sup.pools
    # an SDK program: its probe forked the template, whose greeting is unread yet
    old["a"].template = _Template(greeted=True)
    old["b"].template = _Template(worker_gone=True)  # an offer its program never took
    old["d"].template = _Template()  # an offer still open: its worker may be forking it
    templates = {name: old[name].template for name in "abd"}
    spawned.clear()
    sup.build(sup.config)  # a reload
    assert all(old[name].template is None for name in "abd")  # all ended
    assert all(t.closed for t in templates.values())
    sup.fire_due(6.0)
    # not b nor c: no program start for nothing
    assert sorted(spawned) == [("a", SpawnFor.PROBE), ("d", SpawnFor.PROBE)]


class _Worker:
    """What the supervisor's timers read of a worker that holds nothing."""

    def __init__(self, pid: int, stopping: bool) -> None:
        self.pid, self.stopping = pid, stopping
        self.killed = self.eof = False
        self.inflight: list[int] = []
        self.stop_deadline = 0.0


def test_the_supervisor_reads_a_stopped_workers_template_greeting_unasked(
    tmp_path: Path,
) -> None:
    """A probe's worker is stopped at once: its template's greeting is looked
    for on a short timer and read (logged) before any message, not at the first
    burst; an offer to a worker still serving is not polled."""
    sup, _ = _supervisor(tmp_path, "[stage-a]\nPROGRAM = /bin/true\n")
    sup.fire_due(5.0)  # the probe
    pool = sup.pools["a"]
    template = _Template()
    pool.template, pool.offered_at, pool.offered_to = template, 5.0, 99  # type: ignore[assignment]
    pool.workers[:] = [_Worker(99, stopping=True)]  # type: ignore[list-item]
    assert sup.next_deadline(5.5) == 5.5 + TEMPLATE_POLL
    sup.fire_due(5.5)
    assert pool.template is template and template.offered  # not arrived yet: still awaited
    template.greeted = True
    pool.workers.clear()  # the probe exited before its template greeted
    assert sup.next_deadline(6.0) == 6.0 + TEMPLATE_POLL
    sup.fire_due(6.0)
    assert not template.offered  # read: the stage's template
    assert sup.next_deadline(6.0) > 6.0 + 1  # nothing more to look for

    serving = _Template()
    pool.template = serving  # type: ignore[assignment]
    pool.workers[:] = [_Worker(99, stopping=False)]  # type: ignore[list-item]
    assert not pool.greeting_awaited(6.0)  # read when the stage next spawns
    pool.workers[0].stopping = True  # type: ignore[attr-defined]
    assert pool.greeting_awaited(6.0)
    assert not pool.greeting_awaited(5.0 + GREETING_WAIT)  # not for ever

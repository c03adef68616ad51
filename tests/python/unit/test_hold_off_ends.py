"""A stage's hold-off ends at once on a resume ("try now") and on any reload.

The dispatcher's loop driven by a fake clock and the typed fake of its
database port: no database, no workers. A stage whose workers kept dying is held off
(its spawn cooldown doubles up to 60 s); the NOTIFY that ``pepsi.pause_stage``
sends on a resume ends that stage's hold-off, and a reload (SIGHUP, or an
overlay change) ends every stage's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fake_store import FakeStore
from test_loop_planning import FakeClock, dispatcher

from pepsi_dispatch.coordinator.database.postgres import _notification

if TYPE_CHECKING:
    from pepsi_dispatch.coordinator.dispatcher import Dispatcher

CONF_TWO_STAGES = (
    "[pepsi-dispatch]\nSERVICE_USER = root\n[database]\nDSN = postgresql:///none\n"
    "[stage-a]\nPROGRAM = /bin/true\nPARALLELISM = 2\nQUEUE_LIMIT = 3\n"
    "[stage-b]\nPROGRAM = /bin/true\n"
)


def _held(tmp_path: Path, clock: FakeClock, notes: list[str]) -> Dispatcher:
    """A dispatcher with stages a and b, both held off for 8 s (four failures)."""
    from pepsi_dispatch.coordinator.dispatcher import ReloadCause  # late: see dispatcher()

    store = FakeStore()
    store.notes = notes
    d = dispatcher(tmp_path, clock, store)
    (tmp_path / "pepsi.conf").write_text(CONF_TWO_STAGES)
    d._reload(clock(), cause=ReloadCause.SIGHUP)  # now with stages a and b
    for stage in ("a", "b"):
        for _ in range(4):  # 1, 2, 4 s gone by; the fourth cooldown is 8 s
            d.supervisor.pools[stage].cooldown_until = 0.0
            d.supervisor.hold_off(stage, clock(), "its program exits at start")
    d.ledger.claimed_pass()
    assert d.supervisor.capacity(clock()) == ([], [])
    return d


def _health(d: Dispatcher, stage: str, now: float) -> str:
    return d.supervisor.pools[stage].health(now)["state"]


def test_a_resume_notification_is_try_now_not_a_reload() -> None:
    assert _notification("config_changed", "try_now:a") == "try_now:a"
    assert _notification("config_changed", "delete") == "config_changed"
    assert _notification("workqueue", "delayed") == "workqueue:delayed"


def test_resuming_a_stage_ends_its_hold_off_at_once(tmp_path: Path) -> None:
    clock = FakeClock()
    notes = ["try_now:a"]
    d = _held(tmp_path, clock, notes)
    d._on_listen(clock())
    assert not d.reload_pending  # a resume of a stage that was not paused: no reload
    assert d.supervisor.capacity(clock()) == (["a"], [6])  # a claims again, b still waits
    assert _health(d, "a", clock()) == "serving" and _health(d, "b", clock()) == "no_worker"
    plan = d.round_trip.plan(clock(), shutting_down=False)
    assert plan and plan.claim is not None and plan.claim[0] == ["a"]
    # Still broken: held off anew, from the first delay (1 s), not the next (16 s).
    d.supervisor.hold_off("a", clock(), "its program exits at start")
    assert d.supervisor.pools["a"].cooldown_until == clock() + 1.0


def test_a_reload_ends_every_stage_hold_off(tmp_path: Path) -> None:
    from pepsi_dispatch.coordinator.dispatcher import ReloadCause  # late: see dispatcher()

    for cause in (ReloadCause.SIGHUP, ReloadCause.NOTIFIED):
        clock = FakeClock()
        d = _held(tmp_path, clock, [])
        d._reload(clock(), cause=cause)  # NOTIFIED: nothing changed, workers kept
        stages, _ = d.supervisor.capacity(clock())
        assert stages == ["a", "b"], cause
        assert _health(d, "a", clock()) == _health(d, "b", clock()) == "serving"

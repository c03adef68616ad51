"""Unit tests of the template offered to a stage's first exec'd worker
(coordinator/workers/templates.py): which greetings adopt it, what an offer
that nobody takes leaves behind, and when the stage execs a template instead."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from pepsi_dispatch.config.model import StageConfig
from pepsi_dispatch.coordinator.workers.stage_pool import OFFER_GRACE, TEMPLATE_HOLD, StagePool
from pepsi_dispatch.coordinator.workers.templates import TemplateProcess


def _offer_greeted(greeting: bytes) -> tuple[TemplateProcess, bool]:
    template, theirs = TemplateProcess.offer()
    theirs.send(greeting)
    theirs.close()
    return template, template.ready()


def test_an_offer_is_adopted_by_ready_and_the_pid_of_a_child_of_ours() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        template, ready = _offer_greeted(f"ready {child.pid}".encode())
        assert ready and not template.offered and template.pid == child.pid
        template.close()  # kills and reaps it
        assert template.proc is not None and template.proc.returncode == -9
    finally:
        child.kill()


def test_an_offer_refuses_a_pid_that_is_not_our_child() -> None:
    template, ready = _offer_greeted(f"ready {os.getppid()}".encode())
    assert not ready and template.offered and template.pid is None
    assert template.sock.fileno() < 0  # closed: nothing will be signalled


def test_an_offer_refuses_the_exec_templates_bare_greeting_and_garbage() -> None:
    for greeting in (b"ready", b"ready x", b"hello 1", b""):
        template, ready = _offer_greeted(greeting)
        assert not ready and template.offered, greeting


def test_an_offer_nobody_takes_is_not_ready_until_its_worker_closes_it() -> None:
    template, theirs = TemplateProcess.offer()
    assert not template.ready() and template.sock.fileno() >= 0  # still waiting
    theirs.close()  # the worker exited without taking it
    assert not template.ready() and template.sock.fileno() < 0
    template.close()  # no process to kill: nothing happens


def test_an_untaken_offer_gives_way_to_an_execd_template_after_the_grace() -> None:
    """A program that says it can be a template but does not take the offer
    (not the SDK) still gets one: exec'd once the offer's grace has passed,
    not before, and only one offer is out at a time."""
    pool = StagePool(StageConfig("s", "/bin/true", ()), 1)
    theirs = pool.template_offer(100.0)
    assert theirs is not None and pool.template_offer(100.5) is None
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    pool.start_template(argv, dict(os.environ), 100.0 + OFFER_GRACE - 0.1)
    offered = pool.template
    assert offered is not None and offered.offered and not pool.template_tried
    pool.start_template(argv, dict(os.environ), 100.0 + OFFER_GRACE)
    execd = pool.template
    try:
        assert execd is not None and execd is not offered and not execd.offered
        assert pool.template_tried and offered.sock.fileno() < 0  # the offer was withdrawn
        assert pool.template_offer(200.0) is None  # the stage has tried: no more offers
    finally:
        pool.close_template()
        theirs.close()
    assert execd.proc is not None and execd.proc.wait(10) == -9


class _Starting:
    """The part of a WorkerProcess the pool's counting reads: a started worker."""

    def __init__(self, pid: int, queue_limit: int) -> None:
        self.pid = pid
        self.inflight: dict[int, float] = {}
        self.sent = 0
        self.answers_received = 0
        self.eof = self.retiring = self.stopping = False
        self.stdin_fd: int | None = 3


_kept: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_kept() -> Iterator[None]:
    yield
    while _kept:
        _kept.pop().close()


def _first_burst(parallelism: int = 4, queue_limit: int = 4) -> tuple[StagePool, _Starting]:
    """A pool whose first worker was just exec'd with the template offer (at t=100)."""
    pool = StagePool(
        StageConfig("s", "/bin/true", (), parallelism=parallelism, queue_limit=queue_limit), 1
    )
    theirs = pool.template_offer(100.0)
    assert theirs is not None
    _kept.append(theirs)  # the worker's end, held open: the offer is neither taken nor refused
    first = _Starting(4242, queue_limit)
    pool.workers.append(first)  # type: ignore[arg-type]
    pool.offered_to = first.pid
    return pool, first


def test_the_first_burst_claims_for_the_first_worker_only_while_its_template_is_on_its_way() -> (
    None
):
    """The other workers would each exec an interpreter: they wait for the template."""
    pool, first = _first_burst()
    assert pool.template_on_its_way(100.1) and pool.holding_for_template
    assert pool.capacity(100.1) == 4  # the first worker's room, no free slot
    placed, unplaced = pool.place(list(range(10)), 100.1, lambda p: None)
    assert [len(ids) for _, ids in placed] == [4] and unplaced == list(range(4, 10))


def test_the_template_wait_ends_with_the_first_answer_an_eof_or_the_hold() -> None:
    """A program that takes no offers answers without a greeting: its stage
    execs the others then, or at the latest after TEMPLATE_HOLD."""
    pool, first = _first_burst()
    first.answers_received = 1
    assert not pool.template_on_its_way(100.1) and not pool.holding_for_template
    assert pool.capacity(100.1) == 4 + 3 * 4
    pool, first = _first_burst()
    first.eof = True
    assert not pool.template_on_its_way(100.1)
    pool, first = _first_burst()
    assert pool.template_on_its_way(100.0 + TEMPLATE_HOLD - 0.01)
    assert not pool.template_on_its_way(100.0 + TEMPLATE_HOLD)
    assert pool.capacity(100.0 + TEMPLATE_HOLD) == 16


def test_no_template_wait_without_an_offer_out() -> None:
    """A stage that exec'd its first worker without an offer (not a child subreaper,
    a template tried already) counts its free slots as before."""
    pool = StagePool(StageConfig("s", "/bin/true", (), parallelism=4, queue_limit=4), 1)
    pool.workers.append(_Starting(1, 4))  # type: ignore[arg-type]
    assert not pool.template_on_its_way(100.0) and pool.capacity(100.0) == 16


def test_no_template_wait_once_the_stage_has_other_workers() -> None:
    """An offer out while other workers run (a program that takes no offer is
    offered again at a recycle): the stage's spawns do not wait for it."""
    pool, first = _first_burst()
    pool.workers.insert(0, _Starting(17, 4))  # type: ignore[arg-type]
    assert not pool.template_on_its_way(100.1)
    assert pool.capacity(100.1) == 4 + 4 + 2 * 4


def test_a_template_stopped_in_the_middle_of_a_spawn_is_given_up_at_once() -> None:
    """The template takes the spawn request, then stops (SIGSTOP, a debugger):
    it never answers. The dispatcher used to wait SPAWN_TIMEOUT (5 s) with its
    loop held; it now sees the stop within milliseconds and gives up (OSError:
    the stage execs its worker instead)."""
    from pepsi_dispatch.coordinator.workers.inhand import InHandSlot
    from pepsi_dispatch.coordinator.workers.templates import SPAWN_TIMEOUT

    script = (
        "import os, signal, socket, sys\n"
        "s = socket.socket(fileno=int(sys.argv[1]))\n"
        "s.send(b'ready')\n"
        "socket.recv_fds(s, 64, 8)\n"
        "os.kill(os.getpid(), signal.SIGSTOP)\n"
        "s.send(b'123')\n"
    )
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(theirs.fileno())], pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    template = TemplateProcess.__new__(TemplateProcess)
    template.proc, template.pid, template.sock, template._ready = child, child.pid, mine, False
    slot = InHandSlot()
    try:
        assert mine.recv(64) == b"ready"
        t0 = time.monotonic()
        with pytest.raises(OSError, match="stopped during a spawn"):
            template.fork(slot)
        assert time.monotonic() - t0 < SPAWN_TIMEOUT / 5
    finally:
        slot.handed_over()
        child.kill()
        child.wait()
        mine.close()

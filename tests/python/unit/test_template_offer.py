"""Unit tests of the template offered to a stage's first exec'd worker
(coordinator/workers/templates.py): which greetings adopt it, what an offer
that nobody takes leaves behind, and when the stage execs a template instead."""

from __future__ import annotations

import os
import subprocess
import sys

from pepsi_dispatch.config.model import StageConfig
from pepsi_dispatch.coordinator.workers.stage_pool import OFFER_GRACE, StagePool
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

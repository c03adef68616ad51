"""Unit tests of the template offered to a stage's first exec'd worker
(coordinator/workers/templates.py): which greetings adopt it, and what an
offer that nobody takes leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys

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

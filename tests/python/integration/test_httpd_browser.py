"""The dashboard in a real browser: headless Chromium (Debian's chromium + chromium-driver)
driven by selenium, against a real dispatcher and pipeline.

Loads each page, checks the numbers shown against the database, pauses and resumes a
stage, requeues a failed message and cancels a pending one (accepting each confirm), and
saves screenshots under the test's tmp_path. Also: the message list with its filters,
the id search box and actions on a selection; a stage held off (its PROGRAM removed)
marked on the graph, the stage table and the banner, the banner on every page (the
404 page too); its Try now button, and
Pause and Resume with what the stage then shows. Chromium missing is a failure, not
a skip: `make system-deps` installs it. PEPSI_DOCS_SCREENSHOTS=DIR also writes the
screenshots of docs/ there (that is how docs/dashboard*.png are made).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from browser_harness import accept_confirm, browser_fixture, click, listed, text_of  # noqa: F401
from dispatch_harness import VENV_BIN, Harness, harness_fixture, wait_until  # noqa: F401
from httpd_harness import Httpd
from selenium import webdriver
from selenium.webdriver.common.by import By


def test_dashboard_in_chromium(h: Harness, browser: webdriver.Chrome, tmp_path: Path) -> None:
    conf = h.conf(h.pipeline(["a", "b"], PARALLELISM=2), poll_interval="1 s", stats_interval="1 s")
    d = h.start(conf)
    srv = Httpd(conf, h.dsn, tmp_path / "httpd.log", allow_actions=True)
    try:
        # The page is open while the pipeline works: the chart gets a few seconds of history.
        browser.get(srv.base + "/")
        h.enqueue("a", [{"do": "sleep:0.03;next"}] * 150)
        failed = h.enqueue("a", [{"do_a": "sqlfail"}] * 3)
        h.wait_all()
        _walk(h, d, srv, browser, tmp_path, failed)
    finally:
        srv.stop()


def _db_counts(h: Harness) -> dict[tuple[str, str], int]:
    rows = h.conn.execute(
        "SELECT stage, CASE WHEN status IN ('failed', 'timeout', 'expired') THEN 'failed'"
        " ELSE status END, count(*) FROM pepsi.messages GROUP BY 1, 2"
    ).fetchall()
    return {(s, st): n for s, st, n in rows}


def _walk(h, d, srv: Httpd, browser, tmp_path: Path, failed: list[int]) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()

    # -- overview: graph, counts equal to the database, live refresh ---------------
    wait_until(lambda: text_of(browser, '#stages tr[data-stage="b"] td[data-count="done"]'), 15)

    def counts_match():
        want = _db_counts(h)
        for stage in ("a", "b"):
            for key in ("pending", "running", "paused", "failed", "done"):
                shown = text_of(browser, f'#stages tr[data-stage="{stage}"] td[data-count="{key}"]')
                if shown != str(want.get((stage, key), 0)):
                    return False
        return True

    wait_until(counts_match, 15, 0.2, lambda: f"counts shown = database {_db_counts(h)}")
    assert _db_counts(h)[("b", "done")] == 150 and _db_counts(h)[("a", "failed")] == 3
    assert browser.find_element(By.CSS_SELECTOR, '#graph-svg g[data-node="a"]')
    assert browser.find_element(By.CSS_SELECTOR, '#graph-svg path[data-edge="a>b"]')
    node_b = text_of(browser, '#graph-svg g[data-node="b"]') or ""
    assert "pending 0" in node_b and "failed 0" in node_b, node_b
    # Every message went through b once: the page (flushed statistics plus the
    # dispatcher's unflushed counters) and, once flushed, stage_stats say 150. (Read
    # from stage_stats before its flush, the figure could be short of the page's.)
    wait_until(lambda: h.stage_stats()["b"]["processed"] == 150, 15)
    wait_until(
        lambda: text_of(browser, '#stages tr[data-stage="b"] td[data-processed]') == "150",
        15,
        0.2,
        lambda: (
            "processed of b shown = "
            + repr(text_of(browser, '#stages tr[data-stage="b"] td[data-processed]'))
        ),
    )
    # Live refresh: a new row shows up without reloading the page.
    browser.execute_script("window.__marker = 1")
    [stray] = h.enqueue("z", 1)
    wait_until(
        lambda: text_of(browser, '#stages tr[data-stage="z"] td[data-count="pending"]') == "1",
        10,
        0.1,
        "the new stage row to appear by itself",
    )
    assert browser.execute_script("return window.__marker") == 1  # same page, not reloaded
    # The throughput chart needs two samples or more; the page polls every 2 s.
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#chart-svg"), 15)
    browser.save_screenshot(str(shots / "overview.png"))
    docs_shot(browser, "dashboard.png")

    # -- pause stage b (confirm), then rows of b stay pending -----------------------
    click(browser, "#pause-b")
    assert "Pause stage b?" in accept_confirm(browser)
    wait_until(lambda: text_of(browser, "#pause-b") == "Resume", 10)
    assert h.conn.execute(
        "SELECT value FROM pepsi.config WHERE section = 'stage-b' AND option = 'PAUSED'"
    ).fetchone() == ("yes",)
    wait_until(lambda: "configuration reloaded" in d.log(), 10, 0.05, "the dispatcher's reload")
    keep, cancel = h.enqueue("b", 2)
    wait_until(
        lambda: text_of(browser, '#stages tr[data-stage="b"] td[data-count="pending"]') == "2", 10
    )
    assert h.row(keep)["status"] == "pending" and h.row(cancel)["status"] == "pending"

    # -- failures grouped by reason, their messages ---------------------------------
    # Reasons that differ only in a number are one group, the raw ones a click away.
    h.conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, state) SELECT 'a', 'failed',"
        " jsonb_build_object('error', format('bad input n=%s', 200 + i % 2))"
        " FROM generate_series(1, 3) AS i"
    )
    browser.get(srv.base + "/failures")
    wait_until(
        lambda: text_of(browser, 'tr.reason[data-reason="scripted"] td[data-count]') == "3", 10
    )
    group = 'tr.reason[data-reason="bad input n=<n>"]'

    def grouped():
        if text_of(browser, f"{group} td[data-count]") == "3":
            return True
        browser.refresh()  # the list does not poll; the snapshot is cached for 1 s
        return False

    wait_until(grouped, 10, 1.2, lambda: browser.find_element(By.ID, "main").text)
    click(browser, f"{group} details.raw summary")
    raw = text_of(browser, f"{group} details.raw") or ""
    assert "bad input n=201" in raw and "bad input n=200" in raw, raw
    docs_shot(browser, "dashboard-failures.png")
    # An action per group: requeue all of it (confirm), with a result line.
    click(browser, f"{group} button.requeue-group")
    assert 'Requeue the 3 message(s) of group "bad input n=<n>"' in accept_confirm(browser)
    wait_until(lambda: "3 of 3" in (text_of(browser, "#group-result") or ""), 10)
    assert h.conn.execute(
        "SELECT count(*) FROM pepsi.messages WHERE state -> 'previous_error' ->> 'error'"
        " LIKE 'bad input n=%'"
    ).fetchone() == (3,)
    browser.save_screenshot(str(shots / "failures.png"))
    click(browser, 'tr.reason[data-reason="scripted"] a.reason-link')
    wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#failed tr[data-id]")) == 3, 10)
    shown = [
        int(e.get_attribute("data-id"))
        for e in browser.find_elements(By.CSS_SELECTOR, "#failed tr[data-id]")
    ]
    assert shown == sorted(failed, reverse=True)
    browser.save_screenshot(str(shots / "failed-messages.png"))

    # -- one message: requeue it (confirm) -----------------------------------------
    target = failed[0]
    click(browser, f'#failed tr[data-id="{target}"] a')
    wait_until(lambda: text_of(browser, "#msg-status") == "failed", 10)
    assert "scripted" in browser.find_element(By.ID, "message").text
    browser.save_screenshot(str(shots / "message-failed.png"))
    click(browser, "#btn-requeue")
    assert f"Requeue message #{target}?" in accept_confirm(browser)
    # It runs again at once (dashboard_requeue notifies) and fails again (sqlfail):
    # the first error is kept under previous_error.
    wait_until(lambda: "previous_error" in h.row(target)["state"], 10)
    wait_until(lambda: "previous_error" in (text_of(browser, "#message") or ""), 10)
    # Its history: both failed attempts, and its retries against MAX_RETRIES.
    wait_until(
        lambda: (
            len(browser.find_elements(By.CSS_SELECTOR, '#history tr[data-outcome="failed"]')) == 2
        ),
        10,
        0.1,
        lambda: text_of(browser, "#history") or "no history table",
    )
    assert text_of(browser, "#msg-retries") == "0 of 10 (MAX_RETRIES)"
    docs_shot(browser, "dashboard-message.png")

    # -- a pending message: cancel it (confirm) -------------------------------------
    browser.get(f"{srv.base}/message/{cancel}")
    wait_until(lambda: text_of(browser, "#msg-status") == "pending", 10)
    click(browser, "#btn-cancel")
    assert f"Cancel message #{cancel}?" in accept_confirm(browser)
    wait_until(lambda: h.row(cancel)["status"] == "failed", 10)
    assert h.row(cancel)["state"]["error"] == "cancelled by operator"
    # Shown as cancelled, not as a plain failure.
    wait_until(lambda: text_of(browser, "#msg-status") == "cancelled", 10)
    browser.save_screenshot(str(shots / "message-cancelled.png"))

    _message_list(h, srv, browser, shots)

    # -- resume b: the other pending row is processed --------------------------------
    browser.get(srv.base + "/")
    click(browser, "#pause-b")
    assert "Resume stage b?" in accept_confirm(browser)
    wait_until(lambda: h.row(keep)["status"] == "done", 15, 0.1, lambda: d.tail())
    assert h.conn.execute("SELECT count(*) FROM pepsi.config").fetchone() == (0,)
    assert h.row(stray)["status"] == "pending"  # stage z is not configured
    for name in ("overview", "failures", "failed-messages", "message-failed", "message-cancelled"):
        assert (shots / f"{name}.png").stat().st_size > 1000


def docs_shot(browser: webdriver.Chrome, name: str) -> None:
    """With PEPSI_DOCS_SCREENSHOTS=DIR, a screenshot for docs/ (DIR/name)."""
    where = os.environ.get("PEPSI_DOCS_SCREENSHOTS")
    if where:
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1100, min(2400, max(700, int(height) + 120)))
        browser.save_screenshot(str(Path(where) / name))
        browser.set_window_size(1100, 1000)


def _message_list(h: Harness, srv: Httpd, browser: webdriver.Chrome, shots: Path) -> None:
    """Every status, the filters of pepsi-queue list, the id search, actions on a selection."""
    seven, eight = h.enqueue("z", [{"customer": 7}, {"customer": 8}])
    delayed = h.conn.execute(
        "SELECT pepsi.enqueue('z', '{\"customer\": 9}', now() + interval '1 h')"
    ).fetchone()[0]
    browser.get(srv.base + "/messages?stage=z")
    wait_until(lambda: set(listed(browser)) >= {seven, eight, delayed}, 10)
    # A delayed message says so, with its due time labelled "due".
    kind = text_of(browser, f'#list tr[data-id="{delayed}"] td[data-kind]')
    assert kind == "delayed", kind
    assert "due " in (text_of(browser, f'#list tr[data-id="{delayed}"]') or "")
    # Filters: payload containment, typed into the form.
    where = browser.find_element(By.CSS_SELECTOR, '#filters input[name="where"]')
    where.send_keys('{"customer": 7}')
    click(browser, "#apply")
    wait_until(lambda: listed(browser) == [seven], 10, 0.1, lambda: str(listed(browser)))
    assert "where=" in browser.current_url
    # Status filter: paused rows only.
    browser.get(srv.base + "/messages?status=paused")
    wait_until(lambda: listed(browser) == [delayed], 10)
    # Select all shown (then one less) and cancel them (confirm), with a result message.
    browser.get(srv.base + "/messages?stage=z&status=pending")
    wait_until(lambda: set(listed(browser)) >= {seven, eight}, 10)
    click(browser, "#pick-all")
    docs_shot(browser, "dashboard-messages.png")
    for wid in set(listed(browser)) - {seven, eight}:  # the stray row stays pending
        click(browser, f'#list tr[data-id="{wid}"] input.pick')
    click(browser, "#sel-cancel")
    assert "Cancel 2 selected message(s)?" in accept_confirm(browser)
    wait_until(lambda: "2 of 2" in (text_of(browser, "#msg-result") or ""), 10)
    assert h.row(seven)["status"] == h.row(eight)["status"] == "failed"
    # ... and requeue a selection of failed ones.
    browser.get(srv.base + "/messages?stage=z&status=failed")
    wait_until(
        lambda: set(listed(browser)) == {seven, eight}, 10, 0.1, lambda: str(listed(browser))
    )
    wait_until(lambda: text_of(browser, f'#list tr[data-id="{seven}"] td[data-kind]'), 10)
    assert text_of(browser, f'#list tr[data-id="{seven}"] td[data-kind]') == "cancelled"
    click(browser, f'#list tr[data-id="{seven}"] input.pick')
    click(browser, "#sel-requeue")
    assert "Requeue 1 selected message(s)?" in accept_confirm(browser)
    wait_until(lambda: h.row(seven)["status"] == "pending", 10)
    wait_until(lambda: "1 of 1" in (text_of(browser, "#msg-result") or ""), 10)
    browser.save_screenshot(str(shots / "messages.png"))
    # The id search box.
    box = browser.find_element(By.ID, "search-id")
    box.send_keys(str(delayed))
    click(browser, "#search-go")
    wait_until(lambda: text_of(browser, "#msg-status") == "delayed", 10)
    assert browser.current_url.endswith(f"/message/{delayed}")
    assert text_of(browser, "#msg-due")


def test_held_off_stage_in_the_dashboard(
    h: Harness, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    prog = tmp_path / "stage-a"
    prog.write_text(f'#!/bin/sh\nexec {h.program({"a": "b"})} "$@"\n')
    prog.chmod(0o755)
    stages = h.pipeline(["a", "b"])
    stages["a"]["PROGRAM"] = str(prog)
    conf = h.conf(stages)
    conf.write_text(conf.read_text() + "\n[pepsi-httpd]\nHELD_OFF_LIMIT = 1 s\n")
    d = h.start(conf)
    srv = Httpd(conf, h.dsn, tmp_path / "httpd.log")
    try:
        prog.unlink()
        held = h.enqueue("a", 4)
        browser.get(srv.base + "/")
        node = '#graph-svg g[data-node="a"][data-health="no_worker"]'
        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, node), 20, 0.2, d.tail)
        # The cause is in the node's tooltip (its <title>); the note drawn is cut short.
        tip = browser.find_element(By.CSS_SELECTOR, node).get_attribute("textContent") or ""
        assert "cannot start PROGRAM" in tip, tip
        cell = text_of(browser, '#stages tr[data-stage="a"] td[data-health="no_worker"]') or ""
        assert "no worker can start" in cell and "cannot start PROGRAM" in cell, cell
        banner = text_of(browser, '#banner [data-held="a"]') or ""
        assert "4 pending" in banner and str(prog) in banner, banner
        assert browser.find_elements(By.CSS_SELECTOR, '#graph-svg g[data-node="b"].serving')
        # The banner on every page of the dashboard, its 404 page (with the nav) too.
        for path in (
            "/messages",
            "/failures",
            "/failures?stage=a&group=x",
            f"/message/{held[0]}",
            "/no/such/page",
        ):
            browser.get(srv.base + path)
            wait_until(
                lambda: "4 pending" in (text_of(browser, '#banner [data-held="a"]') or ""),
                10,
                0.1,
                lambda p=path: f"the banner on {p}",
            )
        assert "Not found" in (text_of(browser, "#not-found") or "")
        assert browser.find_element(By.CSS_SELECTOR, "header nav a[href='/failures']")
        # The same stage, past the limit, on /healthz and /metrics.
        wait_until(lambda: srv.get("/healthz")[0] == 503, 10)
        assert "stage a no worker" in srv.get("/healthz")[2]
        assert 'pepsi_stage_health{stage="a",state="no_worker"} 1.0' in srv.get("/metrics")[2]
        status = subprocess.run(
            [str(VENV_BIN / "pepsi-queue"), "status"],
            env={**os.environ, "PEPSI_DSN": h.dsn},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        assert "stage a: held off, no worker running since" in status, status
        browser.save_screenshot(str(tmp_path / "held-off.png"))
        docs_shot(browser, "dashboard-held-off.png")
    finally:
        srv.stop()


def test_pause_resume_and_try_now_buttons(
    h: Harness, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    """Try now ends a held-off stage's hold-off (its program fixed meanwhile): the
    message is done long before the cooldown would have ended, and the stage
    shows serving; Pause and Resume show paused and serving again, with the
    paused stage's rows pending meanwhile."""
    prog = tmp_path / "stage-a"
    prog.write_text("#!/bin/sh\necho 'cannot start: config missing' >&2\nexit 3\n")
    prog.chmod(0o755)
    stages = {"a": {"PROGRAM": str(prog)}, "b": {"PROGRAM": h.program()}}
    d = h.start(h.conf(stages, poll_interval="1 s"))
    srv = Httpd(d.conf, h.dsn, tmp_path / "httpd.log", allow_actions=True)
    try:
        [wid] = h.enqueue("a", 1)
        browser.get(srv.base + "/")
        # Held off, and long enough that the cooldown's own end is 8 s away or more.
        pattern = re.compile(r"stage a: .*holding off new workers for (\d+) s")
        wait_until(
            lambda: any(int(m.group(1)) >= 8 for m in pattern.finditer(d.log())), 60, 0.05, d.tail
        )
        seen = time.monotonic()
        wait_until(lambda: browser.find_elements(By.ID, "trynow-a"), 10, 0.1, d.tail)
        assert not browser.find_elements(By.ID, "trynow-b")  # b serves: no button
        prog.write_text(f'#!/bin/sh\nexec {h.program()} "$@"\n')
        click(browser, "#trynow-a")
        assert "Try stage a now?" in accept_confirm(browser)
        wait_until(lambda: h.row(wid)["status"] == "done", 8, 0.05, d.tail)
        assert time.monotonic() - seen < 8, "done only at the cooldown's end"
        cell = '#stages tr[data-stage="a"] td[data-health="serving"]'
        wait_until(lambda: text_of(browser, cell) == "serving", 10, 0.1, d.tail)
        assert not browser.find_elements(By.ID, "trynow-a")

        click(browser, "#pause-b")
        assert "Pause stage b?" in accept_confirm(browser)
        wait_until(lambda: text_of(browser, "#pause-b") == "Resume", 10)
        paused = '#stages tr[data-stage="b"] td[data-health="paused"]'
        wait_until(lambda: text_of(browser, paused) == "paused", 10, 0.1, d.tail)
        [waiting] = h.enqueue("b", 1)
        wait_until(
            lambda: text_of(browser, '#stages tr[data-stage="b"] td[data-count="pending"]') == "1",
            10,
        )
        assert h.row(waiting)["status"] == "pending"
        browser.save_screenshot(str(tmp_path / "paused.png"))

        click(browser, "#pause-b")
        assert "Resume stage b?" in accept_confirm(browser)
        wait_until(lambda: h.row(waiting)["status"] == "done", 15, 0.1, d.tail)
        wait_until(lambda: text_of(browser, "#pause-b") == "Pause", 10)
        serving = '#stages tr[data-stage="b"] td[data-health="serving"]'
        wait_until(lambda: text_of(browser, serving) == "serving", 10, 0.1, d.tail)
    finally:
        srv.stop()


def test_read_only_dashboard_has_no_buttons(
    h: Harness, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    conf = h.conf(h.pipeline(["a"]))
    [wid] = h.enqueue("a", 1)
    # The stage registry (a dispatcher writes it at start; none runs here).
    h.conn.execute(
        "SELECT pepsi.register_stages(NULL, ARRAY['a'], ARRAY[''], NULL, NULL, NULL, NULL, NULL)"
    )
    srv = Httpd(conf, h.dsn, tmp_path / "httpd.log")
    try:
        browser.get(f"{srv.base}/message/{wid}")
        wait_until(lambda: text_of(browser, "#msg-status") == "pending", 10)
        assert not browser.find_elements(By.ID, "btn-cancel")
        assert "read-only" in browser.find_element(By.ID, "main").text
        browser.get(srv.base + "/")
        wait_until(lambda: browser.find_elements(By.ID, "pause-a"), 10)
        assert not browser.find_element(By.ID, "pause-a").is_displayed()
    finally:
        srv.stop()

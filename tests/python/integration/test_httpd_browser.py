"""The dashboard in a real browser: headless Chromium (Debian's chromium + chromium-driver)
driven by selenium, against a real dispatcher and pipeline.

Loads each page, checks the numbers shown against the database, pauses and resumes a
stage, requeues a failed message and cancels a pending one (accepting each confirm), and
saves screenshots under the test's tmp_path. Chromium missing is a failure, not a skip:
`make system-deps` installs it. PEPSI_DASHBOARD_PNG=FILE also writes the overview there
(that is how docs/dashboard.png is made).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from dispatch_harness import Harness, harness_fixture, wait_until  # noqa: F401
from httpd_harness import Httpd
from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.fail(
            "headless Chromium is required for the dashboard test: "
            "apt-get install chromium chromium-driver (make system-deps does it)"
        )
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # we run as root in CI
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1100,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(
        service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")),
        options=opts,
    )
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def text_of(driver: webdriver.Chrome, css: str) -> str | None:
    """Text of the first element matching css, None while absent (the page re-renders)."""
    try:
        return driver.find_element(By.CSS_SELECTOR, css).text
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def click(driver: webdriver.Chrome, css: str) -> None:
    def go():
        try:
            driver.find_element(By.CSS_SELECTOR, css).click()
            return True
        except (NoSuchElementException, StaleElementReferenceException):
            return False

    wait_until(go, 10, 0.05, f"clickable {css}")


def accept_confirm(driver: webdriver.Chrome) -> str:
    def alert():
        try:
            return driver.switch_to.alert
        except NoAlertPresentException:
            return None

    a = wait_until(alert, 10, 0.05, "the confirm dialog")
    text = a.text
    a.accept()
    return text


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
        " ELSE status END, count(*) FROM pepsi.workqueue GROUP BY 1, 2"
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
    processed_b = h.stage_stats()["b"]["processed"]
    wait_until(
        lambda: (
            text_of(browser, '#stages tr[data-stage="b"] td[data-processed]') == str(processed_b)
        ),
        15,
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
    if os.environ.get("PEPSI_DASHBOARD_PNG"):
        browser.save_screenshot(os.environ["PEPSI_DASHBOARD_PNG"])

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
    browser.get(srv.base + "/failures")
    wait_until(
        lambda: text_of(browser, 'tr.reason[data-reason="scripted"] td[data-count]') == "3", 10
    )
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

    # -- a pending message: cancel it (confirm) -------------------------------------
    browser.get(f"{srv.base}/message/{cancel}")
    wait_until(lambda: text_of(browser, "#msg-status") == "pending", 10)
    click(browser, "#btn-cancel")
    assert f"Cancel message #{cancel}?" in accept_confirm(browser)
    wait_until(lambda: h.row(cancel)["status"] == "failed", 10)
    assert h.row(cancel)["state"]["error"] == "cancelled by operator"
    wait_until(lambda: text_of(browser, "#msg-status") == "failed", 10)
    browser.save_screenshot(str(shots / "message-cancelled.png"))

    # -- resume b: the other pending row is processed --------------------------------
    browser.get(srv.base + "/")
    click(browser, "#pause-b")
    assert "Resume stage b?" in accept_confirm(browser)
    wait_until(lambda: h.row(keep)["status"] == "done", 15, 0.1, lambda: d.tail())
    assert h.conn.execute("SELECT count(*) FROM pepsi.config").fetchone() == (0,)
    assert h.row(stray)["status"] == "pending"  # stage z is not configured
    for name in ("overview", "failures", "failed-messages", "message-failed", "message-cancelled"):
        assert (shots / f"{name}.png").stat().st_size > 1000


def test_read_only_dashboard_has_no_buttons(
    h: Harness, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    conf = h.conf(h.pipeline(["a"]))
    [wid] = h.enqueue("a", 1)
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

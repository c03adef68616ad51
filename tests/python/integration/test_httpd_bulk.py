"""The dashboard's bulk actions and page polish, in headless Chromium (as
test_httpd_browser.py drives it) and over HTTP, against a real pepsi-httpd.

* The message list's "Requeue all matching" / "Cancel all matching": a filter
  applied in the form, the confirm dialog's count, what the page says after,
  and the database (every matching row, none other; no row cap of a page).
* /api/bulk: a count by GET, the action by POST only with --allow-actions.
* Polish: one timestamp format on every page, an expanded traceback inside
  its card, a narrow window with no sideways page scroll (tables scroll in
  their own box), unknown paths answered with the dashboard's 404 page.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg
from browser_harness import accept_confirm, browser_fixture, click, listed, text_of  # noqa: F401
from dispatch_harness import wait_until
from httpd_harness import Httpd
from selenium import webdriver
from selenium.webdriver.common.by import By

#: The one timestamp format of the dashboard.
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
PAGES = ("/", "/messages", "/failures", "/failures?stage=a&group=bad%20input%20n%3D%3Cn%3E")


def seed(conn: psycopg.Connection) -> dict[str, list[int]]:
    """Stage a registered; failed rows of two customers and two ages; pending ones."""
    conn.execute(
        "SELECT pepsi.register_stages(NULL, ARRAY['a', 'b'], ARRAY['', ''],"
        " NULL, NULL, NULL, NULL, NULL)"
    )

    def rows(sql: str) -> list[int]:
        return [r[0] for r in conn.execute(sql + " RETURNING workqueue_id").fetchall()]

    return {
        "seven_old": rows(
            "INSERT INTO pepsi.workqueue (stage, status, payload, state, updated_at)"
            " SELECT 'a', 'failed', '{\"customer\": 7}',"
            " jsonb_build_object('error', format('bad input n=%s', i)), now() - interval '2 h'"
            " FROM generate_series(1, 120) AS i"
        ),
        "seven_new": rows(
            "INSERT INTO pepsi.workqueue (stage, status, payload, state)"
            " VALUES ('a', 'failed', '{\"customer\": 7}', '{\"error\": \"bad input n=0\"}')"
        ),
        "eight_old": rows(
            "INSERT INTO pepsi.workqueue (stage, status, payload, state, updated_at)"
            " VALUES ('a', 'timeout', '{\"customer\": 8}', '{\"error\": \"slow\"}',"
            " now() - interval '2 h')"
        ),
        "b_old": rows(
            "INSERT INTO pepsi.workqueue (stage, status, payload, state, updated_at)"
            " VALUES ('b', 'failed', '{\"customer\": 7}', '{\"error\": \"bad input n=9\"}',"
            " now() - interval '2 h')"
        ),
        "pending": rows(
            "INSERT INTO pepsi.workqueue (stage, status, payload)"
            " SELECT 'b', 'pending', '{\"customer\": 7}' FROM generate_series(1, 3)"
        ),
    }


def status_of(conn: psycopg.Connection, ids: list[int]) -> set[str]:
    rows = conn.execute(
        "SELECT DISTINCT status FROM pepsi.messages WHERE workqueue_id = ANY(%s)", (ids,)
    ).fetchall()
    return {r[0] for r in rows}


def test_bulk_requeue_and_cancel_on_the_message_list_in_chromium(
    conn, dsn: str, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    made = seed(conn)
    srv = Httpd(None, dsn, tmp_path / "httpd.log", allow_actions=True)
    try:
        browser.get(srv.base + "/messages")
        wait_until(lambda: listed(browser), 10)
        # The filter, typed into the form: stage a, customer 7, last updated over an hour ago.
        browser.find_element(By.CSS_SELECTOR, '#filters input[name="stage"]').send_keys("a")
        browser.find_element(By.CSS_SELECTOR, '#filters input[name="older_than"]').send_keys("1h")
        where = browser.find_element(By.CSS_SELECTOR, '#filters input[name="where"]')
        where.send_keys('{"customer": 7}')
        click(browser, "#apply")
        wait_until(lambda: "older_than=1h" in browser.current_url, 10)
        # The page shows 100 rows; the filter selects 120: the action takes them all.
        wait_until(lambda: len(listed(browser)) == 100, 10, 0.1, lambda: str(listed(browser)))
        click(browser, "#bulk-requeue")
        question = accept_confirm(browser)
        assert "Requeue all 120 failed, timeout, expired message(s) matching this filter" in (
            question
        ), question
        assert "stage a" in question and "older than 1h" in question, question
        wait_until(
            lambda: (
                "120 of 120 message(s) matching the filter requeued"
                in (text_of(browser, "#msg-result") or "")
            ),
            10,
            0.1,
            lambda: text_of(browser, "#main") or "",
        )
        assert status_of(conn, made["seven_old"]) == {"pending"}
        assert status_of(conn, made["seven_new"]) == {"failed"}  # updated just now
        assert status_of(conn, made["eight_old"]) == {"timeout"}  # another customer
        assert status_of(conn, made["b_old"]) == {"failed"}  # another stage
        # The list is shown again under the same filter: a requeued message was
        # updated just now, so none is older than an hour any more.
        assert "older_than=1h" in browser.current_url
        wait_until(lambda: browser.find_elements(By.ID, "list-empty"), 10)
        browser.get(srv.base + "/messages?stage=a&status=pending")
        wait_until(lambda: len(listed(browser)) == 100, 10)
        kinds = {e.text for e in browser.find_elements(By.CSS_SELECTOR, "#list td[data-kind]")}
        assert kinds == {"pending"}

        # Cancel: the confirm's count is the filter's pending and paused rows of stage b.
        browser.get(srv.base + "/messages?stage=b&status=pending")
        wait_until(lambda: len(listed(browser)) == 3, 10)
        assert browser.find_element(By.ID, "bulk-requeue").get_attribute("disabled")
        click(browser, "#bulk-cancel")
        assert "Cancel all 3 pending, paused message(s)" in accept_confirm(browser)
        wait_until(lambda: "3 of 3" in (text_of(browser, "#msg-result") or ""), 10)
        assert status_of(conn, made["pending"]) == {"failed"}
        browser.save_screenshot(str(tmp_path / "bulk.png"))
    finally:
        srv.stop()


def test_bulk_api_counts_by_get_and_acts_by_post_with_actions_allowed(
    conn, dsn: str, tmp_path: Path
) -> None:
    made = seed(conn)
    ro = Httpd(None, dsn, tmp_path / "ro.log")
    rw = Httpd(None, dsn, tmp_path / "rw.log", allow_actions=True)
    try:
        status, _, body = ro.get("/api/bulk?action=requeue&stage=a&where=%7B%22customer%22%3A7%7D")
        assert status == 200, body
        count = json.loads(body)
        assert count["matched"] == 121 and count["newest_id"] == made["seven_new"][0]
        status, _ = ro.post("/api/bulk", {"action": "requeue", "stage": "a"})
        assert status == 403  # read-only: no action
        assert status_of(conn, made["seven_old"]) == {"failed"}
        assert ro.get("/api/bulk?action=drop")[0] == 400
        assert rw.post("/api/bulk", {"action": "cancel", "group": "x"})[0] == 400
        assert rw.post("/api/bulk", {"action": "requeue", "status": "pending"})[0] == 400
        # Acting on what was counted: before the newest id counted + 1.
        status, answer = rw.post(
            "/api/bulk",
            {
                "action": "requeue",
                "stage": "a",
                "where": '{"customer": 7}',
                "before": count["newest_id"],
            },
        )
        assert (status, answer) == (200, {"matched": 120, "rows": 120}), answer
        assert status_of(conn, made["seven_new"]) == {"failed"}
    finally:
        ro.stop()
        rw.stop()


def test_unknown_paths_get_the_dashboards_404_page(conn, dsn: str, tmp_path: Path) -> None:
    srv = Httpd(None, dsn, tmp_path / "httpd.log")
    try:
        for path in ("/nope", "/static/nope.js", "/message/x"):
            status, ctype, body = srv.get(path)
            assert status == 404 and ctype.startswith("text/html"), (path, ctype)
            assert 'id="not-found"' in body and "<nav>" in body and "/static/app.css" in body
        status, ctype, body = srv.get("/nope/<script>")
        assert status == 404 and "<script>" not in body.split('id="not-found"')[1]
        status, ctype, body = srv.get("/api/nope")
        assert (status, ctype, json.loads(body)) == (
            404,
            "application/json",
            {"error": "not found"},
        )
    finally:
        srv.stop()


def _overflow(browser: webdriver.Chrome) -> list[str]:
    """What sticks out sideways: the page itself, or an element outside a table's box."""
    return browser.execute_script(
        """
        const out = [];
        const root = document.documentElement;
        if (root.scrollWidth > root.clientWidth + 1)
          out.push("page " + root.scrollWidth + " > " + root.clientWidth);
        const all = "section, header, header *, #banner, pre, details, form, #main p";
        for (const e of document.querySelectorAll(all)) {
          if (e.closest(".table-wrap, #graph")) continue;
          const r = e.getBoundingClientRect();
          if (r.right > root.clientWidth + 1)
            out.push(e.tagName + "#" + e.id + " right " + r.right);
        }
        return out;
        """
    )


def _broken_words(browser: webdriver.Chrome) -> list[str]:
    """Words of table headers and buttons that the layout split over two lines
    ("pendi / ng"): each word's text range has one box unless it was broken."""
    return browser.execute_script(
        """
        const out = [];
        for (const e of document.querySelectorAll("#main th, #main button")) {
          const walk = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
          for (let t = walk.nextNode(); t; t = walk.nextNode()) {
            for (const m of t.data.matchAll(/\\S+/g)) {
              const r = document.createRange();
              r.setStart(t, m.index);
              r.setEnd(t, m.index + m[0].length);
              if (r.getClientRects().length > 1) out.push(m[0]);
            }
          }
        }
        return out;
        """
    )


def _timestamps(browser: webdriver.Chrome) -> list[str]:
    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#main time.ts")]


def test_dashboard_pages_timestamps_tracebacks_and_narrow_layout_in_chromium(
    conn, dsn: str, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    made = seed(conn)
    wid = made["seven_new"][0]
    conn.execute(
        "INSERT INTO pepsi.attempts (workqueue_id, attempt, stage, started_at, ended_at,"
        " outcome, reason, traceback) VALUES (%s, 1, 'a', now() - interval '1 min', now(),"
        " 'failed', 'bad input', %s)",
        (wid, "Traceback (most recent call last):\n  " + "x" * 600 + "\nValueError: bad input\n"),
    )
    conn.execute(
        "INSERT INTO pepsi.workqueue (stage, status, timeout, state) VALUES"
        " ('a', 'paused', now() + interval '1 h',"
        ' \'{"delayed_until": "2030-01-01T00:00:00+00:00"}\')'
    )
    srv = Httpd(None, dsn, tmp_path / "httpd.log")
    try:
        # One timestamp format on every page (the message page: created, updated, history).
        for path in (*PAGES, f"/message/{wid}", "/messages?status=paused"):
            browser.get(srv.base + path)
            wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#main section"), 10)
            wait_until(lambda: "updated" in (text_of(browser, "#status") or ""), 10)
            stamps = _timestamps(browser)
            assert _broken_words(browser) == [], path  # no "pendi / ng" headers
            if path not in ("/", "/failures"):  # the counts pages show no time here
                assert stamps, path
            assert all(TIMESTAMP.match(t) for t in stamps), (path, stamps)
            status_line = text_of(browser, "#status") or ""
            assert TIMESTAMP.match(status_line.removeprefix("updated ")), status_line
        # An expanded traceback stays inside its card.
        browser.get(f"{srv.base}/message/{wid}")
        click(browser, "#history details summary")
        wait_until(
            lambda: browser.find_element(By.CSS_SELECTOR, "#history details pre").is_displayed(), 10
        )
        assert _overflow(browser) == []
        pre = browser.find_element(By.CSS_SELECTOR, "#history details pre")
        card = browser.execute_script("return arguments[0].closest('section')", pre)
        assert pre.rect["x"] + pre.rect["width"] <= card.rect["x"] + card.rect["width"] + 1
        # A narrow window: the nav wraps, nothing but a table's box scrolls sideways.
        browser.set_window_size(400, 900)
        for path in (*PAGES, f"/message/{wid}", "/nope"):
            browser.get(srv.base + path)
            wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#main section"), 10)
            wait_until(lambda: "updated" in (text_of(browser, "#status") or ""), 10)
            assert _overflow(browser) == [], path
            assert browser.find_element(By.ID, "nav-messages").is_displayed()
        browser.save_screenshot(str(tmp_path / "narrow-404.png"))
        assert "Not found" in (text_of(browser, "#not-found") or "")
        assert browser.find_element(By.CSS_SELECTOR, "header nav a[href='/messages']")
    finally:
        srv.stop()

"""Headless Chromium for the dashboard's tests (Debian's chromium + chromium-driver,
driven by selenium): the ``browser`` fixture and the helpers that read and click
a page that re-renders, and accept its confirm dialogs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from dispatch_harness import wait_until
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


@pytest.fixture(name="browser")
def browser_fixture(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """Headless Chromium with its own profile under tmp_path; a failure when missing."""
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


def listed(browser: webdriver.Chrome) -> list[int]:
    """Ids listed on the messages page (empty while it re-renders)."""
    try:
        return [
            int(e.get_attribute("data-id"))
            for e in browser.find_elements(By.CSS_SELECTOR, "#list tbody tr[data-id]")
        ]
    except StaleElementReferenceException:
        return []

"""The console in a real browser: headless Chromium (Debian ``chromium`` + ``chromium-driver``) via selenium.

The page is loaded once; the test then changes the cluster (vehicles connect, a request is delivered to
more and more of its vehicles) and waits for the page, never reloaded, to show it. The request panel lists
every request (``/api/requests``, the lifecycle counters) with a progress bar; the test then cancels the
request with its button and sees the remaining VIN counted cancelled. ``FANOUT_CONSOLE_PNG=docs/console.png``
saves the final screenshot there (how ``docs/console.png`` is made); otherwise it goes to the test's tmp dir.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterator

import pytest

from .fanout_harness import Vehicle, publish_batch, running_cluster, wait_until
from .http_fixtures import http_config

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
REPO = Path(__file__).resolve().parents[2]
REQUEST = "ota-2024-11-campaign"
VINS = ["WVWZZZ1JZXW000001", "WVWZZZ1JZXW000002", "WVWZZZ1JZXW000003", "WVWZZZ1JZXW000004"]

pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                                reason="needs the Debian packages chromium and chromium-driver (make chromium)")


@pytest.fixture(scope="module")
def cluster(ray_local, tmp_path_factory):
    with running_cluster(http_config(tmp_path_factory.mktemp("http-console"))) as c:
        yield c


@pytest.fixture
def browser(tmp_path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1280,780"):
        options.add_argument(flag)
    # the driver binary given explicitly: selenium must not try to download one
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def text(driver, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id).text


def request_cells(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "#requests tbody tr")
    return [c.text for c in rows[0].find_elements(By.TAG_NAME, "td")] if rows else []


def table_cells(driver, table_id: str) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    return [[c.text for c in r.find_elements(By.TAG_NAME, "td")]
            for r in driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")]


def progress_value(driver) -> float:
    from selenium.webdriver.common.by import By

    return float(driver.find_element(By.CSS_SELECTOR, "#requests tbody tr progress").get_property("value"))


def test_console_shows_the_cluster_live_and_follows_a_request(cluster, browser, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(cluster.info["http"])
    assert browser.title == "sdv-fanout console"
    wait_until(lambda: text(browser, "health") == "healthy", 30, "the page's first poll")
    assert text(browser, "total-connections") == "0"
    assert text(browser, "total-shards") == str(cluster.info["shards"])
    assert len(browser.find_elements(By.CSS_SELECTOR, "#shards tbody tr")) == cluster.info["shards"]
    assert "n0" in browser.find_element(By.CSS_SELECTOR, "#nodes tbody").text
    browser.execute_script("window.__notReloaded = true;")

    publish_batch(cluster.port, VINS, REQUEST)
    wait_until(lambda: text(browser, "total-pending") == str(len(VINS)), 15, "the pending rows on the page")
    # listed by itself (GET /api/requests): no need to watch it by id
    wait_until(lambda: request_cells(browser)[:1] == [REQUEST] and request_cells(browser)[4] == str(len(VINS)),
               15, "the request's row")
    assert request_cells(browser)[2:4] == ["0", str(len(VINS))] and progress_value(browser) == 0

    cars = []
    try:
        for n, vin in enumerate(VINS[:3], start=1):
            car = Vehicle(cluster.port, vin)
            cars.append(car)
            wait_until(lambda: text(browser, "total-connections") == str(n), 15, f"{n} connection(s) on the page")
            car.heartbeat()
            car.next_message(30)  # acknowledged by paho
            wait_until(lambda: request_cells(browser)[2] == str(n), 15, f"{n} delivered on the page")
            assert progress_value(browser) == n
        assert text(browser, "total-delivered") == "3" and text(browser, "total-pending") == "1"
        assert browser.execute_script("return window.__notReloaded === true;")
        # the direct channels: the node served the dispatchers' deliver calls, each shard the node's events
        # calls, and nothing fell back to Ray (the last two columns of the node row, columns 9-10 of a shard row)
        node_cells = table_cells(browser, "nodes")[0]
        assert int(node_cells[9].replace(",", "")) > 0 and node_cells[10] == "0", node_cells
        for shard_cells in table_cells(browser, "shards"):
            assert int(shard_cells[8].replace(",", "")) > 0 and shard_cells[9] == "0", shard_cells

        assert "Every request known to the cluster" in text(browser, "requests-note")
        assert request_cells(browser)[8] == "active"
        browser.find_element(By.CSS_SELECTOR, "#requests tbody tr button").click()  # cancel
        wait_until(lambda: request_cells(browser)[8] == "cancelled", 15, "the cancelled request on the page")
        assert f"request {REQUEST} cancelled" in text(browser, "requests-action")
        # for a poll or two (every second) the outcome stays: no poll answer read before the cancel undoes it
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert request_cells(browser)[8] == "cancelled"
            assert f"request {REQUEST} cancelled" in text(browser, "requests-action")
            time.sleep(0.1)
        # delivered 3, pending 0, VINs 4, in flight 0, expired 0, cancelled 1 (the vehicle never connected)
        assert request_cells(browser)[2:8] == ["3", "0", "4", "0", "0", "1"]
        assert not browser.find_element(By.CSS_SELECTOR, "#requests tbody tr button").is_enabled()
        late = Vehicle(cluster.port, VINS[3])
        cars.append(late)
        late.heartbeat()
        late.no_message(1.5)  # nothing more of the cancelled request is delivered

        target = Path(os.environ.get("FANOUT_CONSOLE_PNG") or tmp_path / "console.png")
        if not target.is_absolute():
            target = REPO / target
        assert browser.save_screenshot(str(target)) and target.stat().st_size > 10_000
    finally:
        for car in cars:
            car.close()
    wait_until(lambda: text(browser, "total-connections") == "0", 15, "the disconnects on the page")

"""The ``/ui`` page in a real headless browser (Debian's ``chromium`` driven by selenium through
``chromedriver``; ``make test`` installs both) against ``freetoken serve --moe-backend hybrid`` on
the embedded tiny model: the page loads without console errors, its numbers change after a chat
sent from the page, and its resize control changes ``GET /v1/freetoken/memory``.

``FREETOKEN_UI_SCREENSHOT=path.png`` also saves a 1200x800 screenshot after five more requests
(the README's ``freetoken/server/ui/screenshot.png``, kept out of the wheel).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.clients.server import ServerProcess, free_port

pytestmark = pytest.mark.slow
PORTS = range(8800, 8850)
WAIT_S = 30.0


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("no chromium / chromedriver on PATH (make test installs them: "
                    "apt-get install chromium chromium-driver)")
    return chromium, driver


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("ui") / "serve.log"
    proc = ServerProcess.start(log, max_output_tokens=16, port=free_port(PORTS),
                               extra_args=("--moe-backend", "hybrid", "--moe-cache-slots", "0.5"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = _browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,800"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()


def _wait(driver, check: Callable[[], object], what: str) -> object:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.2).until(lambda _: check(), what)


def _text(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def _console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_ui_live_numbers_chat_and_resize(server: ServerProcess, browser) -> None:
    http = httpx.Client(base_url=server.base_url, timeout=60)
    slot = http.get("/v1/freetoken/memory").json()["expert_cache"]["slot_bytes"]
    browser.get(f"{server.base_url}/ui")
    _wait(browser, lambda: _text(browser, "status-time") != "never", "a first status poll")
    assert _text(browser, "model") == server.served_model_name
    assert _text(browser, "cache-slots") == "32"
    assert _text(browser, "requests-finished") == "0"
    assert _text(browser, "last-ttft") == "-"

    browser.find_element("id", "chat-input").clear()
    browser.find_element("id", "chat-input").send_keys("hello from the page")
    browser.find_element("id", "chat-send").click()
    _wait(browser, lambda: _text(browser, "chat-meta").startswith("done"), "the streamed reply")
    assert "tokens generated" in _text(browser, "chat-meta")
    _wait(browser, lambda: _text(browser, "requests-finished") == "1", "the request count")
    _wait(browser, lambda: _text(browser, "last-ttft") != "-", "the request's TTFT")
    recent = http.get("/v1/freetoken/status").json()["recent"]
    assert float(_text(browser, "last-ttft")) == pytest.approx(recent[-1]["ttft_s"], rel=0.05)
    assert float(_text(browser, "last-decode")) > 0
    assert browser.find_elements("css selector", "#chart-ttft circle")
    assert _text(browser, "cache-hit-rate").endswith("%")
    # "misses filled" is what the misses did (the layers' counters), not the split's target
    layers = http.get("/v1/freetoken/status").json()["expert_cache"]["layers"]
    misses = sum(layer["misses"] for layer in layers)
    fills = sum(layer["fills"] for layer in layers)
    assert misses > 0
    _wait(browser, lambda: _text(browser, "cache-split") == f"{100 * fills / misses:.1f}%",
          "the measured share of misses filled")
    assert "generic" in _text(browser, "harness-table")

    box = browser.find_element("id", "resize-input")
    box.clear()
    box.send_keys(f"{5 * slot}B")
    browser.find_element("id", "resize-button").click()
    _wait(browser, lambda: "-> 5 slots" in _text(browser, "resize-result"), "the resize answer")
    assert http.get("/v1/freetoken/memory").json()["expert_cache"]["slots"] == 5
    _wait(browser, lambda: _text(browser, "cache-slots") == "5", "the resized cache on the page")

    shot = os.environ.get("FREETOKEN_UI_SCREENSHOT")
    if shot:  # a few more requests (two harnesses) so the charts have lines to show
        for i in range(5):
            body = {"model": "m", "max_tokens": 4 + 3 * i,
                    "messages": [{"role": "user", "content": f"request {i}"}]}
            http.post("/v1/chat/completions", json=body,
                      headers={"X-FreeToken-Harness": "openclaw"} if i % 2 else {})
        _wait(browser, lambda: _text(browser, "requests-finished") == "6", "the extra requests")
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": 1200, "height": 800, "deviceScaleFactor": 1, "mobile": False})
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(shot)
    assert _console_errors(browser) == []
    http.close()


def test_ui_shows_the_load_then_hides_the_resize_control_without_an_expert_cache(
        tmp_path, browser) -> None:
    from tests.server.test_serve_loading import DELAY_S, _start

    proc = _start(tmp_path / "serve.log", delay=DELAY_S)  # resident experts: nothing to resize
    try:
        _wait(browser, lambda: _loaded_page(browser, proc), "the page served while loading")
        _wait(browser, lambda: _text(browser, "health") == "loading", "the loading badge")
        assert "the model is loading" in _text(browser, "error")
        proc._wait_healthy(DELAY_S + 120)
        _wait(browser, lambda: _text(browser, "health") == "healthy", "the loaded engine")
        assert _text(browser, "cache-summary").startswith("no offloaded MoE runtime")
        assert not browser.find_element("id", "resize-form").is_displayed()
        # the only console errors: the browser's own lines for the status polls refused (503)
        # while the model loaded
        assert [e for e in _console_errors(browser) if not (
            e["source"] == "network" and "/v1/freetoken/status" in e["message"]
            and "status of 503" in e["message"])] == []
    finally:
        proc.stop()


def _loaded_page(browser, proc: ServerProcess) -> bool:
    """Open ``/ui`` once the port answers; True when the page came."""
    try:
        httpx.get(f"{proc.base_url}/health", timeout=2)
    except httpx.TransportError:
        return False
    browser.get(f"{proc.base_url}/ui")
    return bool(browser.find_elements("id", "health"))

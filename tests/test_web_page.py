"""The daemon's web page in a real browser (docs/web.md): Debian's chromium
and chromedriver, driven by selenium, load the page from a running daemon
over a simulated fleet. The table shows the rollouts; a pause committed
with ``reconciler pause --commit`` and pushed shows its hold on the open
page without a reload, with the command that lifts it (which the test then
runs); a node's failing check shows its value. Screenshots go to the test's
temporary folder."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.kit.documents import node_yaml, rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.ports import HeldPort
from tests.kit.web import WebDaemon

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT = 30.0  # seconds: a generous deadline for what the page shows; no timing is asserted
BEHAVIOUR = (
    "default: succeed\nnodes:\n"
    "  slow: hang\n"  # a job that never finishes: the rollout stays running
    "  sick: {action: succeed, checks: {ready: failing}}\n"
)
HEALTH = {
    "interval": "1s",
    "failureThreshold": 1,
    "checks": [{"name": "ready", "http": {"url": '"http://127.0.0.1:8000/ready"'}}],
}


# Sweeps every second, and a node unreachable for 2 s is offline.
SETTINGS = (
    "apiVersion: reconciler/v1\nkind: Settings\n"
    "spec:\n  offlineAfter: 2s\n  fleetCheck: {interval: 1s}\n"
)


@pytest.fixture
def kit(tmp_path: Path, held_port: HeldPort) -> Iterator[FleetKit]:
    nodes = {"web-1": {"role": "web"}, "web-2": {"role": "web"}, "slow": {"role": "slow"}}
    kit = FleetKit.create(
        tmp_path,
        {**nodes, "sick": {"role": "sick"}},
        behaviour=BEHAVIOUR,
        files={"reconciler.yaml": SETTINGS},
    )
    kit.push(
        {
            # Nothing listens at gone's agent address: the fleet watch finds it offline.
            "nodes/gone.yaml": node_yaml("gone", f"http://{held_port.address}", {"role": "gone"}),
            "rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=1),
            "rollouts/slow.yaml": rollout_yaml("slow", nodeIds=["slow"]),
            "rollouts/checked.yaml": rollout_yaml(
                "checked", nodeIds=["sick"], live=True, health=HEALTH
            ),
        }
    )
    yield kit
    kit.close()


@pytest.fixture
def served(kit: FleetKit, tmp_path: Path) -> Iterator[WebDaemon]:
    daemon = WebDaemon.start(kit, tmp_path)
    yield daemon
    daemon.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def _wait(browser: webdriver.Chrome, what: str, check: object) -> None:
    WebDriverWait(browser, WAIT, ignored_exceptions=[StaleElementReferenceException]).until(
        check, message=f"the page did not show {what}"
    )


def _row_text(browser: webdriver.Chrome, table: str, key: str, name: str) -> str:
    # Read in the page: rows are replaced whenever an event redraws them.
    text = browser.execute_script(
        "const row = document.querySelector(arguments[0]); return row ? row.innerText : '';",
        f"#{table} tr[data-{key}='{name}']",
    )
    return str(text)


def _texts(browser: webdriver.Chrome, selector: str) -> list[str]:
    # In one script: an event may swap the page between finding and reading.
    texts = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText);", selector
    )
    return [str(t) for t in texts]


def test_the_table_shows_the_rollouts_and_a_committed_pause_shows_its_hold_without_reload(
    kit: FleetKit, served: WebDaemon, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.get(served.url + "/")
    _wait(
        browser,
        "web completed and slow running",
        lambda b: (
            "completed" in _row_text(b, "rollout-table", "rollout", "web")
            and "running" in _row_text(b, "rollout-table", "rollout", "slow")
        ),
    )
    assert browser.find_element(By.TAG_NAME, "h1").text == "reconciler"
    headers = _texts(browser, "#rollout-table th")
    assert headers == [
        "Rollout", "Phase", "Mode", "Progress", "Hold", "Waiting", "Target", "Updated",
    ]  # fmt: skip
    assert "2 of 2 succeeded" in _row_text(browser, "rollout-table", "rollout", "web")
    browser.get_screenshot_as_file(str(tmp_path / "web-view-table.png"))
    browser.execute_script("window.notReloaded = true")

    subprocess.run(
        [sys.executable, "-m", "reconciler", "pause", "slow", "--commit", "--push"],
        check=True,
        capture_output=True,
        cwd=kit.work,
    )

    _wait(
        browser,
        "the operator pause on slow",
        lambda b: "operator_paused" in _row_text(b, "rollout-table", "rollout", "slow"),
    )
    assert browser.execute_script("return window.notReloaded") is True
    _wait(browser, "a link to slow", lambda b: b.find_element(By.LINK_TEXT, "slow").click() or True)
    _wait(browser, "the hold's commands", lambda b: b.find_element(By.ID, "hold").is_displayed())
    commands = _texts(browser, "#hold-actions code")
    assert commands == ["reconciler resume slow --push"]
    browser.get_screenshot_as_file(str(tmp_path / "web-view-hold.png"))
    # Tables have header cells for a screen reader, every one scoped.
    assert browser.execute_script("return document.querySelectorAll('th:not([scope])').length") == 0
    browser.set_window_size(400, 900)
    browser.get_screenshot_as_file(str(tmp_path / "web-view-narrow.png"))
    # At 400 px nothing runs off the side: the rows become labelled blocks.
    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )

    # The command shown is the one that lifts the hold.
    subprocess.run(
        [sys.executable, "-m", *shlex.split(commands[0])],
        check=True,
        capture_output=True,
        cwd=kit.work,
    )
    _wait(
        browser,
        "slow running again",
        lambda b: not b.find_elements(By.ID, "hold"),  # no hold, no hold box
    )


def test_a_node_s_failing_check_shows_its_value(
    served: WebDaemon, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    def failed() -> dict[str, object] | None:
        answer = httpx.get(served.url + "/api/v1/rollouts/checked", timeout=10)
        if answer.status_code != 200:
            return None
        node = answer.json()["nodes"][0]
        return node if node.get("checks") else None

    WebDriverWait(None, WAIT).until(lambda _: failed(), message="no check recorded for sick")
    node = failed()
    assert node is not None
    check = node["checks"][0]  # type: ignore[index]
    assert check["ok"] is False

    browser.get(served.url + "/#rollout=checked")
    _wait(
        browser,
        "the failing check with its value",
        lambda b: check["detail"] in _row_text(b, "node-table", "node", "sick"),
    )
    row = _row_text(browser, "node-table", "node", "sick")
    assert "ready: failed" in row
    assert "unsigned" in row  # the node has no agentKey: its evidence mark says so
    # The batch of the failed node says so in words and is painted red, never blue or green.
    _wait(
        browser,
        "batch 1 failed",
        lambda b: "batch 1: failed" in b.find_element(By.ID, "batches").text,
    )
    colour = browser.execute_script(
        "return getComputedStyle(document.querySelector('#batches li')).backgroundColor"
    )
    assert colour == "rgb(207, 34, 46)"
    browser.get_screenshot_as_file(str(tmp_path / "web-view-check.png"))


def test_the_fleet_s_offline_node_is_listed_with_its_state(
    served: WebDaemon, browser: webdriver.Chrome
) -> None:
    browser.get(served.url + "/")

    _wait(
        browser,
        "gone listed as offline",
        lambda b: "offline" in _row_text(b, "fleet-table", "node", "gone"),
    )
    listed = browser.execute_script(
        "return [...document.querySelectorAll('#fleet-table tbody tr')].map(r => r.dataset.node)"
    )
    assert listed == ["gone"]  # the nodes that are ok are counted, not listed
    assert "offline" in browser.find_element(By.ID, "fleet-counts").text


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A plain headless chromium, no driver: what a person or a cron job runs."""
    return subprocess.run(
        [
            CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update",
            f"--user-data-dir={tmp_path / 'chromium-plain'}", *args,
        ],
        capture_output=True, text=True, timeout=120, check=True, cwd=tmp_path,
    )  # fmt: skip


def test_a_plain_headless_chromium_gets_the_rollouts_in_its_first_paint(
    served: WebDaemon, tmp_path: Path
) -> None:
    """The server renders the page: the HTML as sent already holds the
    rollouts, a plain chromium's DOM has them, and a screenshot of it is a
    real page."""

    def listed() -> bool:
        answer = httpx.get(served.url + "/api/v1/rollouts", timeout=10)
        phases = {r["name"]: r["phase"] for r in answer.json()} if answer.status_code == 200 else {}
        return phases.get("web") == "completed" and phases.get("slow") == "running"

    WebDriverWait(None, WAIT).until(lambda _: listed(), message="web completed, slow running")

    # The HTML as sent, before any script could run, holds the table.
    sent = httpx.get(served.url + "/", timeout=10).text
    assert 'data-rollout="web"' in sent and "2 of 2 succeeded" in sent
    dom = _chromium(tmp_path, "--dump-dom", served.url + "/").stdout
    assert 'data-rollout="web"' in dom and 'data-rollout="slow"' in dom
    assert "2 of 2 succeeded" in dom
    assert "Connecting to the daemon" not in dom

    shot = tmp_path / "first-paint.png"
    _chromium(tmp_path, "--window-size=1280,900", f"--screenshot={shot}", served.url + "/")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

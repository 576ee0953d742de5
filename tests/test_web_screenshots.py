"""Screenshots of the web page as an operator sees it during a model
rollout (docs/web.md): a held rollout, a failed canary with its plot, and
a model rollout in progress. The real server (``WebServer`` and
``Routes``) serves statuses shaped as the engine records them; a plain
headless chromium (no driver) loads each page and screenshots it.

The pictures go to the test's folder, or to ``$SCREENSHOTS_DIR`` when set:
``make screenshots`` sets it to ``docs/`` to regenerate the README's."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.daemon.web_routes import Routes
from reconciler.daemon.web_server import WebServer
from reconciler.text.web_answers import StatusView
from tests.kit.web_statuses import failed_canary, held, model_rollout

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def url() -> Iterator[str]:
    statuses = {s.name: s for s in (held("web"), failed_canary("canary"), model_rollout("llama-3"))}
    server = WebServer(Routes(), "127.0.0.1", 0)
    host, port = server.start()
    try:
        server.publish(StatusView("5" * 40, statuses, None))
        base = f"http://{host}:{port}"
        for _ in range(200):  # publish only queues: wait for the view to be served
            if httpx.get(base + "/api/v1/rollouts", timeout=10).status_code == 200:
                break
        yield base
    finally:
        server.close()


def _shoot(tmp_path: Path, url: str, name: str) -> Path:
    folder = Path(os.environ.get("SCREENSHOTS_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    shot = folder / name
    subprocess.run(
        [
            CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,1700", f"--screenshot={shot}", url,
        ],
        capture_output=True, timeout=120, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert shot.read_bytes()[:8] == PNG
    return shot


def _dom(tmp_path: Path, url: str) -> str:
    return subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", url],
        capture_output=True, timeout=120, check=True, text=True, cwd=tmp_path,
    ).stdout  # fmt: skip


@pytest.mark.parametrize(
    ("rollout", "picture", "shown"),
    [
        ("web", "web-view-held.png", ["operator_paused", "reconciler resume web --push"]),
        (
            "canary",
            "web-view-failed-canary.png",
            ["batch 1: failed", "reconciler rollback canary --nodes gpu-1 --push",
             'class="plot comparison-plot"', "0.412 · n=13"],
        ),
        (
            "llama-3",
            "web-view-model-rollout.png",
            ["batch 3: running", "soaking, judged at", 'class="plot oos-plot"', "drain 8 s"],
        ),
    ],
)  # fmt: skip
def test_a_screenshot_of_each_page_an_operator_watches(
    url: str, tmp_path: Path, rollout: str, picture: str, shown: list[str]
) -> None:
    page = f"{url}/?rollout={rollout}"
    dom = _dom(tmp_path, page)
    for text in shown:
        assert text in dom, text
    _shoot(tmp_path, page, picture)

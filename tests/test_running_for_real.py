"""docs/operating.md's "Running it for real", run as written: from an empty
directory to a live rollout on three agents with their own keys and TLS,
and the daemon, all on loopback.

How the commands are taken from the page (keep the page to it):

- the section is the one headed ``## Running it for real``, up to the next
  ``## `` heading; its steps are a numbered list, 1, 2, 3, ... in order;
- every fenced block whose info string is ``sh`` inside a step is run, in
  the page's order, as one ``bash -euo pipefail`` script (so a ``cd`` or a
  shell function carries over to later steps, as in the reader's shell);
  blocks of any other language are examples, not run;
- the one block whose info string is ``sh env`` chooses the variables every
  later command uses, ``FLEET`` (a directory that does not exist yet) and
  ``PORT1`` to ``PORT3`` (the agents' ports). It is checked to set exactly
  those and is not run: the test sets them itself, to a temporary directory
  and ports free on this machine. Nothing else in the commands is changed.

A port is held until just before the run (the agents bind it themselves);
if an agent finds it taken, the whole run starts again in a new directory
with new ports. Everything the script starts is in its own session,
stopped by its process group id at the end.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.spec.safe_yaml import load_yaml
from tests.kit.ports import HeldPort

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs/operating.md"
SECTION = "## Running it for real"
VARIABLES = ("FLEET", "PORT1", "PORT2", "PORT3")
NODES = ("gpu-1", "gpu-2", "gpu-3")
RUN_TIMEOUT = 300  # seconds for the whole script, which takes about ten
ATTEMPTS = 3

FENCE_OPEN = re.compile(r"^( *)```(\S*)(?: +(\S+))?\s*$")
STEP = re.compile(r"^(\d+)\. ")

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Block:
    step: int
    info: str  # "sh", "sh env", "yaml", ...
    text: str  # dedented to the fence's indentation


def section(page: str) -> list[str]:
    lines = page.splitlines()
    start = lines.index(SECTION)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1 : end]


def blocks(lines: list[str]) -> tuple[list[int], list[Block]]:
    """The step numbers in the order written, and every fenced block with
    the step it is in (0: before the first step)."""
    steps: list[int] = []
    found: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if match := STEP.match(line):
            steps.append(int(match.group(1)))
        opened = FENCE_OPEN.match(line)
        if opened is None:
            i += 1
            continue
        indent = len(opened.group(1))
        info = " ".join(filter(None, (opened.group(2), opened.group(3))))
        body: list[str] = []
        i += 1
        while lines[i].strip() != "```":
            text = lines[i]
            assert not text.strip() or text[:indent] == " " * indent, f"under-indented: {text!r}"
            body.append(text[indent:])
            i += 1
        found.append(Block(steps[-1] if steps else 0, info, "\n".join(body) + "\n"))
        i += 1
    return steps, found


def the_commands() -> tuple[Block, str]:
    """The ``sh env`` block, and the script of every ``sh`` block."""
    steps, found = blocks(section(PAGE.read_text(encoding="utf-8")))
    assert steps == list(range(1, len(steps) + 1)), f"steps numbered {steps}"
    shell = [b for b in found if b.info.split(" ")[0] == "sh"]
    assert shell and all(b.step > 0 for b in shell), "every command belongs to a numbered step"
    env = [b for b in shell if b.info == "sh env"]
    assert len(env) == 1, "one block chooses FLEET and the ports"
    assert {b.info for b in shell} == {"sh", "sh env"}
    script = "".join(b.text for b in shell if b.info == "sh")
    return env[0], script


def test_the_page_follows_the_convention() -> None:
    env, script = the_commands()
    assigned = re.findall(r"\b([A-Z0-9_]+)=", env.text)
    assert tuple(assigned) == VARIABLES
    assert env.step == 1
    for variable in VARIABLES:
        assert f"${variable}" in script or f'"${variable}' in script
    # What the guide must show a new user, in order.
    wanted = [
        "reconciler init",
        "reconciler keys generate",
        "reconciler keys tls",
        "reconciler agent",
        "--allow-live-apply",
        "agentCertSha256",
        "agentKey:",
        "live: true",
        "reconciler run",
        "reconciler status",
    ]
    at = [script.find(w) for w in wanted]
    assert all(a >= 0 for a in at), dict(zip(wanted, at, strict=True))
    for flag in ("--key", "--tls-cert", "--tls-key"):
        assert flag in script


def test_the_steps_run_as_written_to_a_completed_live_rollout(tmp_path: Path) -> None:
    _, script = the_commands()
    for attempt in range(1, ATTEMPTS + 1):
        fleet = tmp_path / f"try{attempt}" / "reconciler-trial"
        fleet.parent.mkdir(parents=True)
        ports = held_then_released(3)
        result = run_script(script, fleet, ports, tmp_path / f"try{attempt}")
        if result.returncode != 0 and port_taken(fleet):
            continue
        break
    logs = "\n".join(
        f"--- {log}\n{log.read_text(errors='replace')[-3000:]}"
        for log in sorted(fleet.glob("**/*.log"))
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{logs}"
    assert re.search(r"^llama-live  completed", result.stdout, re.M), result.stdout[-3000:]
    table = re.findall(r"^(gpu-\d)\s+(\d)\s+(\S+)\s+(\d)\s+(\S+)", result.stdout, re.M)
    assert table == [
        ("gpu-1", "1", "succeeded", "1", "passed"),
        ("gpu-2", "2", "succeeded", "1", "passed"),
        ("gpu-3", "2", "succeeded", "1", "passed"),
    ]
    for node in NODES:
        path = fleet / node / "state" / "runtimes" / "hermes.yaml"
        config = load_yaml(str(path), path.read_bytes())
        assert config == {"provider": "ollama", "model": "llama3.1-8b", "profile": "default"}
    # Over TLS with signed answers: the daemon kept each node's signed evidence.
    status = subprocess.run(
        ["git", "--git-dir", str(fleet / "fleet.git"), "show", "main:status/llama-live.yaml"],
        check=True,
        capture_output=True,
    ).stdout
    record = load_yaml("status/llama-live.yaml", status)
    assert record["phase"] == "completed"
    assert all(n["evidence"]["keyId"].startswith("SHA256:") for n in record["nodes"])


def held_then_released(count: int) -> list[int]:
    """Ports free a moment ago: held together, so they differ, then let go
    for the agents to bind."""
    held = [HeldPort() for _ in range(count)]
    ports = [h.port for h in held]
    for h in held:
        h.close()
    return ports


def port_taken(fleet: Path) -> bool:
    return any(
        "address already in use" in log.read_text(errors="replace").lower()
        for log in fleet.glob("*/agent.log")
    )


def run_script(
    script: str, fleet: Path, ports: list[int], home: Path
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "FLEET": str(fleet),
        **{f"PORT{i}": str(port) for i, port in enumerate(ports, start=1)},
        # The reader's git knows who they are; this one is told.
        "GIT_AUTHOR_NAME": "Rita Reader",
        "GIT_AUTHOR_EMAIL": "rita@example.com",
        "GIT_COMMITTER_NAME": "Rita Reader",
        "GIT_COMMITTER_EMAIL": "rita@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    output = home / "output.txt"
    with output.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=home,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = wait_for(process, fleet)
    finally:
        stop_group(process)
    return subprocess.CompletedProcess(process.args, code, output.read_text(errors="replace"))


def wait_for(process: subprocess.Popen[bytes], fleet: Path) -> int:
    """The script's exit code; -1 when an agent lost its port to someone
    else (it would never answer), or when ``RUN_TIMEOUT`` passed."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            return code
        if port_taken(fleet):
            return -1
        time.sleep(0.5)
    return -1


def stop_group(process: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """Stop every process the script left running (its session's group,
    whose id is the script's pid): SIGTERM, then SIGKILL for what is still
    there after ``grace``. The script itself is reaped on the way, or its
    zombie would keep the group alive."""
    group = process.pid
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        process.poll()
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    process.wait()

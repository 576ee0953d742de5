"""What a real ``reconciler agent`` process loads: once started and after a
live config apply, none of the modules a node does not need for it. Each
one loaded on the way is CPU the agent's first job pays (a fleet pays it
on every node after a reboot wave or an agent upgrade), and the daemon's
side (Git, the text for people, statistics) has no business on a node at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.kit.agents import listened_address
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key

NODE = "node-a"
# The agent's command, writing the modules it loaded to argv[1] as it exits.
AGENT = """
import atexit, sys
def loaded():
    with open(sys.argv[1], "w") as out:
        out.write("\\n".join(sorted(sys.modules)))
atexit.register(loaded)
from reconciler.cli.main import main
raise SystemExit(main(sys.argv[2:]))
"""
# Top-level modules: httpcore is httpx's transport, needed only to send
# warm-up requests, read idle metrics or download artifacts.
NOT_NEEDED = ("httpcore", "scipy", "numpy", "pygit2")
NOT_OURS_ON_A_NODE = (
    "reconciler.daemon",
    "reconciler.text",
    "reconciler.readers",
    "reconciler.attestations",
    "reconciler.git",
)


def test_an_agent_after_a_live_config_apply_has_loaded_no_module_it_did_not_need(
    tmp_path: Path,
) -> None:
    key = make_key(tmp_path / "keys" / "reconciler")
    state = tmp_path / "state"
    (state / "runtimes").mkdir(parents=True)
    (state / "runtimes" / "hermes.yaml").write_text(
        "provider: vllm\nmodel: old\nprofile: default\n"
    )
    modules = tmp_path / "modules.txt"
    command = [
        sys.executable, "-c", AGENT, str(modules),
        "agent", "--node", NODE, "--state-dir", str(state), "--trust-key", str(key.public),
        "--runtime", "hermes", "--allow-live-apply", "--after-apply", "true",
        "--listen", "127.0.0.1:0",
    ]  # fmt: skip
    with open(tmp_path / "agent.log", "wb") as log:
        agent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
    try:
        assert agent.stdout is not None
        address = listened_address(agent.stdout.readline().decode())
        assert address, (tmp_path / "agent.log").read_text()
        base = f"http://{address}/v1/nodes/{NODE}/jobs"
        posted = httpx.post(base, json=envelope(job("apply-1", node=NODE), key.signing))
        assert posted.status_code == 202, posted.text
        done = httpx.get(f"{base}/apply-1?wait=20s", timeout=30).json()
        assert done["state"] == "succeeded", done
    finally:
        agent.terminate()
        assert agent.wait(30) == 0, (tmp_path / "agent.log").read_text()
    loaded = set(modules.read_text().split())
    assert "reconciler.node.job_runner" in loaded  # the list is the agent's
    assert sorted(m for m in loaded if m.split(".")[0] in NOT_NEEDED) == []
    assert sorted(m for m in loaded if m.startswith(NOT_OURS_ON_A_NODE)) == []

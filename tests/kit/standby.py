"""One node with a warm standby, all real: two llama-server slots run by
the shipped slot script (example-repo/deploy/llama-server-slot.sh), a
node-local nginx routing to one of them, Debian's nginx serving the
models to stage, and client load through the router.

    node = SlotNode.create(tmp_path, models, key)
    agent = node.agent()                  # a real Agent with slots, in this process
    node.stage_and_apply(agent, "A", "apply-0001")
    with node.load() as load: ...         # answers through the router
"""

from __future__ import annotations

import os
import shlex
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reconciler.cli.examples import example_dir
from reconciler.cli.llama_runtime import SERVER_ARGS, _serves_port, free_port, stop_process
from reconciler.node.agent_config import SlotCommands
from reconciler.protocol.signing import SigningKey
from reconciler.spec.artifacts import Artifact, Warmup
from reconciler.spec.model import Target
from tests.kit.agents import AgentThread
from tests.kit.jobs import envelope, job
from tests.kit.llama import Models, llama_server_binary, model_artifact, which_model
from tests.kit.nginx import NginxRouter, NginxServer
from tests.kit.waiting import wait_for

SEEDS = {"A": 1, "B": 2}


def labelled_models(models: Models) -> dict[str, Path]:
    """The models a slot node stages, by label: A, B, and one llama.cpp refuses."""
    return {"A": models.model(1), "B": models.model(2), "broken": models.truncated()}


def mirror(folder: Path, labelled: dict[str, Path]) -> Path:
    """``folder`` holding ``LABEL.gguf`` for each model, for a file server."""
    folder.mkdir(parents=True)
    for label, path in labelled.items():
        (folder / f"{label}.gguf").symlink_to(path)
    return folder


def slot_script() -> Path:
    return example_dir() / "deploy" / "llama-server-slot.sh"


def target(label: str) -> Target:
    return Target("hermes", "llama.cpp", f"tiny-llama-{SEEDS.get(label, 9)}", "default")


WARMUP = Warmup(
    url="http://127.0.0.1:{slotPort}/v1/completions",
    method="POST",
    body='{"prompt": "Hello", "max_tokens": 1, "temperature": 0}',
    timeout_seconds=60,
)


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer
    model: str  # the label of the model that answered ("" when none)
    sent: float
    answered: float


@dataclass
class Load:
    """Completions through the router, one after another, until closed, as
    a client that resends a request whose connection nginx closed unread
    (counted in ``resent``)."""

    url: str
    models: dict[str, Path]
    answers: list[Answer] = field(default_factory=list)
    resent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                sent = time.time()
                try:
                    status, label = self._ask(client)
                except (httpx.HTTPError, ValueError):
                    status, label = 0, ""
                self.answers.append(Answer(status, label, sent, time.time()))
                time.sleep(0.01)

    def _ask(self, client: httpx.Client) -> tuple[int, str]:
        body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
        try:
            answer = client.post(f"{self.url}/v1/completions", json=body)
        except httpx.TransportError:
            # A reloading nginx closes the connections it holds and has
            # not read a request from (docs/standby.md): the request never
            # reached a runtime, and clients send it again. A slot that
            # fails reaches the client through nginx as a 502, never so.
            self.resent += 1
            answer = client.post(f"{self.url}/v1/completions", json=body)
        if answer.status_code != 200:
            return answer.status_code, ""
        return 200, which_model(answer.json()["model"], self.models)

    def failed(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]

    def first_from(self, label: str, after: float) -> Answer | None:
        return next((a for a in self.answers if a.sent >= after and a.model == label), None)


@dataclass
class SlotNode:
    """The parts of one node; ``close`` stops them all."""

    tmp: Path
    key: SigningKey
    models: dict[str, Path]
    artifacts: dict[str, Artifact]
    ports: tuple[int, int]
    run_dir: Path
    router: NginxRouter
    files: NginxServer
    owns_files: bool = True  # False: the file server is shared, its owner closes it

    @classmethod
    def create(
        cls, tmp: Path, models: Models, key: SigningKey, files: NginxServer | None = None
    ) -> SlotNode:
        """``files``: a server of ``mirror(...)`` shared by several nodes
        (one nginx less per node); by default the node starts its own."""
        labelled = labelled_models(models)
        tmp.mkdir(parents=True, exist_ok=True)
        owns_files = files is None
        if files is None:
            files = NginxServer(tmp / "files", mirror(tmp / "mirror", labelled))
        ports = (free_port(), free_port())
        try:
            router = NginxRouter(tmp / "router", tmp / "upstream.conf", ports[0])
        except BaseException:
            if owns_files:
                files.close()
            raise
        artifacts = {k: model_artifact(files.url(f"{k}.gguf"), p) for k, p in labelled.items()}
        return cls(tmp, key, labelled, artifacts, ports, tmp / "run", router, files, owns_files)

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    def slot_commands(self, reload: str | None = None) -> SlotCommands:
        settings = {
            "LLAMA_SERVER": str(llama_server_binary()),
            "LLAMA_SERVER_RUN_DIR": str(self.run_dir),
            "LLAMA_SERVER_MODE": "pidfile",
            "LLAMA_SERVER_ARGS": SERVER_ARGS,
            "LLAMA_SERVER_READY_TIMEOUT": "60",
            "NGINX_UPSTREAM_FILE": str(self.router.upstream),
            "NGINX_RELOAD": reload or self.router.reload_command(),
            "NGINX_PID_FILE": str(self.router.root / "nginx.pid"),
        }
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in settings.items())
        script = shlex.quote(str(slot_script()))
        return SlotCommands(
            ports=self.ports,
            start=f"{prefix} bash {script} start",
            route=f"{prefix} bash {script} route",
            stop=f"{prefix} bash {script} stop",
        )

    def agent(self, slots: SlotCommands | None = None) -> AgentThread:
        return AgentThread(
            self.state,
            [self.key],
            slots=slots or self.slot_commands(),
            after_apply_timeout=90,
        )

    def cli_flags(self, start_suffix: str = "") -> list[str]:
        """The same slots as ``reconciler agent`` options."""
        commands = self.slot_commands()
        return [
            "--slot-ports", f"{self.ports[0]},{self.ports[1]}",
            "--slot-start-command", commands.start + start_suffix,
            "--slot-route-command", commands.route,
            "--slot-stop-command", commands.stop,
            "--after-apply-timeout", "90s",
        ]  # fmt: skip

    def stage(self, agent: AgentThread, label: str) -> None:
        send = job(f"stage-{label.lower()}", kind="stage", artifacts=(self.artifacts[label],))
        record = post_and_wait(agent, envelope(send, self.key))
        assert record["state"] == "succeeded", record

    def apply(self, label: str, job_id: str, **changes: Any) -> dict[str, Any]:
        """The signed envelope of a live apply of ``label`` with a standby."""
        fields: dict[str, Any] = {
            "target": target(label),
            "artifacts": (self.artifacts[label],),
            "standby": "untilCompleted",
            "warmup": (WARMUP,),
            **changes,
        }
        return envelope(job(job_id, **fields), self.key)

    def restore(self, backup_id: str, job_id: str = "restore-0001") -> dict[str, Any]:
        send = job(job_id, kind="restore", target=target("B"), backup_id=backup_id)
        return envelope(send, self.key)

    def release(self, job_id: str = "release-0001") -> dict[str, Any]:
        return envelope(job(job_id, kind="release", target=target("B")), self.key)

    def slot_url(self, slot: str) -> str:
        return f"http://127.0.0.1:{self.ports['ab'.index(slot)]}"

    def serving(self, url: str | None = None) -> str:
        """The label of the model answering at ``url`` (the router by default)."""
        url = url or self.router.base_url
        try:
            answer = httpx.post(
                f"{url}/v1/completions",
                json={"prompt": "Hello", "max_tokens": 1, "temperature": 0},
                timeout=60,
            )
        except httpx.TransportError as error:
            # Not resent, unlike the Load's kept-alive connection: this one is
            # opened after the last reload moved traffic, so nothing may cut
            # it. If something does, what nginx saw says which side did.
            seen = self.router.log.read_text(errors="replace").splitlines()[-20:]
            raise AssertionError(
                f"{error!r} from {url}; the router sends to "
                f"{self.router.upstream.read_text().strip()!r}, its log ends:\n" + "\n".join(seen)
            ) from error
        assert answer.status_code == 200, answer.text
        return which_model(answer.json()["model"], self.models)

    def slot_running(self, slot: str) -> bool:
        pid_file = self.run_dir / f"{self.ports['ab'.index(slot)]}.pid"
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            return False
        return _serves_port(pid, self.ports["ab".index(slot)])

    def running_slots(self) -> list[str]:
        """The slots whose server runs, in order."""
        return [slot for slot in "ab" if self.slot_running(slot)]

    def kill_slot(self, slot: str) -> None:
        """SIGKILL the slot's server, as a crash would, and wait until it is gone."""
        pid = int((self.run_dir / f"{self.ports['ab'.index(slot)]}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, what=f"slot {slot} to die")

    @contextmanager
    def load(self) -> Iterator[Load]:
        load = Load(self.router.base_url, self.models)
        thread = threading.Thread(target=load.run, daemon=True)
        thread.start()
        try:
            yield load
        finally:
            load._stop.set()
            thread.join(60)

    def close(self) -> None:
        for port in self.ports:
            pid_file = self.run_dir / f"{port}.pid"
            try:
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if _serves_port(pid, port):
                stop_process(pid)
        self.router.close()
        if self.owns_files:
            self.files.close()


def post_and_wait(agent: AgentThread, body: dict[str, Any]) -> dict[str, Any]:
    """Post a job and wait for its verdict (its record)."""
    status, answer = agent.post(body)
    assert status in (200, 202), answer
    return finished(agent, body["payload"]["jobId"])


def finished(agent: AgentThread, job_id: str) -> dict[str, Any]:
    """The job's record once it succeeded or failed (slots start in seconds)."""

    def verdict() -> dict[str, Any] | None:
        status, record = agent.get(f"jobs/{job_id}")
        return record if status == 200 and record["state"] in ("succeeded", "failed") else None

    result: dict[str, Any] = wait_for(verdict, 180, what=f"job {job_id} to finish")
    return result

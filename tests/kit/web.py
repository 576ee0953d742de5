"""A real daemon process serving ``run --http`` (docs/web.md), and the
answer schemas to check what it says.

    served = WebDaemon.start(kit, tmp_path)        # 127.0.0.1, port chosen by the system
    httpx.get(served.url + "/api/v1/rollouts")
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from referencing import Registry, Resource

from reconciler.spec import schemas
from tests.kit.fleets import RepoKit
from tests.kit.waiting import wait_for

_LISTENING = re.compile(r"serving the read API and the page on (http://\S+?)/")


@dataclass
class WebDaemon:
    process: subprocess.Popen[bytes]
    url: str  # http://HOST:PORT, no trailing slash
    log: Path

    @classmethod
    def start(
        cls, kit: RepoKit, root: Path, *, http: str = "127.0.0.1:0", extra: tuple[str, ...] = ()
    ) -> WebDaemon:
        log = root / f"daemon-{len(list(root.glob('daemon-*.log')))}.log"
        command = [
            sys.executable, "-m", "reconciler", "run",
            "--repo", str(kit.bare), "--key", str(kit.key_path),
            "--interval", "0.2s", "--poll", "1s",
            "--state-dir", str(root / "daemon-state"),
            "--http", http, *extra,
        ]  # fmt: skip
        with open(log, "ab") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)

        def listening() -> str | None:
            if process.poll() is not None:
                raise AssertionError(f"the daemon exited:\n{log.read_text()}")
            found = _LISTENING.search(log.read_text())
            return found.group(1) if found else None

        url = wait_for(listening, timeout=30, what="the daemon's http line")
        return cls(process, url, log)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _registry() -> Registry:
    resources = []
    for path in sorted(schemas.schema_dir().glob("*.schema.json")):
        schema = json.loads(path.read_text())
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


def check_answer(name: str, data: Any) -> None:
    """Raise unless ``data`` matches ``schemas/NAME.schema.json`` (refs to the others resolved)."""
    schema = schemas.load_schema(name)
    jsonschema.Draft202012Validator(schema, registry=_registry()).validate(data)


__all__ = ["WebDaemon", "check_answer"]

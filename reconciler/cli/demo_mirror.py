"""The demos' file server: model files over HTTP on 127.0.0.1, for the
rollouts whose artifacts the agents download and check.

The file stands in for model weights: the same bytes on every run, so the
digest written in ``example-repo/rollouts/phi-serving.yaml`` is the file's.

Must not: listen anywhere but 127.0.0.1, or serve anything outside its folder.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# The example rollout's URL prefix; the demo replaces it with its server's.
EXAMPLE_MIRROR = "http://127.0.0.1:8780"
WEIGHTS_PATH = "phi-3-mini/model.gguf"
_BLOCKS = 32_768  # of 32 bytes: 1 MiB


def demo_weights() -> bytes:
    """1 MiB of bytes that look like nothing, the same on every run."""
    return b"".join(
        hashlib.sha256(b"reconciler demo weights %d" % i).digest() for i in range(_BLOCKS)
    )


class _Handler(SimpleHTTPRequestHandler):
    def __init__(self, *args: Any, counter: _Counter, **kwargs: Any) -> None:
        self.counter = counter
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        super().do_GET()
        self.counter.count(self.path)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the story says what matters


class _Counter:
    """How many GETs the server answered: the story reports it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.gets = 0

    def count(self, path: str) -> None:
        with self._lock:
            self.gets += 1


class Mirror:
    """``folder`` served from a thread once ``start`` is called, with
    ``files`` (relative path: bytes) written into it first."""

    def __init__(self, folder: Path, files: dict[str, bytes]) -> None:
        self.folder = folder
        self.files = files
        self._counter = _Counter()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        for relative, data in self.files.items():
            path = self.folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        handler = functools.partial(_Handler, directory=str(self.folder), counter=self._counter)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        assert self._server is not None, "start the mirror first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def downloads(self) -> int:
        return self._counter.gets

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

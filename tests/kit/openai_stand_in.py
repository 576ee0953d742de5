"""A small OpenAI-compatible stand-in on 127.0.0.1, for the eval faults a
real runtime (llama-server) cannot be made to show on cue: an answer of
HTTP 500, an answer that takes longer than a case allows, a text that is
not JSON where a case expects JSON. (A runtime that dies mid-suite is a
real llama-server, killed.)

``replies`` maps a prompt (or a chat's last message) to a ``Reply``; a
prompt not in it is answered ``default``. ``/metrics`` says nothing runs,
so a drain reaches idle at once. Each request's JSON body is kept in
``asked``, in order.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

METRIC = "vllm:num_requests_running"


@dataclass(frozen=True)
class Reply:
    text: str = ""
    status: int = 200
    delay: float = 0.0
    raw: str | None = None  # a body other than a completion


class OpenAIStandIn:
    def __init__(self, replies: dict[str, Reply], default: Reply = Reply("")) -> None:
        self.replies = replies
        self.default = default
        self.asked: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stand_in._send(self, 200, f"# TYPE {METRIC} gauge\n{METRIC} 0\n")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                stand_in._complete(self, json.loads(self.rfile.read(length) or b"{}"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, text: str) -> None:
        body = text.encode()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Content-Type", "application/json")
        handler.end_headers()
        handler.wfile.write(body)

    def _complete(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        chat = handler.path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body.get("prompt", "")
        with self.lock:
            self.asked.append(body)
        reply = self.replies.get(prompt, self.default)
        time.sleep(reply.delay)
        if reply.raw is not None or reply.status != 200:
            self._send(handler, reply.status, reply.raw or "internal error")
        else:
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": reply.text}}
                if chat
                else {"index": 0, "text": reply.text}
            )
            self._send(handler, 200, json.dumps({"model": "stand-in", "choices": [choice]}))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> OpenAIStandIn:
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(OSError):
            self.close()

"""A plain HTTP client for tests, from the standard library: independent
of the client under test."""

from __future__ import annotations

import http.client
import json
from typing import Any

from reconciler.protocol.signing import canonical_json


def request(
    base: str, method: str, path: str, body: Any = None, timeout: float = 10
) -> tuple[int, Any]:
    """One HTTP request with the standard library; the answer's JSON (or bytes)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = body if isinstance(body, bytes) or body is None else canonical_json(body)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        answer = conn.getresponse()
        raw = answer.read()
        try:
            return answer.status, json.loads(raw)
        except ValueError:
            return answer.status, raw
    finally:
        conn.close()

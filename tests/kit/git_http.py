"""A Git smart-HTTP server on 127.0.0.1 (``git http-backend`` behind a
threaded HTTP server), for the tests of HTTP remotes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.kit.git import git_env


class GitHttpServer:
    """`git http-backend` behind a threaded HTTP server on 127.0.0.1 (port
    chosen by the OS). Repositories under `root` are served at
    ``{url}/NAME.git``; pushes are allowed. With `token` set, every request
    needs HTTP basic auth whose password is the token (401 otherwise).

        with GitHttpServer(tmp_path, token="s3cret") as server:
            url = server.url_for(bare)
    """

    def __init__(self, root: Path, *, token: str | None = None) -> None:
        import http.server
        import threading

        self.root = Path(root)
        self.token = token
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, authorized)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._cgi()

            def do_POST(self) -> None:
                self._cgi()

            def _authorized(self) -> bool:
                import base64

                if outer.token is None:
                    return True
                auth = self.headers.get("Authorization", "")
                if not auth.startswith("Basic "):
                    return False
                _, _, password = base64.b64decode(auth[6:]).decode().partition(":")
                return password == outer.token

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _cgi(self) -> None:
                path, _, query = self.path.partition("?")
                body = self._body() if self.command == "POST" else b""
                ok = self._authorized()
                outer.requests.append((self.command, path, ok))
                if not ok:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                env = git_env()
                env.update(
                    GIT_PROJECT_ROOT=str(outer.root),
                    GIT_HTTP_EXPORT_ALL="1",
                    PATH_INFO=path,
                    QUERY_STRING=query,
                    REQUEST_METHOD=self.command,
                    CONTENT_TYPE=self.headers.get("Content-Type", ""),
                    CONTENT_LENGTH=str(len(body)),
                    REMOTE_USER="tester",
                    REMOTE_ADDR="127.0.0.1",
                )
                if self.headers.get("Content-Encoding"):
                    env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
                if self.headers.get("Git-Protocol"):
                    env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
                proc = subprocess.run(
                    ["git", "http-backend"], input=body, env=env, capture_output=True
                )
                head, _, payload = proc.stdout.partition(b"\r\n\r\n")
                status = 200
                headers = []
                for line in head.decode("latin-1").split("\r\n"):
                    if not line:
                        continue
                    key, _, value = line.partition(":")
                    if key.lower() == "status":
                        status = int(value.strip().split()[0])
                    else:
                        headers.append((key, value.strip()))
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url_for(self, bare: Path) -> str:
        return f"{self.url}/{Path(bare).relative_to(self.root)}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> GitHttpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

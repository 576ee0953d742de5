"""Helpers for tests that need real Git repositories, driven the way a person
drives them: the `git` binary, a clone, edit, commit, push.

Every `git` call runs with a fixed author/committer and without the user's
global or system config, so tests never depend on the machine they run on.

    bare = make_bare_repo(tmp_path, {"nodes/a.yaml": "..."})
    work = clone(bare, tmp_path / "work")
    sha = commit_and_push(work, {"rollouts/r.yaml": "...", "nodes/a.yaml": None}, "edit")
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

AUTHOR_NAME = "Ada Operator"
AUTHOR_EMAIL = "ada@example.com"


def git_env(
    name: str = AUTHOR_NAME, email: str = AUTHOR_EMAIL, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """An environment for `git` that ignores global config and sets the identity."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GIT_") and k not in ("SSH_AUTH_SOCK",)
    }
    env.update(
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=email,
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=email,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
    )
    if extra:
        env.update(extra)
    return env


def git(
    *args: str,
    cwd: Path | str,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    input: str | None = None,
) -> str:
    """Run `git ARGS` in `cwd`; return stdout stripped. Raises with stderr on failure."""
    proc = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=dict(env) if env is not None else git_env(),
        capture_output=True,
        text=True,
        input=input,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"git {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
        )
    return proc.stdout.strip()


def write_files(root: Path, files: Mapping[str, str | bytes | None]) -> None:
    """Write (str or bytes) or delete (None) files below `root`."""
    for rel, content in files.items():
        path = root / rel
        if content is None:
            if path.exists():
                path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def make_bare_repo(
    tmp_path: Path,
    files: Mapping[str, str | bytes] | None = None,
    *,
    branch: str = "main",
    name: str = "fleet.git",
    message: str = "Initial fleet",
) -> Path:
    """A bare repository at tmp_path/NAME whose `branch` holds one commit with
    `files` (a README when none are given). Returns its path."""
    bare = tmp_path / name
    git("init", "--bare", "--quiet", f"--initial-branch={branch}", str(bare), cwd=tmp_path)
    seed = tmp_path / f"{name}.seed"
    git("init", "--quiet", f"--initial-branch={branch}", str(seed), cwd=tmp_path)
    write_files(seed, files if files else {"README.md": "fleet\n"})
    git("add", "-A", cwd=seed)
    git("commit", "--quiet", "-m", message, cwd=seed)
    git("push", "--quiet", str(bare), f"{branch}:{branch}", cwd=seed)
    return bare


def clone(bare: Path | str, dest: Path, *, branch: str = "main") -> Path:
    """A working clone of `bare` at `dest`, on `branch`."""
    git("clone", "--quiet", "--branch", branch, str(bare), str(dest), cwd=Path(dest).parent)
    return dest


def commit(
    work: Path,
    files: Mapping[str, str | bytes | None],
    message: str,
    *,
    env: Mapping[str, str] | None = None,
    allow_empty: bool = False,
) -> str:
    """Write/delete `files` in the clone and commit them; returns the commit id."""
    write_files(work, files)
    git("add", "-A", cwd=work, env=env)
    args = ["commit", "--quiet", "-m", message]
    if allow_empty:
        args.append("--allow-empty")
    git(*args, cwd=work, env=env)
    return head(work)


def commit_and_push(
    work: Path,
    files: Mapping[str, str | bytes | None],
    message: str,
    *,
    branch: str = "main",
    pull: bool = True,
    env: Mapping[str, str] | None = None,
) -> str:
    """As a person does: (pull --rebase,) edit, commit, push. Returns the pushed commit id."""
    if pull:
        git("pull", "--quiet", "--rebase", "origin", branch, cwd=work, env=env)
    sha = commit(work, files, message, env=env)
    git("push", "--quiet", "origin", f"HEAD:{branch}", cwd=work, env=env)
    return sha


def head(work: Path | str, rev: str = "HEAD") -> str:
    """The commit id `rev` resolves to in the repository at `work` (bare or not)."""
    return git("rev-parse", rev, cwd=work)


def show(repo: Path | str, rev: str, path: str) -> str:
    """`git show REV:PATH` as text."""
    return git("show", f"{rev}:{path}", cwd=repo)


def ls_tree(repo: Path | str, rev: str) -> list[str]:
    """Every file path in the tree of `rev`, sorted."""
    out = git("ls-tree", "-r", "--name-only", rev, cwd=repo)
    return sorted(out.splitlines()) if out else []


def log(repo: Path | str, *args: str) -> list[str]:
    """`git log --format=%H ARGS` as a list, newest first."""
    out = git("log", "--format=%H", *args, cwd=repo)
    return out.splitlines() if out else []


# -- a Git smart-HTTP server on 127.0.0.1, for remote-protocol tests ---------


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


def install_hook(bare: Path, name: str, script: str) -> None:
    """Install an executable hook (e.g. pre-receive) into a bare repository."""
    hook = Path(bare) / "hooks" / name
    hook.write_text("#!/bin/sh\n" + script + "\n")
    hook.chmod(0o755)

"""SSH remotes fail closed (docs/cli.md, "SSH remotes"): the
server's host key must match an entry in ``--known-hosts`` for its host and
port, or nothing is read from it or pushed to it. Against a real OpenSSH
server on 127.0.0.1 (``tests/kit/ssh.py``), and an HTTPS server with a
self-signed certificate."""

from __future__ import annotations

import http.server
import io
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.daemon.logs import EventLog
from reconciler.daemon.metrics import Metrics
from reconciler.git.store import SSH_PASSPHRASE_ENV, GitStore
from reconciler.git.watch import BranchWatcher
from reconciler.spec.errors import HostKeyError, KeyFileError, StoreError
from tests.kit.git import clone, commit_and_push, git, git_env, head, make_bare_repo
from tests.kit.keys import fingerprint, make_key
from tests.kit.ssh import SshServer

pytestmark = pytest.mark.sshd


@dataclass
class Forge:
    """A fleet repository served over SSH, and what a client needs to reach it."""

    root: Path
    bare: Path
    client_key: Path
    client_pub: str
    server: SshServer
    known_hosts: Path

    @property
    def url(self) -> str:
        return self.server.url(self.bare)

    def open(self, **kwargs: object) -> GitStore:
        options: dict[str, object] = {
            "cache_dir": self.root / "cache",
            "ssh_key": self.client_key,
            "known_hosts": self.known_hosts,
        }
        options.update(kwargs)
        return GitStore.open(self.url, "main", **options)  # type: ignore[arg-type]

    def impostor(self, files: dict[str, str]) -> tuple[SshServer, Path]:
        """Stop the real server; on its port, another sshd with a host key
        of its own serves a clone of the repository plus one commit."""
        self.server.stop()
        fake = self.root / "impostor.git"
        git("clone", "--bare", "--quiet", str(self.bare), str(fake), cwd=self.root)
        work = clone(fake, self.root / "impostor-work")
        commit_and_push(work, files, "Unreviewed change")
        server = SshServer.start(
            self.root / "sshd-impostor",
            client_pub=self.client_pub,
            port=self.server.held,
            serve=fake,
        )
        return server, fake


@pytest.fixture
def forge(tmp_path: Path) -> Iterator[Forge]:
    made = make_key(tmp_path / "client" / "id_ed25519", comment="daemon")
    client_key, client_pub = made.private, made.line
    bare = make_bare_repo(tmp_path, {"nodes/a.yaml": "a\n", "rollouts/r.yaml": "v1\n"})
    server = SshServer.start(tmp_path / "sshd", client_pub=client_pub)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(server.known_hosts_line() + "\n")
    made = Forge(tmp_path, bare, client_key, client_pub, server, known_hosts)
    try:
        yield made
    finally:
        made.server.close()


def test_a_pinned_host_key_lets_the_store_fetch_and_push(forge: Forge) -> None:
    store = forge.open()
    tip = store.refresh()
    assert tip == head(forge.bare, "main")

    written = store.commit("main", tip, {"status/r.yaml": b"phase: running\n"}, "status")

    assert head(forge.bare, "main") == written


def test_an_unknown_host_is_refused_naming_host_fingerprint_and_file(forge: Forge) -> None:
    other_key = make_key(forge.root / "other_host", comment="other").private
    forge.known_hosts.write_text(
        f"[127.0.0.1]:1 {Path(f'{other_key}.pub').read_text().split(' ', 2)[0]} "
        f"{Path(f'{other_key}.pub').read_text().split()[1]}\n"
    )

    with pytest.raises(HostKeyError) as refused:
        forge.open()

    text = str(refused.value)
    assert f"[127.0.0.1]:{forge.server.port}" in text
    assert fingerprint(forge.server.host_pub) in text
    assert str(forge.known_hosts) in text
    assert "not in" in text
    assert "Accepted publickey" not in forge.server.log()  # refused before logging in


def test_a_missing_known_hosts_file_is_refused(forge: Forge) -> None:
    with pytest.raises(HostKeyError, match="does not exist") as refused:
        forge.open(known_hosts=forge.root / "nowhere" / "known_hosts")
    assert fingerprint(forge.server.host_pub) in str(refused.value)


def test_the_default_known_hosts_is_the_users(
    forge: Forge, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = forge.root / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(HostKeyError, match=str(home / ".ssh" / "known_hosts")):
        forge.open(known_hosts=None)
    (home / ".ssh" / "known_hosts").write_text(forge.server.known_hosts_line() + "\n")
    assert forge.open(known_hosts=None).refresh() == head(forge.bare, "main")


def test_a_changed_host_key_reads_and_pushes_nothing(forge: Forge) -> None:
    store = forge.open()
    read = store.refresh()
    real_tip = head(forge.bare, "main")
    impostor, fake = forge.impostor({"rollouts/evil.yaml": "live: true\n"})
    try:
        fake_tip = head(fake, "main")
        with pytest.raises(HostKeyError) as refused:
            store.refresh()
        assert "HOST KEY DIFFERS" in str(refused.value)
        assert fingerprint(impostor.host_pub) in str(refused.value)
        assert fingerprint(forge.server.host_pub) in str(refused.value)  # the pinned one
        assert store.tip("main") == read  # nothing fetched

        with pytest.raises(HostKeyError):
            store.commit("main", read, {"status/r.yaml": b"phase: running\n"}, "status")
        assert head(fake, "main") == fake_tip  # nothing pushed to the impostor
        assert head(forge.bare, "main") == real_tip
        # The same verdict as OpenSSH's own client with that file.
        ssh = subprocess.run(
            [
                "ssh", "-p", str(impostor.port), "-i", str(forge.client_key),
                "-o", f"UserKnownHostsFile={forge.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                f"{impostor.user}@127.0.0.1", "true",
            ],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert ssh.returncode != 0 and "Host key verification failed" in ssh.stderr
    finally:
        impostor.stop()


def test_a_revoked_key_is_refused_even_when_pinned(forge: Forge) -> None:
    line = forge.server.known_hosts_line()
    kind, blob = line.split()[1:]
    forge.known_hosts.write_text(f"{line}\n@revoked * {kind} {blob}\n")
    with pytest.raises(HostKeyError, match="@revoked"):
        forge.open()


def test_an_impostor_with_a_new_rollout_gets_no_job_sent(forge: Forge) -> None:
    """The attack from issue 24, end to end: the daemon knew the real server;
    an impostor on its address serves a live rollout for every node."""
    from reconciler.daemon.agent_client import AgentClient
    from reconciler.daemon.loop import Daemon
    from reconciler.protocol.signing import load_private_key
    from tests.kit.agents import start_sim_fleet
    from tests.kit.documents import node_yaml, rollout_yaml

    made = make_key(forge.root / "keys" / "reconciler")
    key_path, pub = made.private, made.public
    fleet = start_sim_fleet(forge.root / "sim", ["n1", "n2"], pub)
    try:
        work = clone(forge.bare, forge.root / "work")
        commit_and_push(
            work,
            {f"nodes/{n}.yaml": node_yaml(n, fleet.url, {"role": "serving"}) for n in ("n1", "n2")},
            "Two serving nodes",
        )
        daemon = Daemon(
            forge.open(), AgentClient(load_private_key(key_path)), log=EventLog(stream=sys.stderr)
        )
        try:
            assert daemon.run_pass().jobs_sent == 0
            real_tip = head(forge.bare, "main")
            evil = rollout_yaml("evil", selector={"role": "serving"}, live=True)
            impostor, fake = forge.impostor({"rollouts/evil.yaml": evil})
            try:
                fake_tip = head(fake, "main")
                with pytest.raises(HostKeyError):
                    daemon.run_pass()
                assert fleet.stats()["received"] == {}
                assert head(fake, "main") == fake_tip
                assert head(forge.bare, "main") == real_tip

                # The command line: `run --once` exits 1 and says why.
                done = subprocess.run(
                    [
                        sys.executable, "-m", "reconciler", "run", "--once",
                        "--repo", forge.url, "--key", str(key_path),
                        "--ssh-key", str(forge.client_key),
                        "--known-hosts", str(forge.known_hosts),
                        "--cache-dir", str(forge.root / "cache-cli"),
                    ],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert done.returncode == 1, done.stderr
                assert fingerprint(impostor.host_pub) in done.stderr
                assert str(forge.known_hosts) in done.stderr
                assert fleet.stats()["received"] == {}
                assert head(fake, "main") == fake_tip
            finally:
                impostor.stop()
        finally:
            daemon.client.close()
    finally:
        fleet.stop()


def test_status_takes_the_same_credential_flags(forge: Forge) -> None:
    def status(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "reconciler", "status", "--repo", forge.url, *extra],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "XDG_CACHE_HOME": str(forge.root / "xdg")},
        )

    ok = status("--ssh-key", str(forge.client_key), "--known-hosts", str(forge.known_hosts))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "no rollouts have a status yet\n"
    refused = status("--ssh-key", str(forge.client_key), "--known-hosts", str(forge.root / "empty"))
    assert refused.returncode == 1
    assert fingerprint(forge.server.host_pub) in refused.stderr


# --- credentials ---------------------------------------------------------------


def test_a_missing_key_file_is_named(forge: Forge) -> None:
    missing = forge.root / "no-such-key"
    with pytest.raises(KeyFileError, match=str(missing)):
        forge.open(ssh_key=missing)


def test_a_passphrase_protected_key_needs_the_passphrase(
    forge: Forge, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = forge.root / "locked" / "id_ed25519"
    locked.parent.mkdir()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret phrase", "-f", str(locked)],
        check=True,
    )
    forge.server.stop()
    forge.server = SshServer.start(
        forge.root / "sshd-locked",
        client_pub=Path(f"{locked}.pub").read_text().strip(),
        port=forge.server.held,
        host_key=forge.server.host_key,
    )
    monkeypatch.delenv(SSH_PASSPHRASE_ENV, raising=False)
    with pytest.raises(KeyFileError, match=SSH_PASSPHRASE_ENV) as refused:
        forge.open(ssh_key=locked)
    assert str(locked) in str(refused.value) and "passphrase" in str(refused.value)

    monkeypatch.setenv(SSH_PASSPHRASE_ENV, "s3cret phrase")
    assert forge.open(ssh_key=locked).refresh() == head(forge.bare, "main")


def test_a_key_the_server_does_not_know_is_named(forge: Forge) -> None:
    stranger = make_key(forge.root / "stranger" / "id_ed25519").private
    with pytest.raises(StoreError, match=f"refused the SSH key {stranger}"):
        forge.open(ssh_key=stranger)


GITOLITE = Path("/usr/bin/gitolite")
GITOLITE_SHELL = Path("/usr/share/gitolite3/gitolite-shell")


def test_gitolite_denying_a_push_is_reported_in_its_own_words(tmp_path: Path) -> None:
    """Debian's gitolite3 behind the test sshd, set up as an operator would:
    the daemon may read the fleet and write only the status branch. The
    refusal keeps gitolite's line and points at statusBranch; a status
    branch push goes through."""
    if not (GITOLITE.exists() and GITOLITE_SHELL.exists()):
        reason = "gitolite3 is not installed (apt-get install gitolite3; .ci/run does)"
        if os.environ.get("RECONCILER_REQUIRE_SSHD"):
            pytest.fail(reason)
        pytest.skip(reason)
    home = tmp_path / "gitolite-home"
    home.mkdir()
    made = make_key(tmp_path / "admin", comment="admin")
    admin, admin_pub = made.private, made.line
    made = make_key(tmp_path / "daemon", comment="daemon")
    daemon, daemon_pub = made.private, made.line
    env = {**os.environ, "HOME": str(home)}
    subprocess.run(
        ["gitolite", "setup", "-pk", f"{admin}.pub"], env=env, check=True, capture_output=True
    )
    (home / ".gitolite" / "conf" / "gitolite.conf").write_text(
        "repo gitolite-admin\n    RW+ = admin\n"
        "repo fleet\n    RW+ = admin\n    RW status = daemon\n    R = daemon\n"
    )
    subprocess.run(["gitolite", "setup"], env=env, check=True, capture_output=True)

    def login(user: str, pub: str) -> str:
        return (
            f'command="HOME={home} {GITOLITE_SHELL} {user}",no-port-forwarding,'
            f"no-X11-forwarding,no-agent-forwarding,no-pty {pub}\n"
        )

    server = SshServer.start(
        tmp_path / "sshd",
        client_pub=daemon_pub,
        authorized_keys=login("admin", admin_pub) + login("daemon", daemon_pub),
    )
    try:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(server.known_hosts_line() + "\n")
        url = f"ssh://{server.user}@127.0.0.1:{server.port}/fleet"
        seed = make_bare_repo(tmp_path, {"nodes/a.yaml": "a\n"})
        ssh = f"ssh -i {admin} -o UserKnownHostsFile={known_hosts} -o BatchMode=yes"
        git("push", "--quiet", url, "main", cwd=seed, env={**git_env(), "GIT_SSH_COMMAND": ssh})

        store = GitStore.open(
            url, "main", cache_dir=tmp_path / "cache", ssh_key=daemon, known_hosts=known_hosts
        )
        read = store.refresh()
        with pytest.raises(StoreError) as refused:
            store.commit("main", read, {"status/r.yaml": b"phase: running\n"}, "status")
        text = str(refused.value)
        assert "W refs/heads/main fleet daemon DENIED" in text
        assert "statusBranch" in text
        assert store.tip("main") == read

        store.commit("status", None, {"status/r.yaml": b"phase: running\n"}, "status")
        served = home / "repositories" / "fleet.git"
        assert git("show", "status:status/r.yaml", cwd=served) == "phase: running"
    finally:
        server.close()


# --- polling ---------------------------------------------------------------------


def _upload_packs(repo: Path) -> list[int]:
    """Processes serving `repo` to a client (git-upload-pack)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"upload-pack" in part for part in cmdline[:2]) and str(repo).encode() in b" ".join(
            cmdline
        ):
            found.append(int(entry.name))
    return found


def _wait_for(predicate: object, timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_a_poll_closes_its_connection_before_it_sleeps(forge: Forge) -> None:
    """The session of a poll used to stay open until the next poll, keeping
    a git-upload-pack running on the server all that time."""
    store = forge.open()
    commit_and_push(clone(forge.bare, forge.root / "work"), {"nodes/b.yaml": "b\n"}, "add b")
    with BranchWatcher.for_store(store, poll=60.0) as watcher:
        assert watcher.wait(10.0)  # the first poll saw the new commit
        assert _wait_for(lambda: not _upload_packs(forge.bare), timeout=3.0), (
            f"git-upload-pack still serving: {_upload_packs(forge.bare)}"
        )


def test_failed_polls_are_events_counted_and_recovery_wakes_the_daemon(forge: Forge) -> None:
    store = forge.open()
    stream = io.StringIO()
    metrics = Metrics()
    with BranchWatcher.for_store(
        store, poll=0.2, log=EventLog("json", stream=stream), metrics=metrics
    ) as watcher:
        forge.server.stop()
        assert _wait_for(
            lambda: (metrics.registry.get_sample_value("reconciler_poll_failures_total") or 0) >= 2
        )
        watcher.wait(0)  # drop any hint from before the outage
        forge.server = SshServer.start(
            forge.root / "sshd-back",
            client_pub=forge.client_pub,
            port=forge.server.held,
            host_key=forge.server.host_key,
        )
        assert watcher.wait(10.0), "the first poll that works again is a hint"
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    failed = [e for e in events if e["event"] == "poll_failed"]
    assert failed and all(e["level"] == "warning" and e["time"] for e in failed)
    assert forge.url in failed[0]["message"] and failed[0]["retry_in"]
    assert any(e["event"] == "poll_recovered" for e in events)


# --- HTTPS ---------------------------------------------------------------------


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_an_https_server_with_a_self_signed_certificate_is_refused(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_error(404)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}/fleet.git"
        with pytest.raises(StoreError, match="certificate"):
            GitStore.open(url, "main", cache_dir=tmp_path / "cache")
        assert requests == []  # nothing was asked of it
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("verb", ["run", "status", "backups"])
def test_every_remote_verb_takes_the_credential_flags(verb: str) -> None:
    from reconciler.cli.main import build_parser

    parser = build_parser(verb)
    extra = ["--repo", "ssh://h/r", "--key", "k"] if verb == "run" else ["n"] * (verb == "backups")
    args = parser.parse_args([verb, *extra, "--ssh-key", "id", "--known-hosts", "kh"])
    assert (args.ssh_key, args.known_hosts) == (Path("id"), Path("kh"))

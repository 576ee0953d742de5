"""The agent's artifact store and downloader against real servers: nginx
for Range and rate limits, https with a CA of the test's own, and a small
server for a body that breaks off or bytes that are not the published ones.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.node.artifact_download import Deadline, Downloader, DownloadSettings
from reconciler.node.artifact_store import ArtifactStore, StageFailed
from tests.kit.disks import small_tmpfs
from tests.kit.file_faults import FaultyFileServer
from tests.kit.nginx import NginxServer, make_ca_and_cert
from tests.kit.ports import HeldPort

MiB = 1024 * 1024


def _blob(size: int, seed: bytes = b"weights") -> bytes:
    out = bytearray()
    block = hashlib.sha256(seed).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:size])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(_blob(3 * MiB))
    return folder


@pytest.fixture
def nginx(tmp_path: Path, files: Path) -> Iterator[NginxServer]:
    with NginxServer(tmp_path / "nginx", files) as server:
        yield server


def _download(
    store: ArtifactStore,
    url: str,
    data_sha: str,
    size: int,
    seconds: float = 600,
    **settings: object,
) -> None:
    downloader = Downloader(DownloadSettings(**settings))  # type: ignore[arg-type]
    partial = store.partial(data_sha)
    try:
        downloader.fetch(url, partial, size, Deadline.after(seconds))
        partial.finish(size)
    finally:
        partial.close()
        downloader.close()


def test_a_download_is_held_under_its_digest_after_size_and_sha256_matched(
    tmp_path: Path, files: Path, nginx: NginxServer
) -> None:
    data = (files / "model.gguf").read_bytes()
    store = ArtifactStore(tmp_path / "state")
    assert not store.holds(_sha(data), len(data))

    _download(store, nginx.url("model.gguf"), _sha(data), len(data))

    held = tmp_path / "state" / "artifacts" / "sha256" / _sha(data)
    assert held.read_bytes() == data
    assert store.holds(_sha(data), len(data))
    assert not list(held.parent.glob("*.partial"))


def test_a_body_that_breaks_off_is_resumed_with_range_not_restarted(tmp_path: Path) -> None:
    data = _blob(2 * MiB)
    with FaultyFileServer(data, break_after=MiB) as server:
        _download(ArtifactStore(tmp_path / "state"), server.url, _sha(data), len(data))
    assert server.ranges == [None, f"bytes={MiB}-"]
    assert server.sent == [MiB, MiB]  # the second request brought only the rest


def test_a_server_that_ignores_range_starts_the_file_over_cleanly(tmp_path: Path) -> None:
    data = _blob(2 * MiB)
    store = ArtifactStore(tmp_path / "state")
    (store.folder / (_sha(data) + ".partial")).write_bytes(data[:1000])  # an earlier run's
    with FaultyFileServer(data, ignore_range=True) as server:
        _download(store, server.url, _sha(data), len(data))
    assert server.ranges == ["bytes=1000-"]
    assert store.path(_sha(data)).read_bytes() == data


def test_a_partial_file_left_by_an_earlier_run_is_resumed_from_nginx(
    tmp_path: Path, files: Path, nginx: NginxServer
) -> None:
    data = (files / "model.gguf").read_bytes()
    store = ArtifactStore(tmp_path / "state")
    (store.folder / (_sha(data) + ".partial")).write_bytes(data[: 2 * MiB])

    _download(store, nginx.url("model.gguf"), _sha(data), len(data))

    assert store.path(_sha(data)).read_bytes() == data
    assert nginx.requests(at_least=1) == [f"GET /model.gguf 206 {MiB} bytes={2 * MiB}-"]


def test_wrong_bytes_fail_with_digest_mismatch_and_the_file_is_deleted(tmp_path: Path) -> None:
    published = _blob(MiB)
    served = _blob(MiB, seed=b"something else")
    store = ArtifactStore(tmp_path / "state")
    with FaultyFileServer(served) as server, pytest.raises(StageFailed) as failed:
        _download(store, server.url, _sha(published), len(published))
    assert failed.value.code == "digest_mismatch"
    assert _sha(published) in failed.value.message and _sha(served) in failed.value.message
    assert os.listdir(store.folder) == []


def test_a_file_shorter_than_declared_is_a_digest_mismatch_naming_both_sizes(
    tmp_path: Path, files: Path, nginx: NginxServer
) -> None:
    data = (files / "model.gguf").read_bytes()
    store = ArtifactStore(tmp_path / "state")
    with pytest.raises(StageFailed) as failed:
        _download(store, nginx.url("model.gguf"), _sha(data), len(data) + 10)
    assert failed.value.code == "digest_mismatch"
    assert f"expected {len(data) + 10} bytes" in failed.value.message
    assert f"got {len(data)} bytes" in failed.value.message
    assert os.listdir(store.folder) == []


def test_a_404_is_download_failed_saying_so(tmp_path: Path, nginx: NginxServer) -> None:
    store = ArtifactStore(tmp_path / "state")
    with pytest.raises(StageFailed) as failed:
        _download(store, nginx.url("missing.gguf"), "0" * 64, 10)
    assert failed.value.text().startswith("download_failed: GET ")
    assert "404 Not Found" in failed.value.message


def test_a_refused_connection_is_download_failed_naming_the_server(tmp_path: Path) -> None:
    # Asked again (a mirror restarting) until the deadline, then said.
    with HeldPort() as port, pytest.raises(StageFailed) as failed:
        _download(ArtifactStore(tmp_path / "state"), f"{port.url}/file", "0" * 64, 10, seconds=2)
    assert failed.value.code == "download_failed"
    assert f"cannot connect to {port.address}" in failed.value.message
    assert failed.value.message.endswith("(asked again until the deadline, 2s)")


def test_https_with_an_untrusted_certificate_fails_and_its_ca_file_makes_it_trusted(
    tmp_path: Path, files: Path
) -> None:
    data = (files / "model.gguf").read_bytes()
    ca, cert, key = make_ca_and_cert(tmp_path / "tls")
    store = ArtifactStore(tmp_path / "state")
    with NginxServer(tmp_path / "nginx", files, tls=(cert, key)) as nginx:
        with pytest.raises(StageFailed) as failed:
            _download(store, nginx.url("model.gguf"), _sha(data), len(data))
        assert failed.value.code == "download_failed"
        assert "not trusted" in failed.value.message and "--ca-file" in failed.value.message
        assert nginx.requests() == []  # no request went over the untrusted connection

        _download(store, nginx.url("model.gguf"), _sha(data), len(data), ca_file=str(ca))
    assert store.path(_sha(data)).read_bytes() == data


def test_the_rate_cap_holds_a_download_to_its_bytes_per_second(
    tmp_path: Path, files: Path, nginx: NginxServer
) -> None:
    data = (files / "model.gguf").read_bytes()
    rate = 2 * MiB
    started = time.monotonic()
    _download(
        ArtifactStore(tmp_path / "state"), nginx.url("model.gguf"), _sha(data), len(data), rate=rate
    )
    # A lower bound only: a loaded machine makes it slower, never faster.
    assert time.monotonic() - started >= 0.9 * (len(data) - 64 * 1024) / rate


def test_space_is_checked_before_a_byte_is_fetched(tmp_path: Path, nginx: NginxServer) -> None:
    store = ArtifactStore(tmp_path / "state")
    huge = 1 << 60
    with pytest.raises(StageFailed) as failed:
        store.check_space([{"name": "weights", "sha256": "1" * 64, "size": huge}])
    assert failed.value.code == "insufficient_space"
    assert failed.value.message.startswith(f"needed {huge} bytes, free ")
    assert nginx.requests() == []


def test_space_counts_only_what_is_still_to_fetch(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "state")
    free = os.statvfs(store.folder).f_bavail * os.statvfs(store.folder).f_frsize
    held = _blob(1000)
    (store.folder / _sha(held)).write_bytes(held)
    store.check_space([{"name": "w", "sha256": _sha(held), "size": 1000}])
    (store.folder / ("2" * 64 + ".partial")).write_bytes(b"x" * 1000)
    store.check_space([{"name": "w", "sha256": "2" * 64, "size": 1000 + free // 2}])


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, where this machine lets the test mount one (as root)."""
    with small_tmpfs(tmp_path / "small", "2m") as where:
        yield where


def test_a_disk_that_fills_during_a_download_is_insufficient_space(
    small_disk: Path, files: Path, nginx: NginxServer
) -> None:
    data = (files / "model.gguf").read_bytes()  # 3 MiB: more than the disk holds
    store = ArtifactStore(small_disk)
    with pytest.raises(StageFailed) as failed:
        store.check_space([{"name": "w", "sha256": _sha(data), "size": len(data)}])
    assert failed.value.code == "insufficient_space"
    assert nginx.requests() == []

    # Something else fills the disk after the check: the write fails, said plainly.
    with pytest.raises(StageFailed) as failed:
        _download(store, nginx.url("model.gguf"), _sha(data), len(data))
    assert failed.value.code == "insufficient_space"
    assert not store.holds(_sha(data), len(data))


def test_a_dry_run_asks_nginx_for_the_size_and_fetches_nothing(
    files: Path, nginx: NginxServer
) -> None:
    downloader = Downloader(DownloadSettings())
    try:
        assert downloader.remote_size(nginx.url("model.gguf"), Deadline.after(60)) == 3 * MiB
        with pytest.raises(StageFailed) as failed:
            downloader.remote_size(nginx.url("missing.gguf"), Deadline.after(60))
    finally:
        downloader.close()
    assert failed.value.code == "download_failed"
    assert [line.split()[:3] for line in nginx.requests(at_least=2)] == [
        ["HEAD", "/model.gguf", "200"],
        ["HEAD", "/missing.gguf", "404"],
    ]


def test_a_server_that_compresses_what_it_may_still_sends_the_published_bytes(
    tmp_path: Path, files: Path
) -> None:
    data = (files / "model.gguf").read_bytes()
    with NginxServer(tmp_path / "nginx", files, gzip=True) as nginx:
        _download(ArtifactStore(tmp_path / "state"), nginx.url("model.gguf"), _sha(data), len(data))
        assert nginx.requests(at_least=1)[0].split()[:4] == [
            "GET",
            "/model.gguf",
            "200",
            str(len(data)),
        ]

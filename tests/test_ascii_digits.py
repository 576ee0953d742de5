"""Numbers that people and clients write are ASCII digits only: Python's
``str.isdigit`` and ``\\d`` also accept "²" (which ``int`` refuses, a 500 or
a traceback) and other scripts' digits (which ``int`` reads, so "٨٠" was
port 80). Each place that reads such a number refuses them with its own
message."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.cli.main import main
from reconciler.daemon.web_routes import Routes
from reconciler.git.sshsig import parse_validity_time
from reconciler.node.http_server import parse_listen
from reconciler.protocol.h11_server import Response as Reply
from reconciler.spec.durations import parse_duration
from reconciler.spec.rollout_status import NodeRecord, RolloutStatus
from reconciler.text.web_answers import StatusView
from tests.kit.git import make_bare_repo
from tests.kit.keys import make_key

NOT_ASCII = ["²", "٣", "१०"]  # superscript two, Arabic-Indic three, Devanagari ten


@pytest.mark.parametrize("digits", NOT_ASCII)
def test_a_page_query_in_other_digits_is_400_not_500(digits: str) -> None:
    routes = Routes()
    nodes = tuple(NodeRecord(f"n{i}", 1, "pending") for i in range(12))
    routes.take(StatusView("a" * 40, {"web": RolloutStatus("web", "running", nodes=nodes)}, None))
    query = digits.encode().hex("%", 1).upper()
    assert routes.handle("GET", "/api/v1/rollouts/web?limit=3", {}, "127.0.0.1").status == 200

    for key in ("limit", "offset"):
        reply = routes.handle("GET", f"/api/v1/rollouts/web?{key}=%{query}", {}, "127.0.0.1")
        assert isinstance(reply, Reply)
        assert reply.status == 400 and b"bad_query" in reply.body


@pytest.mark.parametrize("digits", NOT_ASCII)
def test_listen_and_http_addresses_in_other_digits_are_refused(
    digits: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="listen address must be HOST:PORT"):
        parse_listen(f"127.0.0.1:{digits}")
    key = make_key(tmp_path / "reconciler").private
    bare = make_bare_repo(tmp_path, {"README.md": "a fleet\n"})
    argv = ["run", "--once", "--repo", str(bare), "--key", str(key)]
    code = main([*argv, "--http", f"127.0.0.1:{digits}"])
    assert code == 2
    assert "--http must be HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize("digits", NOT_ASCII)
def test_durations_in_other_digits_are_refused(digits: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(f"{digits}s")


def test_a_signer_s_validity_time_in_other_digits_is_refused_as_ssh_keygen_does() -> None:
    assert parse_validity_time("20260101Z").year == 2026
    with pytest.raises(ValueError, match="is not YYYYMMDD"):
        parse_validity_time("٢٠٢٦٠١٠١Z")

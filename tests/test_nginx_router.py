"""The model demo's node-local nginx: found where Debian puts it or where
``$RECONCILER_NGINX`` says, and a demo without it says how to install it
before it starts anything."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from reconciler.cli.demo_models import run_models_demo
from reconciler.cli.nginx_router import find_nginx
from reconciler.spec.errors import ReconcilerError
from tests.kit.llama import llama_server_binary


def test_a_named_nginx_that_is_not_there_is_not_found(tmp_path: Path) -> None:
    assert find_nginx({"RECONCILER_NGINX": str(tmp_path / "nginx")}) is None


def test_the_model_demo_without_nginx_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llama_server_binary()  # the demo looks for llama-server first
    monkeypatch.setenv("RECONCILER_NGINX", str(tmp_path / "no-nginx"))

    with pytest.raises(ReconcilerError) as raised:
        run_models_demo(tmp_path / "demo", io.StringIO())

    assert "nginx not found" in raised.value.message
    assert "apt-get install nginx" in raised.value.hint
    assert not (tmp_path / "demo").exists()  # nothing was started

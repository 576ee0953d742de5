"""Fixtures shared by every test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit.git import OPERATOR, git_env
from tests.kit.llama import Models
from tests.kit.ports import HeldPort

IDENTITY_VARIABLES = (
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_NOSYSTEM",
)


@pytest.fixture
def held_port() -> Iterator[HeldPort]:
    """A loopback port held for the test: nothing listens on it (connections
    are refused) and nobody else can take it."""
    with HeldPort() as held:
        yield held


@pytest.fixture
def identity(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The operator at the terminal (``OPERATOR``) for git calls made in
    this process, with no global or system config; yields that environment
    for subprocesses."""
    env = git_env(*OPERATOR)
    for key in IDENTITY_VARIABLES:
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("NO_COLOR", raising=False)
    yield env


@pytest.fixture(autouse=True)
def daemon_state_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every daemon a test starts (in this process or as a child that takes
    this environment) keeps its state directory under the test's own
    folder, never in the home directory, and two tests never share one."""
    home = tmp_path_factory.mktemp("state-home")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    """Seeded GGUF models (tests/kit/llama.py), each written once per session."""
    return Models(tmp_path_factory.mktemp("gguf"))

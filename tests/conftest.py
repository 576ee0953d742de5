"""Fixtures shared by every test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kit.ports import HeldPort


@pytest.fixture
def held_port() -> Iterator[HeldPort]:
    """A loopback port held for the test: nothing listens on it (connections
    are refused) and nobody else can take it."""
    with HeldPort() as held:
        yield held

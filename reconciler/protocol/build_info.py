"""The running version, as the daemon's and the agents' ``reconciler_build_info``
metric says it: the version of the installed distribution.

The distribution is ``fleet-rollout-reconciler`` (``reconciler`` on PyPI is
someone else's); the import package and the command keep the short name.

Must not: guess a version; a source tree never installed says ``unknown``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "fleet-rollout-reconciler"
BUILD_INFO = "reconciler_build_info"  # the metric's name, on both sides


def build_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"

"""The running version, as the daemon's and the agents' ``reconciler_build_info``
metric says it: ``reconciler.__version__``, the one place the version is
written (the distribution, ``fleet-rollout-reconciler``, reads it from there).

Must not: ask the installed distribution's metadata, which an editable
install leaves at whatever version it was installed with.
"""

from __future__ import annotations

from reconciler import __version__

BUILD_INFO = "reconciler_build_info"  # the metric's name, on both sides


def build_version() -> str:
    return __version__

"""``--push`` for the intent verbs: bring the working clone up to date,
commit the one-file edit, push it, and when someone pushed first (the
daemon commits status all the time) replay the commit on the new tip and
push again, a bounded number of times.

The replay cannot conflict with the daemon: the edit touches only
``rollouts/NAME.yaml``, which the daemon never writes (it writes
``status/``). Two people editing the same rollout file at once can
conflict; then the replay stops, the tree is left as before the replay, and
the error says so.

Uses the ``git`` binary in the person's clone, with their identity and
remotes; ``--ssh-key``/``--known-hosts`` reach it through
``GIT_SSH_COMMAND``. Must not: edit files, or push anything but the
person's own commit.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from reconciler.git.git_binary import run_git
from reconciler.spec.errors import ReconcilerError

PUSH_TRIES = 8
# Seconds before the first replay; doubled each time, with jitter so two
# people racing do not retry in step.
FIRST_BACKOFF = 0.2


@dataclass(frozen=True)
class Upstream:
    """Where the current branch pushes: ``origin`` and ``main``."""

    remote: str
    branch: str
    env: dict[str, str]

    @property
    def tracking(self) -> str:
        return f"refs/remotes/{self.remote}/{self.branch}"


def upstream(root: Path, ssh_key: Path | None = None, known_hosts: Path | None = None) -> Upstream:
    """The remote branch the current branch tracks, or an error saying how to set one."""
    branch = run_git(root, "symbolic-ref", "--quiet", "--short", "HEAD").strip()
    try:
        remote = run_git(root, "config", f"branch.{branch}.remote").strip()
        merge = run_git(root, "config", f"branch.{branch}.merge").strip()
    except ReconcilerError:
        raise ReconcilerError(
            f"--push: branch {branch!r} tracks no remote branch",
            hint=f"set one (git branch --set-upstream-to=origin/{branch}), or use --commit "
            "and push by hand",
        ) from None
    return Upstream(remote, merge.removeprefix("refs/heads/"), _ssh_env(ssh_key, known_hosts))


def _ssh_env(ssh_key: Path | None, known_hosts: Path | None) -> dict[str, str]:
    if ssh_key is None and os.environ.get("RECONCILER_SSH_KEY"):
        ssh_key = Path(os.environ["RECONCILER_SSH_KEY"])
    key = ssh_key
    if key is None and known_hosts is None:
        return dict(os.environ)
    command = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    if key is not None:
        command += ["-i", str(key), "-o", "IdentitiesOnly=yes"]
    if known_hosts is not None:
        command += ["-o", f"UserKnownHostsFile={known_hosts}"]
    return {**os.environ, "GIT_SSH_COMMAND": shlex.join(command)}


def catch_up(root: Path, up: Upstream) -> None:
    """Fetch, and replay the local branch onto the remote one, so the edit is
    made against the newest status. Refuses when the branch has commits of
    the person's own that are not pushed: ``--push`` would push them too."""
    run_git(root, "fetch", "--quiet", up.remote, up.branch, env=up.env)
    ahead = run_git(root, "rev-list", "--count", f"{up.tracking}..HEAD").strip()
    if ahead != "0":
        raise ReconcilerError(
            f"--push: your branch has {ahead} commit(s) not on {up.remote}/{up.branch}; "
            "--push would push them too",
            hint="push them first, or use --commit and push by hand",
        )
    _pull(root, up)


def push(root: Path, up: Upstream, relpath: str) -> int:
    """Push HEAD to the upstream branch; when the push is refused because
    the branch moved, fetch, replay the commit and try again, up to
    ``PUSH_TRIES`` times. Returns how many tries it took."""
    delay = FIRST_BACKOFF
    for attempt in range(1, PUSH_TRIES + 1):
        try:
            run_git(root, "push", "--quiet", up.remote, f"HEAD:refs/heads/{up.branch}", env=up.env)
            return attempt
        except ReconcilerError as error:
            if not _moved(str(error)) or attempt == PUSH_TRIES:
                raise ReconcilerError(
                    f"--push: {error.message}",
                    hint="your commit is kept in your clone (git log -1); run git push "
                    "when the cause is fixed",
                ) from None
        time.sleep(delay * (1 + random.random()))
        delay *= 2
        _pull(root, up, relpath)
    raise AssertionError("unreachable")


def _moved(detail: str) -> bool:
    """A push refused because the remote branch moved: not fast-forward, or
    another push took the ref's lock first. Not a hook's or a permission's
    refusal, where trying again cannot help."""
    return any(
        sign in detail
        for sign in ("non-fast-forward", "fetch first", "stale info", "cannot lock ref")
    )


def _pull(root: Path, up: Upstream, relpath: str = "") -> None:
    """Fetch and replay the local commit on the new tip: one ``git pull
    --rebase``, so the time between reading the tip and pushing stays short."""
    try:
        run_git(
            root, "pull", "--quiet", "--rebase", "--autostash", up.remote, up.branch, env=up.env
        )
    except ReconcilerError as error:
        run_git_quietly(root, "rebase", "--abort")
        what = (
            f"{relpath} was changed on {up.remote}/{up.branch} meanwhile"
            if relpath
            else (f"your clone cannot be replayed onto {up.remote}/{up.branch}")
        )
        raise ReconcilerError(
            f"--push: {what}: {error.message}",
            hint="look at git log for what changed, then run the command again",
        ) from None


def run_git_quietly(root: Path, *args: str) -> None:
    with contextlib.suppress(ReconcilerError):
        run_git(root, *args)

"""``reconciler init DIR [--bare]``: a new fleet repository seeded from the
examples shipped with reconciler.

By default ``DIR/fleet.git`` (a bare origin: what the daemon watches, as a
forge would hold it) and ``DIR/fleet`` (a working clone for people), with
the first commit pushed. With ``--bare``, ``DIR`` itself becomes a bare
repository holding that first commit.

Uses the ``git`` binary so the first commit carries the person's own
identity and the result is exactly what ``git init`` and ``git clone``
would make.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from reconciler.errors import ReconcilerError
from reconciler.gitcli import run_git

HELP = "create a new fleet repository seeded from the examples"

_HERE = Path(__file__).resolve().parent.parent
# Installed wheel: force-included as reconciler/example-repo. Editable
# install or a source checkout: the repository's top-level example-repo/.
_CANDIDATE_DIRS = (_HERE / "example-repo", _HERE.parent / "example-repo")
# Never seeded: placeholders and what only the daemon writes.
_SKIPPED = {".keep", "status", "__pycache__", ".git"}
BRANCH = "main"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", type=Path, help="where to create it")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="make DIR a bare repository only (no working clone)",
    )


def example_dir() -> Path:
    """The example fleet repository shipped with reconciler."""
    for directory in _CANDIDATE_DIRS:
        if (directory / "rollouts").is_dir() or (directory / "nodes").is_dir():
            return directory
    raise ReconcilerError(
        "reconciler's example repository is missing: looked in "
        + ", ".join(map(str, _CANDIDATE_DIRS)),
        hint="reinstall reconciler",
    )


def run(args: argparse.Namespace) -> int:
    target: Path = args.dir.resolve()
    seed = example_dir()
    if args.bare:
        _refuse_existing(target)
        with _undone_on_failure([target]):
            commit = _make_bare(target, seed)
        print(f"created {target}  (bare repository, branch {BRANCH}, first commit {commit[:12]})")
        print()
        print("next:")
        print(f"  git clone {target} fleet && cd fleet")
        print("  reconciler validate .")
        print("  reconciler keys generate --out ~/.config/reconciler")
        print(f"  reconciler run --repo {target} --key ~/.config/reconciler/reconciler")
        return 0
    origin, clone = target / "fleet.git", target / "fleet"
    _refuse_existing(origin)
    _refuse_existing(clone)
    # DIR itself may hold other things: it is removed only if init made it.
    made = [origin, clone] if target.exists() else [target, origin, clone]
    with _undone_on_failure(made):
        commit = _make_origin_and_clone(origin, clone, seed)
    print(f"created {origin}  (bare origin: the daemon watches this one)")
    print(f"created {clone}  (working clone, branch {BRANCH}, first commit {commit[:12]} pushed)")
    print()
    print("next:")
    print(f"  cd {clone}")
    print("  reconciler validate .                  # check every document")
    print(f"  reconciler keys generate --out {target / 'keys'}")
    print(f"  reconciler run --repo {origin} --key {target / 'keys' / 'reconciler'} --once")
    print(f"  reconciler status --repo {origin}")
    print("  # then edit rollouts/, commit, push; pause/resume/abort with `reconciler pause NAME`")
    return 0


@contextlib.contextmanager
def _undone_on_failure(paths: list[Path]) -> Iterator[None]:
    """A failed init (no git identity, say) removes what it made, so that
    running it again after the fix works: ``_refuse_existing`` made sure
    each path was absent or an empty directory, which is what is left."""
    existed = {path: path.exists() for path in paths}
    try:
        yield
    except BaseException:
        for path in reversed(paths):
            if not path.exists():
                continue
            if existed[path]:
                for entry in path.iterdir():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
            else:
                shutil.rmtree(path, ignore_errors=True)
        raise


def _refuse_existing(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ReconcilerError(
            f"{path} already exists and is not empty",
            hint="choose a new directory; init never overwrites anything",
        )


def _make_origin_and_clone(origin: Path, clone: Path, seed: Path) -> str:
    origin.parent.mkdir(parents=True, exist_ok=True)
    run_git(origin.parent, "init", "--quiet", "--bare", "-b", BRANCH, str(origin))
    run_git(origin.parent, "clone", "--quiet", str(origin), str(clone))
    return _seed_and_push(clone, seed)


def _make_bare(target: Path, seed: Path) -> str:
    target.mkdir(parents=True, exist_ok=True)
    run_git(target, "init", "--quiet", "--bare", "-b", BRANCH, str(target))
    with tempfile.TemporaryDirectory(prefix="reconciler-init-") as scratch:
        clone = Path(scratch) / "fleet"
        run_git(Path(scratch), "clone", "--quiet", str(target), str(clone))
        return _seed_and_push(clone, seed)


def _seed_and_push(clone: Path, seed: Path) -> str:
    # An empty clone may not know the branch name yet.
    run_git(clone, "symbolic-ref", "HEAD", f"refs/heads/{BRANCH}")
    _copy_seed(seed, clone)
    run_git(clone, "add", "-A")
    run_git(
        clone,
        "commit",
        "--quiet",
        "-m",
        "Fleet repository seeded by reconciler init\n\n"
        "Example nodes and rollouts to start from; the daemon writes status/.\n",
    )
    run_git(clone, "push", "--quiet", "-u", "origin", BRANCH)
    return run_git(clone, "rev-parse", "HEAD").strip()


def _copy_seed(seed: Path, dest: Path) -> None:
    for entry in sorted(seed.iterdir()):
        if entry.name in _SKIPPED:
            continue
        if entry.is_dir():
            shutil.copytree(
                entry, dest / entry.name, ignore=shutil.ignore_patterns(*_SKIPPED, "*.pyc")
            )
        else:
            shutil.copy2(entry, dest / entry.name)

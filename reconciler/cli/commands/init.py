"""``reconciler init DIR [--bare] [--examples]``: a new fleet repository.

It seeds the settings file and one node to copy, nothing that starts a
rollout: running the daemon on a fresh repository sends no job. With
``--examples`` it seeds the shipped example nodes, rollouts and ``deploy/``
files instead, every rollout turned into a dry-run, so following the
printed next steps changes nothing on any node.

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
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from reconciler.cli.examples import example_dir
from reconciler.git.git_binary import run_git
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import NODES_DIR, ROLLOUTS_DIR, SETTINGS_PATH, STATUS_DIR

HELP = "create a new fleet repository with settings and a node to copy (or the examples)"

# Never seeded: placeholders and what only the daemon writes.
_SKIPPED = {".keep", STATUS_DIR, "__pycache__", ".git"}
BRANCH = "main"

NODE_TEMPLATE_NAME = "node-1"
NODE_TEMPLATE = """\
# One file per node: copy this one as nodes/NAME.yaml (NAME = metadata.name).
# A node alone starts nothing; a rollout in rollouts/ selects nodes by label.
apiVersion: reconciler/v1
kind: Node
metadata:
  name: node-1
spec:
  # Base URL of the node's agent (reconciler agent --listen ...).
  agent: http://127.0.0.1:8710
  labels:
    role: canary
  # The agent's public key (reconciler keys generate --name agent), so the
  # daemon believes only answers signed by it:
  # agentKey: ssh-ed25519 AAAA... agent
  maintenance: false
"""

# ``live: true`` in a seeded example rollout, with what follows on its line.
_LIVE = re.compile(r"^(\s*)live:\s*true\b.*$", re.MULTILINE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", type=Path, help="where to create it")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="make DIR a bare repository only (no working clone)",
    )
    parser.add_argument(
        "--examples",
        action="store_true",
        help="seed the example nodes, rollouts (all dry-run) and deploy/ files instead",
    )


def run(args: argparse.Namespace) -> int:
    target: Path = args.dir.resolve()
    seed = example_dir()
    if args.bare:
        _refuse_existing(target)
        with _undone_on_failure([target]):
            commit = _make_bare(target, seed, args.examples)
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
        commit = _make_origin_and_clone(origin, clone, seed, args.examples)
    print(f"created {origin}  (bare origin: the daemon watches this one)")
    print(f"created {clone}  (working clone, branch {BRANCH}, first commit {commit[:12]} pushed)")
    print()
    print("next:")
    print(f"  cd {clone}")
    print("  reconciler validate .                  # check every document")
    if not args.examples:
        print(f"  cp {NODES_DIR}/{NODE_TEMPLATE_NAME}.yaml {NODES_DIR}/NAME.yaml   # one per node")
        print(f"  # then write {ROLLOUTS_DIR}/NAME.yaml; `reconciler init --examples` shows some")
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


def _make_origin_and_clone(origin: Path, clone: Path, seed: Path, examples: bool) -> str:
    origin.parent.mkdir(parents=True, exist_ok=True)
    run_git(origin.parent, "init", "--quiet", "--bare", "-b", BRANCH, str(origin))
    run_git(origin.parent, "clone", "--quiet", str(origin), str(clone))
    return _seed_and_push(clone, seed, examples)


def _make_bare(target: Path, seed: Path, examples: bool) -> str:
    target.mkdir(parents=True, exist_ok=True)
    run_git(target, "init", "--quiet", "--bare", "-b", BRANCH, str(target))
    with tempfile.TemporaryDirectory(prefix="reconciler-init-") as scratch:
        clone = Path(scratch) / "fleet"
        run_git(Path(scratch), "clone", "--quiet", str(target), str(clone))
        return _seed_and_push(clone, seed, examples)


def _seed_and_push(clone: Path, seed: Path, examples: bool) -> str:
    # An empty clone may not know the branch name yet.
    run_git(clone, "symbolic-ref", "HEAD", f"refs/heads/{BRANCH}")
    if examples:
        _copy_seed(seed, clone)
        _dry_run_rollouts(clone)
        what = "Example nodes and dry-run rollouts to start from"
    else:
        shutil.copy2(seed / SETTINGS_PATH, clone / SETTINGS_PATH)
        (clone / NODES_DIR).mkdir()
        (clone / NODES_DIR / f"{NODE_TEMPLATE_NAME}.yaml").write_text(NODE_TEMPLATE)
        what = "Settings and a node to copy; no rollout yet"
    run_git(clone, "add", "-A")
    run_git(
        clone,
        "commit",
        "--quiet",
        "-m",
        f"Fleet repository seeded by reconciler init\n\n{what}; the daemon writes status/.\n",
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


def _dry_run_rollouts(clone: Path) -> None:
    """Seeded examples apply nothing until a person sets ``live: true``."""
    for path in sorted((clone / ROLLOUTS_DIR).glob("*.yaml")):
        text = path.read_text()
        dry = _LIVE.sub(r"\1live: false   # seeded as a dry-run: set true to apply for real", text)
        if dry != text:
            path.write_text(dry)

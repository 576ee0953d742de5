"""Every path of a fleet repository that reconciler reads or writes,
defined once (docs/configuration.md). Pure."""

from __future__ import annotations

import re

# A document's name, and so its file's stem: what a status file may be called.
NAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")

SETTINGS_PATH = "reconciler.yaml"
NODES_DIR = "nodes"
ROLLOUTS_DIR = "rollouts"
EVALS_DIR = "evals"
STATUS_DIR = "status"
DASHBOARD_PATH = f"{STATUS_DIR}/README.md"
# The fleet watch's record (docs/operating.md). Its stem is reserved: no
# rollout may be called ``fleet``, or its status would be this file.
FLEET_STATUS_NAME = "fleet"
FLEET_STATUS_PATH = f"{STATUS_DIR}/{FLEET_STATUS_NAME}.yaml"
FLEET_PAGES_DIR = f"{STATUS_DIR}/{FLEET_STATUS_NAME}"


def fleet_page_path(page: int) -> str:
    """``status/fleet/nodes-0001.yaml``: the fleet's node pages, 1-based."""
    return f"{FLEET_PAGES_DIR}/nodes-{page:04d}.yaml"


# What an operator writes (the spec), as the daemon reads it: three folders
# of documents and one settings file.
SPEC_FOLDERS = (ROLLOUTS_DIR, NODES_DIR, EVALS_DIR)
SPEC_FILES = (SETTINGS_PATH,)
SPEC_PATHS = (*SPEC_FOLDERS, *SPEC_FILES)


def is_spec_path(path: str) -> bool:
    """Is ``path`` a file the daemon reads as the spec: directly in one of
    ``SPEC_FOLDERS`` (not deeper), or one of ``SPEC_FILES``?"""
    if path in SPEC_FILES:
        return True
    folder, sep, rest = path.partition("/")
    return bool(sep) and folder in SPEC_FOLDERS and bool(rest) and "/" not in rest


def node_path(name: str) -> str:
    """``nodes/NAME.yaml``."""
    return f"{NODES_DIR}/{name}.yaml"


def rollout_path(name: str) -> str:
    """``rollouts/NAME.yaml``."""
    return f"{ROLLOUTS_DIR}/{name}.yaml"


def eval_suite_path(name: str) -> str:
    """``evals/NAME.yaml``."""
    return f"{EVALS_DIR}/{name}.yaml"


def status_path(name: str) -> str:
    """``status/NAME.yaml``: a rollout's status, its main file."""
    return f"{STATUS_DIR}/{name}.yaml"


def status_pages_dir(name: str) -> str:
    """``status/NAME``: the folder of a large rollout's node pages."""
    return f"{STATUS_DIR}/{name}"


def status_page_path(name: str, page: int) -> str:
    """``status/NAME/nodes-0001.yaml``: page numbers are 1-based."""
    return f"{STATUS_DIR}/{name}/nodes-{page:04d}.yaml"


def name_in(folder: str, path: str) -> str | None:
    """NAME of ``FOLDER/NAME.yaml``; None for any other path (another
    folder or suffix, a deeper file, or a stem that is not a valid name,
    such as ``rollouts/x.yml`` or ``rollouts/README.md``)."""
    prefix = folder + "/"
    if not path.startswith(prefix) or not path.endswith(".yaml"):
        return None
    name = path[len(prefix) : -len(".yaml")]
    return name if NAME_RE.fullmatch(name) else None


def is_readable_path(path: str) -> bool:
    """Whether ``path`` is valid UTF-8: Git allows any bytes in a name, and
    such a name comes back from the tree with its bytes escaped as lone
    surrogates, which no file written from it could encode."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return False
    return True


def shown_path(path: str) -> str:
    """``path`` as text that can be written anywhere: bytes that are not
    UTF-8 shown as ``\\xff``."""
    if is_readable_path(path):
        return path
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")

"""Cost of a note full of junk signatures on a required-approvals commit:
counted once per note blob, then free on every later pass.

    .venv/bin/python bench/junk_note.py [--signatures 834] [--passes 5]

Builds a repository with one SSH-signed spec commit whose approval note
holds ``--signatures`` armored blocks that are not valid signatures (about
256 KiB at the default), then, for each of ``--passes`` daemon-like passes
(a new status-only commit on top each time), times ``Approver.approve`` of
the new tip plus the ``approvedBy`` records the reader asks for.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pygit2

from reconciler.daemon.status_trust import approved_by_records
from reconciler.git.approval import Approver, load_allowed_signers

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
JUNK = (
    "-----BEGIN SSH SIGNATURE-----\n"
    + "U1NIU0lHAAAAAQAAADMAAAALc3NoLWVkMjU1MTkAAAAg"
    + "A" * 26
    + "\n" * 1
    + ("QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB\n" * 3)
    + "-----END SSH SIGNATURE-----\n"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--signatures", type=int, default=834)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        work = base / "fleet"
        (work / "rollouts").mkdir(parents=True)

        def git(*more: str) -> str:
            done = subprocess.run(
                ["git", *more], cwd=work, env=ENV, capture_output=True, text=True, check=True
            )
            return done.stdout.strip()

        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / "k")],
                       check=True)  # fmt: skip
        (base / "signers").write_text("ada@example.com " + (base / "k.pub").read_text())
        git("init", "-q", "-b", "main")
        (work / "rollouts" / "r.yaml").write_text("n: 1\n")
        git("add", "-A")
        git("-c", "gpg.format=ssh", "-c", f"user.signingKey={base / 'k'}", "commit", "-qS",
            "-m", "change")  # fmt: skip
        commit = git("rev-parse", "HEAD")
        note = base / "note"
        note.write_text(JUNK * args.signatures)
        git("notes", "--ref", "refs/notes/reconciler-approvals", "add", "-F", str(note), commit)
        repo = pygit2.Repository(str(work))
        approver = Approver(repo, load_allowed_signers(base / "signers"), required_approvals=1)
        print(f"note: {note.stat().st_size // 1024} KiB, {args.signatures} junk signatures")
        print(f"{'pass':>4} {'ms':>8}")
        for index in range(args.passes):
            (work / f"status-{index}").write_text("s\n")
            git("add", "-A")
            git("commit", "-q", "-m", "status")
            tip = git("rev-parse", "HEAD")
            started = time.perf_counter()
            approver.approve(tip)
            approved_by_records(approver, commit)
            print(f"{index + 1:>4} {(time.perf_counter() - started) * 1000:8.2f}")


if __name__ == "__main__":
    main()

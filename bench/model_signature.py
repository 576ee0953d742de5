"""What checking a model signature adds to a stage, against the download's
own hashing, for one large artifact.

    .venv/bin/python bench/model_signature.py                 # 1 GiB, 3 runs each
    .venv/bin/python bench/model_signature.py --size-mib 256  # quicker

A file of SIZE written once (every byte, not sparse) under /tmp, a
directory holding it as a hard link (as the agent lays out a model), and a
signature over that directory made with the reference library and an EC
P-256 key from openssl. Rows, each the median over the runs with the file
in the page cache (a download hashes bytes as they arrive, so a cold disk
would only slow the re-hash further):

- the download's own hashing: SHA-256 of SIZE, as the store checks it;
- the stage's signature check (``reconciler.node.model_signatures.verify``):
  the signed file list against the artifacts, the link check, then the
  library verifying the envelope and re-hashing every file;
- the cheaper check: the same without the re-hash (the signed digests
  compared with the artifact digests the download already checked, and
  the envelope verified with the key), through the library's key verifier.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import emit, row

from reconciler.node import model_signatures
from reconciler.protocol.job_view import JobSigner
from tests.kit.producer_keys import openssl_key

MiB = 1024 * 1024
FILE = Path(tempfile.gettempdir()) / "reconciler-bench-model-signature"


def _write_once(size: int) -> Path:
    """The artifact, written block by block (no holes), reused between runs."""
    path = FILE / f"model-{size}.gguf"
    if path.exists() and path.stat().st_size == size:
        return path
    FILE.mkdir(exist_ok=True)
    block = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(MiB // 32))
    with open(path, "wb") as out:
        for _ in range(size // MiB):
            out.write(block)
    return path


def _median(runs: int, work: Callable[[], object]) -> tuple[float, float]:
    """Median wall and CPU seconds of ``work``."""
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        work()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(MiB):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    size = args.size_mib * MiB
    source = _write_once(size)
    with tempfile.TemporaryDirectory(dir=FILE) as scratch:
        root = Path(scratch)
        model = root / "model"
        model.mkdir()
        os.link(source, model / "model.gguf")
        private, public = openssl_key(root, "release")
        signature = root / "model.sig"
        subprocess.run(
            [sys.executable, "-m", "model_signing", "sign", "key", str(model),
             "--private_key", str(private), "--signature", str(signature)],
            check=True,
            capture_output=True,
        )  # fmt: skip
        sha256 = _sha256(source)
        artifacts = [{"name": "weights", "path": "model.gguf", "sha256": sha256, "size": size}]
        signers = [JobSigner("release", public)]
        signature_sha = hashlib.sha256(signature.read_bytes()).hexdigest()

        def full() -> None:
            model_signatures.verify(model, signature, signature_sha, signers, artifacts)

        from model_signing._signing import sign_ec_key, sign_sigstore_pb

        key_file = root / "release.pub"
        key_file.write_text(public)

        def cheap() -> None:
            files = model_signatures.signed_files(signature.read_bytes())
            model_signatures.compare_files(files, artifacts)
            model_signatures.refuse_links(model)
            bundle = sign_sigstore_pb.Signature.read(signature)
            sign_ec_key.Verifier(key_file).verify(bundle)

        hashing = _median(args.runs, lambda: _sha256(source))
        checked = _median(args.runs, full)
        without = _median(args.runs, cheap)
    load = os.getloadavg()[0]
    print(
        f"model signature over {args.size_mib} MiB, median of {args.runs}, load average {load:.1f}"
    )
    emit(
        [
            row("download's own SHA-256, wall", hashing[0], "s"),
            row("download's own SHA-256, CPU", hashing[1], "s"),
            row("signature check with re-hash, wall", checked[0], "s", hashing[0], "SHA-256"),
            row("signature check with re-hash, CPU", checked[1], "s", hashing[1], "SHA-256"),
            row("signature check on checked digests, wall", without[0] * 1000, "ms"),
            row("signature check on checked digests, CPU", without[1] * 1000, "ms"),
        ]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``stage`` job: every artifact it names is brought into the store, or
(a dry run) the server is asked for its size. A stage changes no config;
an artifact already held is not fetched again.

Must not: touch a runtime's config, or run any command.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reconciler.node.artifact_download import Deadline, Downloader, DownloadSettings
from reconciler.node.artifact_store import ArtifactStore, StageFailed
from reconciler.node.runtime_config import JobFailed


class Stager:
    """Runs stage jobs on the agent's stage worker, into ``store``."""

    def __init__(
        self,
        store: ArtifactStore,
        settings: DownloadSettings,
        downloaded: Callable[[int], object] = lambda size: None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.downloaded = downloaded  # told the bytes each download brought, failed or not
        self._downloader: Downloader | None = None
        self._stopping = threading.Event()

    @property
    def downloader(self) -> Downloader:
        """Made at the first stage job: an agent that never stages loads no CA store."""
        if self._downloader is None:
            self._downloader = Downloader(self.settings, self._stopping)
        return self._downloader

    def stop(self) -> None:
        """End a download under way, and any later one (the agent is stopping)."""
        self._stopping.set()

    def close(self) -> None:
        if self._downloader is not None:
            self._downloader.close()

    def stage(self, artifacts: Sequence[Mapping[str, Any]], seconds: float) -> str:
        """Fetch what is not held, all within ``seconds``; the job's detail,
        or ``JobFailed`` with the code of the first artifact that could not
        be staged."""
        deadline = Deadline.after(seconds)
        try:
            self.store.check_space(artifacts)
        except StageFailed as exc:
            raise JobFailed(f"{exc.text()}; nothing was downloaded") from None
        said = []
        for artifact in artifacts:
            name, sha256, size = artifact["name"], artifact["sha256"], int(artifact["size"])
            if self.store.holds(sha256, size):
                said.append(f"{name}: already held")
                continue
            partial = self.store.partial(sha256)
            resumed = partial.size
            try:
                self.downloader.fetch(artifact["url"], partial, size, deadline)
                partial.finish(size)
            except StageFailed as exc:
                raise JobFailed(f"{exc.code}: {name}: {exc.message}") from None
            finally:
                partial.close()
                self.downloaded(partial.received)
            said.append(
                f"{name}: downloaded {size} bytes"
                + (f" (resumed from byte {resumed})" if resumed else "")
            )
        return "; ".join(said)

    def require_held(self, artifacts: Sequence[Mapping[str, Any]]) -> None:
        """``not_staged`` unless every artifact is held with its digest."""
        missing = [
            a["name"] for a in artifacts if not self.store.holds(a["sha256"], int(a["size"]))
        ]
        if missing:
            raise JobFailed(
                f"not_staged: {', '.join(missing)} not held on this node; "
                "a stage job brings them first; nothing was changed"
            )

    def dry_run(self, artifacts: Sequence[Mapping[str, Any]], seconds: float) -> str:
        """What a live stage would fetch: the size each server reports, and
        whether the file is held already, asked within ``seconds``.
        Downloads nothing."""
        deadline = Deadline.after(seconds)
        said = []
        for artifact in artifacts:
            name, sha256, size = artifact["name"], artifact["sha256"], int(artifact["size"])
            if self.store.holds(sha256, size):
                said.append(f"{name}: already held")
                continue
            try:
                reported = self.downloader.remote_size(artifact["url"], deadline)
            except StageFailed as exc:
                raise JobFailed(f"{exc.code}: {name}: {exc.message}") from None
            if reported is None:
                said.append(f"{name}: not held; the server does not say its size")
            elif reported != size:
                said.append(
                    f"{name}: not held; the server reports {reported} bytes, not the "
                    f"declared {size}: a live stage would fail with digest_mismatch"
                )
            else:
                said.append(f"{name}: not held; the server reports {reported} bytes")
        return "would stage: " + "; ".join(said)

"""Which agent answers the daemon believes (docs/trust.md).

For a node whose file carries ``spec.agentKey``, an answer counts only when
its ``evidence`` verifies against that key; any other answer (none, a bad
signature, another node's key) is no evidence: a job observation becomes
``unreachable`` with the reason, a heartbeat is dropped. A refusal counts
only when signed over the job id it refuses, and a heartbeat only when it
is no older than one already believed for its node. A node without
``agentKey`` is believed as in version 1, and its observations lose any
``signed`` part, so status records evidence only when it was checked.

Must not decide anything about rollouts; the engine judges what is left.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from reconciler.protocol.evidence import evidence_problem, parse_agent_key, signed_bytes_problem
from reconciler.protocol.observations import (
    NO_EVIDENCE,
    BackupList,
    Heartbeat,
    JobObservation,
    SignedAnswer,
)
from reconciler.protocol.signing import TrustedKey, canonical_json
from reconciler.spec.model import Node
from reconciler.spec.times import format_time, parse_time

# Answers that carry a verdict: a 404 (unknown job: resend it) decides nothing.
CHECKED_STATES = frozenset({"accepted", "running", "succeeded", "failed", "refused"})
# Answers remembered as verified: a running job is read pass after pass with
# the same signed record. Past this many the memory starts afresh.
MAX_VERIFIED = 50_000


class AnswerCheck:
    """Checks answers against the nodes' agentKeys; parsed keys are cached
    by their line, so a pass over 10,000 nodes parses each key once, and an
    answer already verified (same key, same signature, same signed bytes) is
    not verified again.

    Part of the daemon's soft state, forgotten on restart: the newest
    heartbeat believed of each node (a replay of an older one is refused),
    shared by the passes, the agent client's thread and the fleet sweep's."""

    def __init__(self) -> None:
        self._keys: dict[str, TrustedKey | None] = {}
        # (key id, signature) -> SHA-256 of the canonical JSON it verified over
        self._verified: dict[tuple[str, str], bytes] = {}
        # The fleet's nodes by name, for ``prepare`` (``use_fleet``).
        self.nodes: Mapping[str, Node] = {}
        # Answers ``prepare`` verified, by identity, until the pass checks them:
        # the same object needs no second encoding (it holds its key id).
        self._prepared: dict[int, SignedAnswer] = {}
        # node -> the time of the newest heartbeat believed (soft state: a
        # restart forgets it); from the pass's and the fleet sweep's threads
        self._newest_beat: dict[str, datetime] = {}
        self._beats_lock = threading.Lock()

    def prepare(self, node: str, signed: SignedAnswer) -> None:
        """Check ``signed`` ahead of ``job`` or ``heartbeat``, from the agent
        client's thread as the answer arrives, so the pass finds it already
        verified (or not: then ``job`` checks it again and says why). Never
        raises: this is only an early start."""
        try:
            spec = self.nodes.get(node)
            if spec is not None and spec.agent_key is not None and not self._problem(spec, signed):
                if len(self._prepared) >= MAX_VERIFIED:
                    self._prepared.clear()
                self._prepared[id(signed)] = signed
        except Exception:  # the pass's own check says what is wrong
            return

    def believed_heartbeat(self, node: str, beat: Heartbeat) -> bool | None:
        """The fleet sweep's agentKey check, from its thread: None for a
        node without agentKey, else whether the heartbeat's evidence
        verifies against it."""
        spec = self.nodes.get(node)
        if spec is None or spec.agent_key is None:
            return None
        _, problem = self.heartbeat(spec, beat)
        return not problem

    def use_fleet(self, nodes: Mapping[str, Node]) -> None:
        """Check answers against these nodes from now on, their agentKeys
        parsed now, as the fleet is read, rather than on the agent client's
        thread as each node's first answer comes in (10,000 keys: 0.16 s)."""
        for node in nodes.values():
            self.key(node)
        self.nodes = nodes

    def key(self, node: Node | None) -> TrustedKey | None:
        if node is None or node.agent_key is None:
            return None
        line = node.agent_key
        if line not in self._keys:
            try:
                self._keys[line] = parse_agent_key(line, f"nodes/{node.name}.yaml")
            except ValueError:
                self._keys[line] = None  # validation reports the file; no key believes nothing
        return self._keys[line]

    def job(self, node: Node | None, seen: JobObservation) -> tuple[JobObservation, str]:
        """The observation to use, and why the answer was not believed ("" if it was)."""
        if node is None or node.agent_key is None:
            return (replace(seen, signed=None) if seen.signed is not None else seen), ""
        if seen.state not in CHECKED_STATES:
            return seen, ""
        problem = self._problem(node, seen.signed)
        if not problem and seen.state == "refused":
            problem = refusal_problem(node.name, seen)
        if not problem:
            return seen, ""
        return (
            JobObservation(seen.job_id, "unreachable", error=f"{NO_EVIDENCE} {problem}"),
            problem,
        )

    def heartbeat(self, node: Node | None, beat: Heartbeat) -> tuple[Heartbeat | None, str]:
        """The heartbeat to use (None: not believed), and why not."""
        if node is None or node.agent_key is None:
            return (replace(beat, signed=None) if beat.signed is not None else beat), ""
        problem = self._problem(node, beat.signed) or self._moves_forward(node.name, beat.time)
        return (None, problem) if problem else (beat, "")

    def backups(self, node: Node | None, listed: BackupList) -> tuple[BackupList | None, str]:
        """The backup list to use (None: not believed), and why not: a
        restore puts back what the list names, so for a node with agentKey
        only a signed list (``node`` checked as it was read) is believed."""
        if node is None or node.agent_key is None:
            return (replace(listed, signed=None) if listed.signed is not None else listed), ""
        problem = self._problem(node, listed.signed)
        return (None, problem) if problem else (listed, "")

    def _moves_forward(self, node: str, time: str) -> str:
        """Empty when ``time`` is no older than the newest heartbeat believed
        for ``node`` (and it becomes that); else why not: a replayed old
        signed heartbeat says nothing about the node now."""
        try:
            moment = parse_time(time)
        except ValueError:
            return f"the heartbeat time {time!r} is not an RFC 3339 time"
        with self._beats_lock:
            newest = self._newest_beat.get(node)
            if newest is not None and moment < newest:
                return (
                    f"the heartbeat of {time} is older than one already believed "
                    f"({format_time(newest)}): a replay"
                )
            self._newest_beat[node] = moment
        return ""

    def _problem(self, node: Node, signed: SignedAnswer | None) -> str:
        key = self.key(node)
        if key is None:
            return "its agentKey is not a valid Ed25519 public key"
        if signed is None or signed.key_id != key.key_id:
            return evidence_problem(signed, key)
        if self._prepared.pop(id(signed), None) is signed:
            return ""  # verified as it arrived, against a key with this very id
        try:
            data = canonical_json(signed.body)
        except (TypeError, ValueError):
            return evidence_problem(signed, key)  # says what is wrong with it
        digest = hashlib.sha256(data).digest()
        remembered = (key.key_id, signed.signature)
        if self._verified.get(remembered) == digest:
            return ""
        problem = signed_bytes_problem(data, signed.key_id, signed.signature, key)
        if not problem:
            if len(self._verified) >= MAX_VERIFIED:
                self._verified.clear()
            self._verified[remembered] = digest
        return problem


def refusal_problem(node: str, seen: JobObservation) -> str:
    """Empty when a refusal's signed body names this job and this node:
    any other signed answer of the agent (a heartbeat, another job's
    refusal) relayed as a 4xx refuses nothing."""
    body = seen.signed.body if seen.signed is not None else {}
    if body.get("jobId") != seen.job_id:
        return f"the refusal is not signed over job {seen.job_id}"
    if body.get("node") != node:
        return f"the refusal is not signed over node {node}"
    return ""

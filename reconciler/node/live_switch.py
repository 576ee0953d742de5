"""One live apply's way out of service and back: drain (the agent's
``--drain-command``, then the wait for idle), the moment the config is
activated, the warm-up, the evals (``eval_runs``), the undrain
(``--undrain-command``), and, when the after-apply, the warm-up or an eval
failed, the way back to the previous config (after-apply run again for it,
then undrain).

An apply that carries no artifacts, drain or warm-up is a version 2 apply:
no undrain, and a failure restores the bytes only, as before; its timings
are ``activatedAt`` and ``servingAt`` (the node is out of service while
its after-apply restarts the runtime). A restore has no timings.

Must not: write the config (``job_runner`` does, between these steps), or
run a command a job names (the commands are the agent's options).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.node.agent_config import AgentConfig
from reconciler.node.eval_runs import EvalResult, run_evals
from reconciler.node.eval_runs import failure as eval_failure
from reconciler.node.node_command import run_command
from reconciler.node.runtime_config import JobFailed
from reconciler.node.switchover import SwitchFailed, Timings, wait_idle, warm_up
from reconciler.protocol.job_view import JobDrain, JobPayload, JobTarget

AfterApply = Callable[[JobPayload, Mapping[str, Any]], "tuple[str, str] | None"]
Environment = Callable[[JobPayload, Mapping[str, Any]], dict[str, str]]


class LiveSwitch:
    """Begun (and drained) by ``begin``; then ``activated``, ``warm_up``,
    and ``serving`` or ``put_back``."""

    def __init__(
        self,
        job: JobPayload,
        before: Mapping[str, Any],
        config: AgentConfig,
        environment: Environment,
        timings: Timings | None,
        versioned: bool = False,
    ) -> None:
        self.job = job
        self.before = before
        self.config = config
        self.environment = environment
        self._timings = timings
        self.versioned = versioned  # carries artifacts, drain or warm-up
        self.drained = False
        self.eval_results: list[EvalResult] = []

    @classmethod
    def begin(
        cls,
        job: JobPayload,
        before: Mapping[str, Any],
        config: AgentConfig,
        environment: Environment,
        timings: Timings,
    ) -> LiveSwitch:
        """Drain when the job says so; ``JobFailed`` (``drain_timeout``,
        undrained, nothing changed) when the node is not idle in time."""
        versioned = bool(job.artifacts or job.drain or job.warmup or job.evals)
        timed = job.kind == "apply"  # every live apply: its time out of service
        switch = cls(job, before, config, environment, timings if timed else None, versioned)
        if job.drain is not None:
            switch._drain(job.drain, timings)
        return switch

    def _drain(self, drain: JobDrain, timings: Timings) -> None:
        deadline = time.monotonic() + drain.timeout_seconds
        timings.mark("drainStartedAt")
        self.drained = True
        command = self.config.drain_command
        try:
            if command:
                outcome = run_command(
                    "drain command",
                    command,
                    # The model it drains for: the target's, not the one serving.
                    self.environment(self.job, _target_values(self.job.target)),
                    max(0.1, deadline - time.monotonic()),
                )
                if outcome is not None:
                    raise SwitchFailed("drain_timeout", f"{outcome[0]}; nothing was changed")
            wait_idle(drain, deadline)
        except SwitchFailed as exc:
            said = exc.text + self._undrained(self.before)
            self._serving_now()
            raise JobFailed(said, timings=timings.record()) from None
        timings.mark("drainedAt")

    def activated(self) -> None:
        if self._timings is not None:
            self._timings.mark("activatedAt")

    def warm_up(self) -> tuple[str, str] | None:
        """None when every warm-up request answered as expected, else
        (what happened, output)."""
        try:
            warm_up(self.job.warmup)
        except SwitchFailed as exc:
            return exc.text, ""
        if self._timings is not None:
            self._timings.mark("warmedAt")
        return None

    def evaluate(self) -> tuple[str, str] | None:
        """Run the job's evals on the new config, still drained: None when
        every eval held, else (``eval_failed: ...``, "")."""
        if not self.job.evals:
            return None
        self.eval_results = run_evals(self.job.evals)
        said = eval_failure(self.eval_results)
        return None if said is None else (said, "")

    def eval_records(self) -> list[dict[str, Any]] | None:
        """The evals' results for the job record; None when the job has none."""
        if not self.job.evals:
            return None
        return [r.record() for r in self.eval_results]

    def put_back(self, after_apply: AfterApply | None) -> str:
        """Called once the previous bytes are back: after-apply again for
        them and undrain (a version 3 apply); what to add to the error."""
        if not self.versioned:
            return "; previous config restored"
        said = "; previous config restored"
        if after_apply is not None:
            again = after_apply(self.job, self.before)
            said += (
                ", after-apply run again for it"
                if again is None
                else f", but after-apply for it failed too ({again[0]})"
            )
        said += self._undrained(self.before)
        self._serving_now()
        return said

    def serving(self, written: Mapping[str, Any]) -> None:
        """The node takes requests again on the new config."""
        problem = self._undrain(written)
        if problem is not None:
            raise JobFailed(
                f"the new config is active and warmed up, but the {problem}: "
                "the node may not take requests until it is undrained by hand",
                timings=self.timings(),
            )
        self._serving_now()

    def _serving_now(self) -> None:
        if self._timings is not None:
            self._timings.mark("servingAt")

    def _undrained(self, values: Mapping[str, Any]) -> str:
        """Undrain when drained; what to add to an error."""
        if not self.drained:
            return ""
        problem = self._undrain(values)
        return "; undrained" if problem is None else f"; the {problem}"

    def _undrain(self, values: Mapping[str, Any]) -> str | None:
        """Run the undrain command when drained; None, or what went wrong."""
        if not self.drained:
            return None
        self.drained = False
        command = self.config.undrain_command
        if not command:
            return None
        outcome = run_command(
            "undrain command",
            command,
            self.environment(self.job, values),
            self.config.after_apply_timeout,
        )
        return None if outcome is None else outcome[0]

    def timings(self) -> dict[str, str | None] | None:
        return self._timings.record() if self._timings is not None else None


def _target_values(target: JobTarget) -> dict[str, str]:
    """The target as the values a config would hold: what the drain command
    is told, since it drains for the model about to serve."""
    return {
        "runtime": target.runtime,
        "provider": target.provider,
        "model": target.model,
        "profile": target.profile,
    }

"""A warm standby: two copies (slots ``a`` and ``b``) of a runtime on one
node, started, routed to and stopped by the agent's ``--slot-*`` commands.

A switch (a live apply with ``standby``, or a restore with no warm slot to
go back to) writes the new config to the idle slot's file, starts that
slot, warms it up and runs the evals against its port, then runs the route
command: traffic moves in one step, and the slot that served before keeps
running, warm. A restore whose previous slot still runs the backup's
config only routes back to it and stops the failed slot. A release stops
the slot kept warm.

The slot record (``STATE/slots/TYPE.json``) says which slot serves and
which is kept warm, and, while a switch is under way, which slot is being
started or routed to (``pending``): written before each step, so that an
agent killed mid-switch finds, on restart, the slot to stop (``recover``).

Must not: write the runtime's config (``job_runner`` does, once the route
command succeeded), take a backup, or run a command a job names.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconciler.node.agent_config import SLOT_NAMES, AgentConfig, SlotCommands
from reconciler.node.live_switch import LiveSwitch
from reconciler.node.node_command import run_command
from reconciler.node.runtime_config import JobFailed, parse_config
from reconciler.node.state_dir import StateDir, digest
from reconciler.node.switchover import TIMING_FIELDS, Timings
from reconciler.protocol.job_view import JobPayload, JobTarget

Environment = Callable[[JobPayload, Mapping[str, Any]], dict[str, str]]

COLD_START = "cold start: the previous slot was not running"
EMPTY_RECORD: dict[str, Any] = {"serving": None, "warm": None, "pending": None}


def other(slot: str) -> str:
    return SLOT_NAMES[1 - SLOT_NAMES.index(slot)]


def accepts_connections(port: int) -> bool:
    """Something listens on loopback ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


@dataclass
class Switched:
    """What a switch did, for the job record."""

    serving: str  # the slot that serves now
    timings: dict[str, str | None]
    standby: dict[str, Any]
    detail: str = ""
    evals: list[dict[str, Any]] | None = None


class StandbySwitch:
    """The slots of every runtime of one agent."""

    def __init__(
        self,
        config: AgentConfig,
        state: StateDir,
        environment: Environment,
        clock: Callable[[], datetime],
        count_evals: Callable[[Iterable[bool]], None],
    ) -> None:
        assert config.slots is not None
        self.count_evals = count_evals
        self.config = config
        self.commands: SlotCommands = config.slots
        self.state = state
        self.environment = environment
        self.clock = clock

    # -- the record ----------------------------------------------------------------

    def record(self, runtime: str) -> dict[str, Any]:
        return {**EMPTY_RECORD, **(self.state.read_slots(runtime) or {})}

    def _save(self, runtime: str, record: Mapping[str, Any]) -> None:
        self.state.write_slots(runtime, {**EMPTY_RECORD, **record})

    def takes(self, job: JobPayload) -> bool:
        """Whether ``job`` switches slots: a live apply with ``standby``,
        or a restore of a runtime that a slot serves."""
        if not job.live:
            return False
        if job.kind == "apply":
            return job.standby
        if job.kind == "restore":
            return self.record(job.target.runtime)["serving"] is not None
        return False

    # -- the commands --------------------------------------------------------------

    def _run(
        self, step: str, job: JobPayload, slot: str, values: Mapping[str, Any]
    ) -> tuple[str, str] | None:
        runtime = job.target.runtime
        env = self.environment(job, values)
        env.update(
            {
                "RECONCILER_RUNTIME": runtime,
                "RECONCILER_SLOT": slot,
                "RECONCILER_SLOT_PORT": str(self.commands.port(slot)),
                "RECONCILER_CONFIG": self.state.slot_config_location(runtime, slot),
            }
        )
        command = getattr(self.commands, step)
        return run_command(
            f"slot {step} command (slot {slot})", command, env, self.config.after_apply_timeout
        )

    def _slot_values(self, runtime: str, slot: str) -> Mapping[str, Any]:
        found = self.state.read_slot_config(runtime, slot)
        try:
            return parse_config(runtime, found[0]) if found is not None else {}
        except JobFailed:
            return {}

    def _stop(self, job: JobPayload, slot: str) -> str:
        """Stop ``slot``; "" or what went wrong, for an error or a detail."""
        runtime = job.target.runtime
        outcome = self._run("stop", job, slot, self._slot_values(runtime, slot))
        return "" if outcome is None else f"; {outcome[0]}: {outcome[1].strip()[-300:]}"

    # -- a switch to the idle slot ---------------------------------------------------

    def switch(
        self, job: JobPayload, new: tuple[bytes, int], values: Mapping[str, Any]
    ) -> Switched:
        """Start ``new`` (bytes, mode) in the idle slot, warm it up, run the
        evals, route to it. ``JobFailed`` with the step's code, the new slot
        stopped and the record as before, when a step fails."""
        runtime = job.target.runtime
        record = self.record(runtime)
        previous = record["serving"]
        if job.kind == "restore" and previous is not None:
            warm = record["warm"]
            port_open = warm is not None and accepts_connections(self.commands.port(warm))
            config = self.state.read_slot_config(runtime, warm) if warm else None
            if port_open and config is not None and digest(config[0]) == digest(new[0]):
                return self._route_back(job, record, warm)
        slot = "a" if previous is None else other(previous)
        timings = Timings(self.clock, dict.fromkeys((*TIMING_FIELDS, "routedAt")))
        if record["warm"] == slot:  # kept from an earlier switch: it makes room now
            said = self._stop(job, slot)
            if said:
                raise JobFailed(f"slot_stop_failed: the idle slot {slot} did not stop{said}")
        self._save(runtime, {**record, "warm": None, "pending": self._pending(job, slot)})
        self.state.write_slot_config(runtime, slot, new[0], new[1])
        timings.mark("activatedAt")
        on_slot = job.on_slot_port(self.commands.port(slot))
        live = LiveSwitch(on_slot, values, self.config, self.environment, timings, versioned=True)
        failure = self._run("start", job, slot, values)
        if failure is not None:
            failure = ("slot_start_failed: " + failure[0], failure[1])
        if failure is None:
            failure = live.warm_up()
        if failure is None:
            failure = live.evaluate()
            self.count_evals(r.held for r in live.eval_results)
        if failure is None:
            self._save(
                runtime, {**record, "warm": None, "pending": self._pending(job, slot, "route")}
            )
            failure = self._run("route", job, slot, values)
            if failure is not None:
                failure = ("route_failed: " + failure[0], failure[1])
        if failure is not None:
            what, tail = failure
            what += f"; slot {slot} was stopped" + self._stop(job, slot)
            what += f", slot {previous} still serves" if previous else ", nothing was routed to it"
            self._save(
                runtime, {**record, "warm": None if record["warm"] == slot else record["warm"]}
            )
            last = tail.strip()[-300:]
            raise JobFailed(
                what + (f"; output: {last}" if last else ""),
                detail=tail,
                timings=timings.record(),
                evals=live.eval_records(),
            )
        timings.mark("routedAt")
        timings.moments["servingAt"] = timings.moments["routedAt"]
        restore = job.kind == "restore"
        return Switched(
            serving=slot,
            timings=timings.record(),
            standby={"slot": None, "serving": slot, "warm": False}
            if restore
            else {"slot": previous, "serving": slot},
            detail=COLD_START if restore else "",
            evals=live.eval_records(),
        )

    def _pending(self, job: JobPayload, slot: str, step: str = "start") -> dict[str, str]:
        return {"slot": slot, "step": step, "jobId": job.job_id}

    def _route_back(self, job: JobPayload, record: Mapping[str, Any], warm: str) -> Switched:
        """A restore whose previous slot is warm and runs the backup's
        config: route back to it (the failed slot is stopped by ``settle``)."""
        runtime = job.target.runtime
        timings = Timings(self.clock, dict.fromkeys((*TIMING_FIELDS, "routedAt")))
        self._save(runtime, {**record, "pending": self._pending(job, warm, "route")})
        failure = self._run("route", job, warm, self._slot_values(runtime, warm))
        if failure is not None:
            self._save(runtime, record)
            last = failure[1].strip()[-300:]
            raise JobFailed(
                f"route_failed: {failure[0]}; slot {record['serving']} still serves, "
                f"slot {warm} is still kept warm" + (f"; output: {last}" if last else ""),
                detail=failure[1],
                timings=timings.record(),
            )
        timings.mark("routedAt")
        for step in ("activatedAt", "servingAt"):
            timings.moments[step] = timings.moments["routedAt"]
        return Switched(
            serving=warm,
            timings=timings.record(),
            standby={"slot": None, "serving": warm, "warm": True},
            detail=f"routed back to slot {warm}, kept warm",
        )

    def settle(self, job: JobPayload, switched: Switched) -> str:
        """Record the switch once the runtime's config names the new slot's;
        a restore stops the slot it rolled back from. What to add to the detail."""
        runtime = job.target.runtime
        previous = self.record(runtime)["serving"]
        if job.kind != "restore" or previous is None or previous == switched.serving:
            self._save(runtime, {"serving": switched.serving, "warm": previous})
            return ""
        said = self._stop(job, previous)
        # A failed stop leaves it recorded as kept: a release tries again.
        self._save(runtime, {"serving": switched.serving, "warm": previous if said else None})
        return f"; slot {previous} stopped" if not said else f"; slot {previous} not stopped{said}"

    # -- release ----------------------------------------------------------------------

    def release(self, job: JobPayload) -> tuple[dict[str, Any], str]:
        """Stop the slot kept warm: (the record's ``released``, detail).
        Idempotent: nothing kept, or a slot no longer running, runs nothing."""
        runtime = job.target.runtime
        record = self.record(runtime)
        warm = record["warm"]
        if warm is None:
            return {"slot": None, "stopped": False}, "no slot kept warm: nothing to stop"
        if not accepts_connections(self.commands.port(warm)):
            self._save(runtime, {**record, "warm": None})
            return {"slot": warm, "stopped": False}, f"slot {warm} was not running: nothing to stop"
        said = self._stop(job, warm)
        if said:
            raise JobFailed(f"slot_stop_failed: slot {warm} kept warm did not stop{said}")
        self._save(runtime, {**record, "warm": None})
        return {"slot": warm, "stopped": True}, f"slot {warm} stopped"

    # -- after a restart ------------------------------------------------------------------

    def recover(self, runtimes: Iterable[str]) -> dict[str, str]:
        """Finish what a killed agent left mid-switch: the slot it was
        starting or routing to is stopped, and routed away from when it may
        have been routed to, so the recorded slot serves. Job id -> what
        was done, for its record."""
        done: dict[str, str] = {}
        for runtime in sorted(runtimes):
            record = self.record(runtime)
            pending = record["pending"]
            if not pending:
                continue
            slot, serving = pending["slot"], record["serving"]
            job = _recovery_job(pending["jobId"], self.config.node, runtime)
            config = self.state.read_config(runtime)
            mine = self.state.read_slot_config(runtime, slot)
            if pending["step"] == "route" and config and mine and config[0] == mine[0]:
                # Routed, and the config written: only the record was left to write.
                self._save(runtime, {"serving": slot, "warm": serving})
                done[pending["jobId"]] = f"; the switch to slot {slot} had completed: it serves"
                continue
            said = ""
            if pending["step"] == "route" and serving is not None and serving != slot:
                failure = self._run("route", job, serving, self._slot_values(runtime, serving))
                said = "" if failure is None else f" (route back failed: {failure[0]})"
            said += self._stop(job, slot)
            self._save(runtime, {**record, "pending": None})
            done[pending["jobId"]] = (
                f"; slot {slot} it was switching to was stopped"
                + (f", slot {serving} still serves" if serving else "")
                + said
            )
        return done


def _recovery_job(job_id: str, node: str, runtime: str) -> JobPayload:
    """What the slot commands of a restart's clean-up run for: the switch's
    job id and runtime, kind ``recovery``; not a signed job."""
    return JobPayload(
        job_id=job_id,
        kind="recovery",
        node=node,
        rollout="",
        attempt=0,
        mode="live",
        target=JobTarget(runtime, "", "", ""),
        source_commit="",
        issued_at="",
        expires_at="",
        signed={},
    )

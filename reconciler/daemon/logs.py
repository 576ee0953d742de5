"""One line per event, for people (text) or for machines (JSON).

Every event names what it is about (rollout, node, commit) as fields, so a
log search for one rollout finds its whole story. ``route_logging`` sends
everything else that logs in the process (the standard library's root
logger: libraries, our own modules that use ``logging``, warnings,
exceptions in threads) through the same lines, so ``--log-format json``
writes nothing but JSON lines.

The same line (event, message and fields) written more than
``REPEATS_SHOWN`` times in a minute is folded: the rest of that minute is
counted, and one ``repeated`` line says how many were left out.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from reconciler.protocol.log_lines import FORMATS, log_line
from reconciler.spec.errors import redact_url
from reconciler.spec.times import format_time

LEVELS = ("debug", "info", "warning", "error")
REPEATS_SHOWN = 5  # lines alike written per minute before the rest are counted
REPEAT_WINDOW = 60.0  # seconds
REPEATS_KEPT = 10_000  # distinct lines counted at once; the oldest window ends early


class _Repeats:
    """Counts lines alike per minute. Forgetting it changes only how many
    repeats are shown."""

    def __init__(self, shown: int, window: float, clock: Callable[[], float]) -> None:
        self.shown, self.window, self.clock = shown, window, clock
        self.windows: OrderedDict[tuple[Any, ...], list[float]] = OrderedDict()  # key: [start, n]

    def admit(self, key: tuple[Any, ...]) -> bool:
        """Whether a line with ``key`` is written now (else it is counted)."""
        seen = self.windows.get(key)
        if seen is None:
            self.windows[key] = [self.clock(), 1]
            return True
        seen[1] += 1
        return seen[1] <= self.shown

    def expired(self, everything: bool = False) -> list[tuple[tuple[Any, ...], int]]:
        """The windows that ended (``everything``: all), with the lines each
        left out."""
        now, ended = self.clock(), []
        while self.windows:
            key, (start, count) = next(iter(self.windows.items()))
            # Lines alike are few; a flood of distinct ones is not kept.
            crowded = len(self.windows) > REPEATS_KEPT
            if now - start < self.window and not everything and not crowded:
                break
            del self.windows[key]
            if count > self.shown:
                ended.append((key, int(count - self.shown)))
        return ended


class EventLog:
    def __init__(
        self,
        fmt: str = "text",
        stream: TextIO | None = None,
        level: str = "info",
        *,
        repeats: int = REPEATS_SHOWN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"log format must be text or json, got {fmt!r}")
        self.fmt = fmt
        self.stream = stream or sys.stderr
        self.min_level = LEVELS.index(level)
        self._second: datetime | None = None
        self._second_text = ""
        self._repeats = _Repeats(repeats, REPEAT_WINDOW, clock)
        self._lock = threading.Lock()  # lines come from the pass and from threads

    def event(self, event: str, message: str = "", *, level: str = "info", **fields: Any) -> None:
        if LEVELS.index(level) < self.min_level:
            return
        key = (level, event, message, *sorted((k, str(v)) for k, v in fields.items()))
        with self._lock:
            folded = self._repeats.expired()
            admitted = self._repeats.admit(key)
        self._write_folded(folded)
        if admitted:
            self._write(self._line(self._now(), level, event, message, fields))

    def flush(self) -> None:
        """Write the counts of repeats folded so far (on stopping)."""
        with self._lock:
            folded = self._repeats.expired(everything=True)
        self._write_folded(folded)

    def _write_folded(self, folded: list[tuple[tuple[Any, ...], int]]) -> None:
        for (level, event, message, *fields), count in folded:
            text = f"the line above came {count} more time(s) in a minute: {message}"
            self._write(
                self._line(self._now(), level, event, text, {**dict(fields), "repeated": count})
            )

    def info_many(self, events: Iterable[tuple[str, str, Mapping[str, Any]]]) -> None:
        """``info(event, message, **fields)`` for each of ``events``, the same
        lines written at once (thousands per pass: a job sent or a node's
        verdict each), with the time they are written."""
        if LEVELS.index("info") < self.min_level:
            return
        now = self._now()
        lines = [self._line(now, "info", e, message, fields) for e, message, fields in events]
        if lines:
            self._write("\n".join(lines))

    def _now(self) -> str:
        # Formatted once a second: a pass logs thousands of lines in one.
        moment = datetime.now(UTC).replace(microsecond=0)
        if moment != self._second:
            self._second, self._second_text = moment, format_time(moment)
        return self._second_text

    def _line(
        self, now: str, level: str, event: str, message: str, fields: Mapping[str, Any]
    ) -> str:
        # Last line of defence for a token in a --repo URL: whatever a message
        # or field repeats (a library's exception text), no log line shows it.
        return redact_url(log_line(self.fmt, now, level, event, message, fields))

    def _write(self, text: str) -> None:
        with self._lock:
            print(text, file=self.stream, flush=True)

    def info(self, event: str, message: str = "", **fields: Any) -> None:
        self.event(event, message, level="info", **fields)

    def warning(self, event: str, message: str = "", **fields: Any) -> None:
        self.event(event, message, level="warning", **fields)

    def error(self, event: str, message: str = "", **fields: Any) -> None:
        self.event(event, message, level="error", **fields)


QUIET_LOGGERS = ("httpx", "httpcore")  # libraries whose info lines are noise here
_STDLIB_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning"}


class _Forward(logging.Handler):
    """A standard-library log record as one of ``log``'s lines: its event is
    the logger's last name, its fields the logger and any traceback."""

    def __init__(self, log: EventLog) -> None:
        super().__init__()
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = _STDLIB_LEVELS.get(record.levelno, "error")
            fields: dict[str, Any] = {"logger": record.name}
            if record.exc_info:
                fields["traceback"] = logging.Formatter().formatException(record.exc_info)
            self.log.event(
                record.name.rsplit(".", 1)[-1], record.getMessage(), level=level, **fields
            )
        except Exception:  # a log line must never end the daemon
            self.handleError(record)


@contextlib.contextmanager
def routed_logging(log: EventLog) -> Iterator[None]:
    """While inside: the root logger, warnings and exceptions in threads
    go through ``log``, and nothing else to stderr; as they were after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, threading.excepthook)
    root.handlers[:] = [_Forward(log)]
    root.setLevel(logging.DEBUG if log.min_level == 0 else logging.INFO)
    logging.captureWarnings(True)
    # httpx says every request it makes at info (each Alertmanager poll, each
    # pass): only its warnings are worth a line.
    quieted = {name: logging.getLogger(name) for name in QUIET_LOGGERS}
    levels = {name: logger.level for name, logger in quieted.items()}
    for logger in quieted.values():
        logger.setLevel(logging.WARNING)

    def thread_failed(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "a thread"
        logging.getLogger("reconciler.thread").error(
            "%s ended: %s", name, args.exc_value,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
            if args.exc_value is not None else None,
        )  # fmt: skip

    threading.excepthook = thread_failed
    try:
        yield
    finally:
        root.handlers[:], level, threading.excepthook = saved
        root.setLevel(level)
        for name, logger in quieted.items():
            logger.setLevel(levels[name])
        logging.captureWarnings(False)

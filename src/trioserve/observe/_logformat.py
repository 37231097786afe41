"""How ``trioserve run`` writes its log: plain text or one JSON object per line.

Lines that describe one thing (a request, a finished turn) carry their
fields twice: as ``key=value`` in the message, for people, and as record
attributes (``extra``), which the JSON format writes as top-level keys with
stable names.  Every JSON line has ``time`` (ISO 8601, UTC), ``level``,
``logger`` and ``message``; a traceback is in ``exc_info``.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Final, Literal

LogFormat = Literal["text", "json"]

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_BARE: Final = re.compile(r"[A-Za-z0-9_.:/@+<>-]+")


def formatter(form: LogFormat) -> logging.Formatter:
    """The formatter of ``--log-format``."""
    if form == "json":
        from pythonjsonlogger.json import JsonFormatter  # only then: 0.2 MiB less otherwise

        return JsonFormatter(
            "{levelname}{name}{message}",
            style="{",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",
        )
    return _TextFormatter(TEXT_FORMAT)


class _TextFormatter(logging.Formatter):
    """logging's formatter, with the time's seconds part made once a second (``strftime``
    was a tenth of a line's cost)."""

    _second = -1
    _text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        msec_format = self.default_msec_format
        if datefmt is not None or msec_format is None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return msec_format % (self._text, record.msecs)


def configure(level: str, form: LogFormat) -> None:
    """Log records of ``level`` and above to stderr in ``form``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(form))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # Neither format shows a thread, process or task: logging's own switches spare each
    # record looking them up (3 of a line's 21 µs; a request and a turn each log one).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    if sys.version_info >= (3, 12):
        logging.logAsyncioTasks = False


def log_fields(
    logger: logging.Logger, what: str, fields: Mapping[str, object], level: int = logging.INFO
) -> None:
    """One line: ``what key=value ...``, with each field also a record attribute."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={logfmt(v)}" for k, v in fields.items())
    # What logger.log(..., stacklevel=2) makes, without logging's findCaller, which
    # walks the stack and normalises every frame's path (most of the line's cost;
    # this runs for every request): the caller's frame is the one above.
    caller = sys._getframe(1)
    code = caller.f_code
    record = logger.makeRecord(
        logger.name,
        level,
        code.co_filename,
        caller.f_lineno,
        "%s %s",
        (what, text),
        None,
        code.co_name,
        dict(fields),
    )
    logger.handle(record)


def logfmt(value: object) -> str:
    """A value as ``key=value`` shows it: bare if it is a plain word, else JSON-quoted."""
    if value is None:
        return "none"
    kind = type(value)
    if kind is int or kind is float:  # always bare (digits, ".", "-", "e", inf, nan)
        return str(value)
    text = str(value)
    return text if _BARE.fullmatch(text) else json.dumps(text)

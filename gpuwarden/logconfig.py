"""One place that configures structlog for every gpuwarden process.

In a cluster the logs go to a collector, so they are JSON lines; in a
terminal a person reads them, so they are aligned key=value text. ``auto``
picks by whether stderr is a TTY, which is what both audiences expect without
a flag. Standard-library logging (the kubernetes client, urllib3) is routed
through the same renderer so that one process never writes two formats.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]

_configured = False


def configure_logging(fmt: LogFormat = "auto", level: str = "info") -> None:
    """Configure structlog and stdlib logging; later calls replace the setup."""
    global _configured
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")

    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.typing.Processor
    if fmt == "json":
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())

    structlog.configure(
        # Below the level, a line is dropped before anything is stamped or
        # merged: the scheduler's hot paths keep their debug lines.
        processors=[structlog.stdlib.filter_by_level, *shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: a module's logger keeps following the configuration,
        # so a later setup (or a test's capture) sees every logger, at the
        # cost of a microsecond per line on paths that log rarely.
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    # No renderer here prints the source file, thread or process of a
    # record, and finding the caller's frame was a quarter of the cost of
    # a line: the scheduler logs one line per cycle, on the scheduling
    # thread (the logging HOWTO's "Optimization" lists these switches).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # The kubernetes client logs every request body at DEBUG; keep it at
    # WARNING unless the whole process runs at DEBUG.
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    _configured = True


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A named structlog logger; usable before configure_logging (tests)."""
    return structlog.stdlib.get_logger(name)

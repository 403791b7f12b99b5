"""structlog set-up: JSON lines when stderr is not a terminal, every line bound to node and term."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(node_id: str | None = None, level: str = "INFO", json: bool | None = None) -> None:
    """Configure structlog once per process; `json=None` picks JSON unless stderr is a TTY."""
    if json is None:
        json = not sys.stderr.isatty()
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    if node_id is not None:
        structlog.contextvars.bind_contextvars(node_id=node_id, term=0)


def bind_term(term: int) -> None:
    """Called by the election on every term change, so each log line carries the current term."""
    structlog.contextvars.bind_contextvars(term=term)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)

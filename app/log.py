"""structlog set-up: JSON lines when stderr is not a terminal, every line bound to node and term."""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone

import structlog


_NODE: dict[str, object] = {}  # node_id and term, stamped on every line


def _add_node_and_term(_logger: object, _method: str, event: dict) -> dict:
    """Process-wide, not a contextvar: asyncio tasks copy context when created, so a term bound
    later by the election would never reach the gossip or daemon tasks already running."""
    for key, value in _NODE.items():
        event.setdefault(key, value)
    return event


def configure_logging(node_id: str | None = None, level: str = "INFO", json: bool | None = None) -> None:
    """Configure structlog once per process; `json=None` picks JSON unless stderr is a TTY."""
    if json is None:
        json = not sys.stderr.isatty()
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_node_and_term,
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
        _NODE.update(node_id=node_id, term=_NODE.get("term", 0))


def iso_timestamp(epoch: float) -> str:
    """An epoch as every line the node writes stamps it (structlog's `timestamp`: ISO 8601, UTC)."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch_of(line: dict) -> float:
    """A written line's time in epoch seconds: its `timestamp`, or the `t` (events, pipeline
    history) or `ts` (mesh history) of a file written before every file used `timestamp`."""
    if "timestamp" in line:
        return datetime.strptime(line["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
    return float(line["t"] if "t" in line else line["ts"])


def bind_term(term: int) -> None:
    """Called by the election on every term change, so each log line carries the current term."""
    _NODE["term"] = term


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)

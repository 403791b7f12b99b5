"""The one line format of a run's log files (`launcher.log`, `torchrun.log`, `rank_<r>.log`).

The node's console and its journals are JSON lines stamped `timestamp` (ISO 8601, UTC:
app/log.py); a training run's logs are the same, so one reader (`jq`, a log shipper) takes
every file the node writes. A line of a process's raw output (torchrun's, a rank's print or
traceback, C-level writes included) becomes one JSON line: its text under `event`, where it
came from under `source` (launcher | torchrun | rank), and the rank and `stream` (stdout |
stderr) where known. Plain text stays where a human reads a terminal by choice (the launcher
run by hand without `--log-format json`).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # app.log.iso_timestamp's (not imported: every rank's
# worker imports this module before its target, and structlog costs it seconds on a busy host)


def output_line(text: str, source: str, *, rank: int | None = None, stream: str | None = None,
                at: float | None = None) -> str:
    """One line of output as a JSON line (no newline)."""
    stamp = datetime.fromtimestamp(time.time() if at is None else at, tz=timezone.utc).strftime(TIMESTAMP_FORMAT)
    record: dict = {"timestamp": stamp, "source": source}
    if rank is not None:
        record["rank"] = rank
    if stream is not None:
        record["stream"] = stream
    record["event"] = text
    return json.dumps(record, ensure_ascii=False)


def parse_line(line: str) -> dict | None:
    """A JSON line of this format, or None (a raw line: a file from before, or a torn last line)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "timestamp" in record and "event" in record else None


def text_of(line: str) -> str:
    """What a log line says for a human: the text of a JSON line, else the line itself."""
    record = parse_line(line)
    return line if record is None else str(record["event"])

"""The node's event journal: every event, one JSON line, in `<data_dir>/events.jsonl`.

Operators (and the dashboard) read what the loop did and when: generations trained, failed,
promoted and rejected, models distributed, daemons given up, leaders elected, quorum lost and
regained. It is the router's one handler that does I/O on every event, so it is the one the
dead-letter queue exists for: a write that fails (a full disk, an unwritable directory) is
retried from the DLQ with backoff, and a retry never writes a line twice (lines carry the
event key, and keys already in the file are skipped).

The file rotates once past `max_bytes` (one previous file, `events.jsonl.1`, is kept), so a
node that runs for months does not fill its disk with it.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from app.coordination.daemons.event_router import Event, EventRouter
from app.coordination.daemons.events import EventType
from app.log import get_logger, iso_timestamp

log = get_logger(__name__)
HANDLER_NAME = "event_journal"
DEFAULT_MAX_BYTES = 8 << 20


class EventJournal:
    def __init__(self, path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._keys = self._read_keys()
        self._lock = asyncio.Lock()

    def subscribe(self, router: EventRouter) -> None:
        """Journal every event type; the stable handler name lets the DLQ retry it after a restart."""
        for event_type in EventType:
            router.subscribe(event_type, self.record, name=HANDLER_NAME)

    async def record(self, event: Event) -> None:
        async with self._lock:
            if event.key in self._keys:
                return  # a DLQ retry of a line that was written after all
            line = json.dumps({"timestamp": iso_timestamp(event.published_at), "type": event.type.value, "key": event.key,
                               "payload": event.payload.model_dump(mode="json")}, sort_keys=True)
            await asyncio.to_thread(self._append, line)
            self._keys.add(event.key)

    def _append(self, line: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > self.max_bytes:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._keys.clear()
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _read_keys(self) -> set[str]:
        """Keys already journaled; a torn last line (a crash mid-write) is skipped, not fatal."""
        keys: set[str] = set()
        try:
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        keys.add(json.loads(line)["key"])
                    except (ValueError, KeyError, TypeError):
                        log.warning("event_journal_line_unreadable", path=str(self.path))
        except FileNotFoundError:
            pass
        except OSError as exc:  # the node still runs; the writes fail into the DLQ and say why
            log.error("event_journal_unreadable", path=str(self.path), error=str(exc))
        return keys

    def entries(self, limit: int = 100) -> list[dict]:
        """The newest `limit` entries, oldest first (for /status and the dashboard)."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()[-limit:]
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

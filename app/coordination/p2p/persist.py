"""Durable node-local state: term and vote, quorum commits, and the append-only history.

A vote or a term that is forgotten after a crash could let a node vote twice in one term, so
these files are written atomically (temp name, fsync, os.replace, fsync of the directory)
BEFORE the answer that depends on them leaves the node.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.atomic_files import atomic_write_json
from app.config.base import ConfigError
from app.coordination.p2p.decision import Stored, may_store
from app.coordination.p2p.election import TERM_CEILING
from app.coordination.p2p.schemas import MAX_TERM, QuorumCert
from app.log import get_logger, iso_timestamp

log = get_logger(__name__)


def read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


@dataclass(frozen=True)
class TermRecord:
    current_term: int = 0
    voted_for: str | None = None
    incarnation: int = 0


class TermStore:
    """(current_term, voted_for, incarnation), persisted on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        raw = read_json(path, {})
        self.record = TermRecord(
            current_term=int(raw.get("current_term", 0)),
            voted_for=raw.get("voted_for"),
            incarnation=int(raw.get("incarnation", 0)),
        )
        if not 0 <= self.record.incarnation < MAX_TERM:
            raise ConfigError(f"{path}: incarnation outside 0..{MAX_TERM}; refusing a corrupt or poisoned file")
        if not 0 <= self.record.current_term <= TERM_CEILING:
            # the rule every message's term passes (election.term_refusal), at start-up: no
            # election reaches such a term, and starting with it would leave none to run
            raise ConfigError(
                f"{path}: term {self.record.current_term} is outside 0..{TERM_CEILING} (the highest term a voter "
                "adopts); only a poisoned message or a corrupt file leaves one there. Refusing to start: restore the "
                "file from a backup, or remove it to rejoin at term 0")

    @property
    def term(self) -> int:
        return self.record.current_term

    @property
    def voted_for(self) -> str | None:
        return self.record.voted_for

    def save(self, current_term: int, voted_for: str | None) -> None:
        if current_term < self.record.current_term:
            raise ValueError(f"term may not go back: {self.record.current_term} -> {current_term}")
        if current_term > MAX_TERM:
            raise ValueError(f"term {current_term} is above the bound {MAX_TERM}")
        new = TermRecord(current_term, voted_for, self.record.incarnation)
        self._write(new)

    def next_incarnation(self) -> int:
        """Called once per process start: a restarted node's gossip outranks its old self."""
        new = TermRecord(
            self.record.current_term, self.record.voted_for, self.record.incarnation + 1
        )
        self._write(new)
        return new.incarnation

    def _write(self, new: TermRecord) -> None:
        atomic_write_json(
            self.path,
            {
                "current_term": new.current_term,
                "voted_for": new.voted_for,
                "incarnation": new.incarnation,
            },
        )
        self.record = new


class CommitStore:
    """What this voter stored for each key, with the term it was stored in, and the values it
    knows are decided, each with its decision certificate (quorum_cert.py: a majority of voters'
    signed acks). Only decided values may be acted on; a stored value alone may be one no quorum
    ever took. Every node keeps one (a non-voter learns decided values from gossip). One JSON
    file: key -> {"value", "term", "decided"?, "cert"?, "before_certificates"?}.

    Files of earlier versions load. A value such a file marks decided without a certificate
    (written before quorum certificates, issue 54) has no proof a majority agreed: it is kept
    as *decided before certificates* (`before_certificates`, marked so in the file and in
    /status `trust`), a stored value as far as the quorum is concerned, but not decided here:
    never applied, never gossiped, until a leader decides that key again through the quorum
    (its read phase finds the value a majority stored) and the certificate arrives. What the
    node already applied from it lives on in its generation and rollback logs (own files)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[str, Stored] = {}
        self.decided: dict[str, None] = {}  # insertion-ordered set: the order values were learned
        self.certs: dict[str, QuorumCert] = {}
        self.before_certificates: dict[str, None] = {}  # decided by an earlier version, no certificate
        for key, raw in dict(read_json(path, {})).items():
            # files of earlier versions hold bare values: stored in term 0, the oldest
            self.values[key] = (Stored(raw["value"], int(raw["term"])) if isinstance(raw, dict)
                                else Stored(str(raw), 0))
            uncertified = isinstance(raw, dict) and raw.get("decided") and raw.get("cert") is None
            if isinstance(raw, dict) and (raw.get("before_certificates") or uncertified):
                self.before_certificates[key] = None
            elif isinstance(raw, dict) and raw.get("decided"):
                self.decided[key] = None
                if raw.get("cert") is not None:
                    try:
                        self.certs[key] = QuorumCert.model_validate(raw["cert"])
                    except ValueError as exc:
                        raise ConfigError(f"{path}: key {key!r}: a malformed decision certificate ({exc}); "
                                          "restore the file from a backup, or remove it") from None
        if self.before_certificates:
            log.warning("mesh_commits_before_certificates", path=str(path), keys=len(self.before_certificates),
                        detail="values this file marks decided without a quorum certificate (an earlier version's): "
                               "kept as stored values, not applied or gossiped until a leader decides them again")

    def get(self, key: str) -> str | None:
        stored = self.values.get(key)
        return None if stored is None else stored.value

    def get_stored(self, key: str) -> Stored | None:
        return self.values.get(key)

    def decided_value(self, key: str) -> str | None:
        return self.values[key].value if key in self.decided else None

    def decided_values(self) -> dict[str, str]:
        return {k: self.values[k].value for k in sorted(self.decided)}

    def certified(self, prefixes: tuple[str, ...], limit: int) -> list[tuple[str, str, QuorumCert]]:
        """The last `limit` decided (key, value, certificate) per prefix, in the order learned."""
        out: list[tuple[str, str, QuorumCert]] = []
        for prefix in prefixes:
            keys = [k for k in self.decided if k.startswith(prefix) and k in self.certs]
            out += [(k, self.values[k].value, self.certs[k]) for k in keys[-limit:]]
        return out

    def store(self, key: str, value: str, term: int) -> tuple[bool, str]:
        """(stored, why): see decision.may_store; a decided value is never replaced, not even by
        a leader of a later term (a compromised one). Persisted before it returns True."""
        if key in self.decided and self.values[key].value != value:
            return False, "a different value is decided for this key"
        existing = self.values.get(key)
        ok, why = may_store(existing, value, term)
        if not ok:
            return False, why
        same = existing is not None and existing.value == value
        new = Stored(value, max(term, existing.term) if same else term)
        if new != existing:
            self.values[key] = new
            if not same:
                self.before_certificates.pop(key, None)  # replaced through the quorum: the mark goes
            self._save()
        return True, why

    def learn(self, key: str, value: str, cert: QuorumCert) -> bool:
        """`value` is decided for `key`, as `cert` (already checked by the caller) proves; False
        when another value is decided here (two certificates for one key: never, unless a
        majority of voters lied). Persisted before it returns True."""
        held = self.decided_value(key)
        if held is not None and held != value:
            return False
        if held == value and key in self.certs:
            return True
        existing = self.values.get(key)
        self.values[key] = Stored(value, max(cert.term, existing.term if existing else 0))
        self.decided[key] = None
        self.certs[key] = cert.without_certs()
        self.before_certificates.pop(key, None)
        self._save()
        return True

    def _save(self) -> None:
        def entry(k: str, s: Stored) -> dict[str, Any]:
            out: dict[str, Any] = {"value": s.value, "term": s.term}
            if k in self.decided:
                out["decided"] = True
                if k in self.certs:
                    out["cert"] = self.certs[k].model_dump()
            elif k in self.before_certificates:
                out["before_certificates"] = True  # decided by an earlier version, without proof
            return out
        atomic_write_json(self.path, {k: entry(k, s) for k, s in self.values.items()})


class HistoryLog:
    """Append-only JSON lines of role and leader changes, read by the invariant checker; each
    stamped `timestamp` (ISO 8601, UTC) as every file the node writes (lines written before
    carry an epoch `ts`: app.log.epoch_of reads both)."""

    def __init__(self, path: Path, node_id: str) -> None:
        self.path = path
        self.node_id = node_id
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, event: str, term: int, **fields: Any) -> None:
        line = json.dumps(
            {"timestamp": iso_timestamp(time.time()), "node": self.node_id, "term": term, "event": event, **fields}
        )
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def read_history(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a history file (a torn last line after kill -9 is skipped)."""
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def leaders_by_term(histories: list[list[dict[str, Any]]]) -> dict[int, set[str]]:
    """term -> nodes that became leader in it; the invariant is len(...) <= 1 everywhere."""
    out: dict[int, set[str]] = {}
    for events in histories:
        for ev in events:
            if ev.get("event") == "became_leader":
                out.setdefault(int(ev["term"]), set()).add(str(ev["node"]))
    return out

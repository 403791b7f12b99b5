"""The cluster's record of decided generations: one committed value per generation number.

The leader commits `generation/<g>` through a quorum of voters before anyone acts on it, and
a voter never stores two values for one key. Every node keeps the records it has seen in
this log and gossips them, so any node can answer /progress, a new leader knows where the
loop stands, and a node that was away catches up. A gossiped record that contradicts one
already held is refused and reported, never merged: no node accepts two models for one
generation.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from app.atomic_files import atomic_write_json

COMMIT_PREFIX = "generation/"
HELDOUT_KEYS_MAX = 8
MATCHES_MAX = 8  # opponents of one gauntlet
NAME_MAX = 200  # a player's name (a model player's holds its 64-hex sha256)
GAMES_MAX = 1_000_000  # wins, draws or losses against one opponent


@dataclass(frozen=True)
class GenerationRecord:
    generation: int
    sha256: str  # the candidate's model sha256 (promoted or not)
    promoted: bool
    games_mark: int  # cluster-wide games created when this generation's training was scheduled
    trained_by: str
    reason: str = ""
    elo: float | None = None
    heldout: dict[str, float] | None = None  # lm: held-out reward, its interval and exact match
    # games: the gauntlet's results, {"player": the candidate's player name, "results":
    # [[opponent player, wins, draws, losses], ...]}, so every node rates every generation
    # from the same games (generation_elo.py), whichever node played them
    matches: dict | None = None
    # the candidate's final training loss (the claimant's run), so the loss plateau -> exploration
    # loop follows the lineage's recorded history whichever node trained (feedback_apply.py)
    loss: float | None = None
    # not promoted, yet the next generation trains on from this candidate (the trainer's head:
    # a language model's GRPO runs on; a regression past the margin sends it back to the best)
    head: bool = False

    def __post_init__(self) -> None:
        if self.loss is not None and (isinstance(self.loss, bool) or not isinstance(self.loss, (int, float))
                                      or not math.isfinite(self.loss)):
            raise ValueError(f"generation {self.generation}: loss must be a finite number")
        if self.matches is not None:
            _check_matches(self.generation, self.matches)
        if self.heldout is not None:  # a gossiped record is bounded like any message
            if not isinstance(self.heldout, dict) or len(self.heldout) > HELDOUT_KEYS_MAX:
                raise ValueError(f"generation {self.generation}: heldout must be a dict of at most "
                                 f"{HELDOUT_KEYS_MAX} numbers")
            for key, value in self.heldout.items():
                if not isinstance(key, str) or len(key) > 32 or isinstance(value, bool) \
                        or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"generation {self.generation}: heldout {key!r} must be a finite number")

    def commit_key(self) -> str:
        return f"{COMMIT_PREFIX}{self.generation}"

    def to_json(self) -> dict:
        """The record's fields; `heldout` only where there is one (game records stay
        byte for byte what they were before the field existed)."""
        data = asdict(self)
        for optional in ("heldout", "matches", "loss"):
            if data[optional] is None:
                del data[optional]
        if not self.head:
            del data["head"]
        return data

    def to_value(self) -> str:
        """The committed string: canonical JSON, so equal records are equal values."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_value(value: str | dict) -> "GenerationRecord":
        data = json.loads(value) if isinstance(value, str) else value
        return GenerationRecord(
            generation=int(data["generation"]), sha256=str(data["sha256"]), promoted=bool(data["promoted"]),
            games_mark=int(data["games_mark"]), trained_by=str(data["trained_by"]),
            reason=str(data.get("reason", "")), elo=data.get("elo"), heldout=data.get("heldout"),
            matches=data.get("matches"), loss=data.get("loss"), head=data.get("head") is True,
        )


def _check_matches(generation: int, matches: object) -> None:
    """A gossiped record is bounded like any message: names, counts and sizes."""
    def bad(why: str) -> ValueError:
        return ValueError(f"generation {generation}: matches {why}")

    if not isinstance(matches, dict) or set(matches) != {"player", "results"}:
        raise bad("must be {player, results}")
    player, results = matches["player"], matches["results"]
    if not isinstance(player, str) or not 0 < len(player) <= NAME_MAX:
        raise bad(f"player must be a name of 1-{NAME_MAX} characters")
    if not isinstance(results, list) or len(results) > MATCHES_MAX:
        raise bad(f"results must be a list of at most {MATCHES_MAX}")
    for row in results:
        if not isinstance(row, list) or len(row) != 4 or not isinstance(row[0], str) \
                or not 0 < len(row[0]) <= NAME_MAX:
            raise bad("rows must be [opponent, wins, draws, losses]")
        if any(isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= GAMES_MAX for n in row[1:]):
            raise bad(f"counts must be integers in 0..{GAMES_MAX}")


def latest(records: dict[int, GenerationRecord]) -> GenerationRecord | None:
    return records[max(records)] if records else None


def latest_promoted(records: dict[int, GenerationRecord]) -> GenerationRecord | None:
    promoted = [g for g, r in records.items() if r.promoted]
    return records[max(promoted)] if promoted else None


def trainer_head(records: dict[int, GenerationRecord]) -> GenerationRecord | None:
    """The model the next generation trains from: the newest decided generation's candidate when
    it was kept as the head (`head`), else the best (the newest promoted). `records` as the
    pipeline acts on them (rollback.effective_records: a head that ran on from a rolled-back
    best is no head there)."""
    last = latest(records)
    if last is not None and last.head and not last.promoted:
        return last
    return latest_promoted(records)


def merge_records(
    held: dict[int, GenerationRecord], incoming: list[GenerationRecord]
) -> tuple[dict[int, GenerationRecord], list[str]]:
    """Pure: `held` plus the new generations of `incoming`; conflicting ones are refused."""
    merged = dict(held)
    conflicts = []
    for record in incoming:
        mine = merged.get(record.generation)
        if mine is None:
            merged[record.generation] = record
        elif mine != record:
            conflicts.append(
                f"generation {record.generation}: holding {mine.sha256[:12]} "
                f"(promoted={mine.promoted}), refused {record.sha256[:12]} (promoted={record.promoted})"
            )
    return merged, conflicts


class GenerationLog:
    """The records this node holds, persisted atomically in one JSON file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: dict[int, GenerationRecord] = {}
        if self.path.exists():
            data = json.loads(self.path.read_text())
            self.records = {int(r["generation"]): GenerationRecord.from_value(r) for r in data}

    def merge(self, incoming: list[GenerationRecord]) -> list[str]:
        """Merge and persist; returns the conflicts (refused records), if any."""
        merged, conflicts = merge_records(self.records, incoming)
        if merged != self.records:
            self.records = merged
            self._save()
        return conflicts

    def to_json(self) -> list[dict]:
        return [self.records[g].to_json() for g in sorted(self.records)]

    def _save(self) -> None:
        atomic_write_json(self.path, self.to_json(), indent=1)

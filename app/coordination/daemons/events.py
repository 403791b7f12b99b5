"""The few typed events daemons exchange, each with one payload schema.

An enum plus a schema per member (rather than free-form dicts) so a typo in a field name is
an error at publish time on the sender, not a silent KeyError in a handler on another node.
Payloads are small, frozen and reject unknown fields; the lead may add fields as needed.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
NonNegative = Annotated[int, Field(ge=0)]


class EventPayloadError(ValueError):
    """A payload does not match the schema of its event type."""


class EventType(str, enum.Enum):
    NEW_ITEMS_AVAILABLE = "new_items_available"  # self-play stored games (or rollout groups)
    TRAINING_THRESHOLD_REACHED = "training_threshold_reached"
    TRAINING_STARTED = "training_started"
    TRAINING_COMPLETED = "training_completed"
    TRAINING_FAILED = "training_failed"
    EVALUATION_COMPLETED = "evaluation_completed"
    MODEL_PROMOTED = "model_promoted"
    PROMOTION_REJECTED = "promotion_rejected"
    MODEL_DISTRIBUTED = "model_distributed"
    LEADER_ELECTED = "leader_elected"
    QUORUM_CHANGED = "quorum_changed"
    DAEMON_CRASH_LOOP = "daemon_crash_loop"
    ALLOCATION_CHANGED = "allocation_changed"  # the scheduler across configs moved the shares
    TRAINING_ADJUSTED = "training_adjusted"  # quality -> training moved the next run's lr or batch
    EXPLORATION_ADJUSTED = "exploration_adjusted"  # loss plateau -> exploration moved self-play's noise
    # Deprecated alias, kept for one release: the same member as NEW_ITEMS_AVAILABLE.
    NEW_GAMES_AVAILABLE = "new_items_available"

    @classmethod
    def _missing_(cls, value: object) -> EventType | None:
        """An event of the previous release (a dead letter, a journal line) still parses."""
        return cls.NEW_ITEMS_AVAILABLE if value == "new_games_available" else None


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NewItemsAvailable(Payload):
    count: NonNegative  # items (games or rollout groups) added since the previous event
    total: NonNegative  # the newest item's row id now (the export's counter)


NewGamesAvailable = NewItemsAvailable  # deprecated alias, kept for one release


class TrainingThresholdReached(Payload):
    generation: NonNegative  # the generation that training would produce
    new_games: NonNegative
    threshold: NonNegative


class TrainingStarted(Payload):
    generation: NonNegative
    node_id: str
    dataset_sha256: Sha256


class TrainingCompleted(Payload):
    generation: NonNegative
    candidate_path: str
    candidate_sha256: Sha256
    parent_sha256: Sha256 | None  # None for the first generation
    dataset_sha256: Sha256
    final_loss: float


class TrainingFailed(Payload):
    generation: NonNegative
    node_id: str
    error: str


class OpponentResult(Payload):
    wins: NonNegative
    losses: NonNegative
    draws: NonNegative
    score: Annotated[float, Field(ge=0.0, le=1.0)]  # (wins + draws / 2) / games


class EvaluationCompleted(Payload):
    generation: NonNegative
    candidate_sha256: Sha256
    results: dict[str, OpponentResult]  # opponent name -> result
    passed: bool


class ModelPromoted(Payload):
    generation: NonNegative
    sha256: Sha256
    path: str  # where the model is on this node, or will be once distribution fetched it


class PromotionRejected(Payload):
    generation: NonNegative
    candidate_sha256: Sha256
    reason: str


class ModelDistributed(Payload):
    generation: NonNegative
    sha256: Sha256
    node_id: str
    path: str


class LeaderElected(Payload):
    term: NonNegative
    leader_id: str


class QuorumChanged(Payload):
    level: str  # HEALTHY, DEGRADED, MINIMUM or LOST
    previous: str | None
    alive_voters: NonNegative
    total_voters: NonNegative


class DaemonCrashLoop(Payload):
    daemon: str
    node_id: str
    starts: NonNegative
    window_s: float
    critical: bool
    last_error: str


Share = Annotated[float, Field(ge=0.0, le=1.0)]



class AllocationChanged(Payload):
    trigger: str  # progress (Elo -> self-play), regression (-> curriculum), promotion (-> rebalance), start
    shares: dict[str, Share]  # config -> share of the node's compute
    reasons: dict[str, str]  # config -> why, one line
    regressing: list[str]


class TrainingAdjusted(Payload):
    """quality -> training (app/coordination/pipeline/feedback_loops.py) moved its scale."""

    generation: NonNegative  # whose export was scored; its training uses the new values
    score: Share
    scale: Annotated[float, Field(gt=0.0, le=1.0)]
    previous_scale: Annotated[float, Field(gt=0.0, le=1.0)]
    values: dict[str, float]  # the trainer's options it sets ({}: the configured ones again)
    reason: str


class ExplorationAdjusted(Payload):
    """loss plateau -> exploration (app/coordination/pipeline/feedback_loops.py) moved the noise."""

    generation: NonNegative  # the decided generation that moved it
    dirichlet_fraction: Share
    previous: Share
    reason: str


PAYLOAD_SCHEMAS: dict[EventType, type[Payload]] = {
    EventType.NEW_ITEMS_AVAILABLE: NewItemsAvailable,
    EventType.TRAINING_THRESHOLD_REACHED: TrainingThresholdReached,
    EventType.TRAINING_STARTED: TrainingStarted,
    EventType.TRAINING_COMPLETED: TrainingCompleted,
    EventType.TRAINING_FAILED: TrainingFailed,
    EventType.EVALUATION_COMPLETED: EvaluationCompleted,
    EventType.MODEL_PROMOTED: ModelPromoted,
    EventType.PROMOTION_REJECTED: PromotionRejected,
    EventType.MODEL_DISTRIBUTED: ModelDistributed,
    EventType.LEADER_ELECTED: LeaderElected,
    EventType.QUORUM_CHANGED: QuorumChanged,
    EventType.DAEMON_CRASH_LOOP: DaemonCrashLoop,
    EventType.ALLOCATION_CHANGED: AllocationChanged,
    EventType.TRAINING_ADJUSTED: TrainingAdjusted,
    EventType.EXPLORATION_ADJUSTED: ExplorationAdjusted,
}


def validate_payload(event_type: EventType | str, payload: Payload | dict[str, Any]) -> Payload:
    """The payload as an instance of the event's schema, or EventPayloadError saying why not."""
    try:
        event_type = EventType(event_type)
    except ValueError:
        raise EventPayloadError(f"unknown event type {event_type!r}") from None
    schema = PAYLOAD_SCHEMAS[event_type]
    if isinstance(payload, schema):
        return payload
    if isinstance(payload, BaseModel):
        raise EventPayloadError(
            f"{event_type.name} takes a {schema.__name__} payload, got {type(payload).__name__}"
        )
    if not isinstance(payload, dict):
        raise EventPayloadError(f"{event_type.name} payload must be a mapping, got {type(payload).__name__}")
    try:
        return schema.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<payload>'}: {err['msg']}" for err in exc.errors()
        )
        raise EventPayloadError(f"{event_type.name} payload invalid: {problems}") from None


def canonical_json(payload: Payload) -> str:
    """Sorted keys, no whitespace: equal payloads give equal bytes on every node."""
    return json.dumps(payload.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def event_key(event_type: EventType, payload: Payload) -> str:
    """SHA-256 of type and canonical payload: the identity used to drop duplicate deliveries."""
    return hashlib.sha256(f"{EventType(event_type).value}\n{canonical_json(payload)}".encode()).hexdigest()

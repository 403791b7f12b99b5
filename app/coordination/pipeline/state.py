"""Where the training loop stands, persisted so a restart resumes instead of repeating.

The daemons are level-triggered: events only wake them; each one then reads this state and
does the step that belongs to the current stage. One generation moves through

    COLLECTING -> EXPORTED -> TRAINING -> TRAINED -> EVALUATED -> (decided) COLLECTING

and every transition is a pure function here, so "what happens after a crash at stage X" is
answered by reading this file, and tested without any daemon running. The file is replaced
atomically (temp, fsync, rename) so a kill leaves the old state or the new, never half.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from app.atomic_files import atomic_write_json
from app.coordination.pipeline.feedback_loops import Feedback
from app.db.stored_paths import from_stored, to_stored


class Stage(str, enum.Enum):
    COLLECTING = "collecting"  # self-play fills the DB until enough new games
    EXPORTED = "exported"  # a dataset for `generation` exists; training not yet started
    TRAINING = "training"  # a training run for `generation` is (or was) in flight
    TRAINED = "trained"  # a candidate exists; not yet evaluated
    EVALUATED = "evaluated"  # gauntlet results exist; promotion not yet decided


class PipelineStateError(RuntimeError):
    """A transition asked of the wrong stage, or an unreadable state file (named)."""


@dataclass(frozen=True)
class PipelineState:
    generation: int = 1  # the generation being produced (1 = the first trained model)
    stage: Stage = Stage.COLLECTING
    export_mark: int = 0  # replay-DB row id up to which games went into a dataset
    best_sha256: str | None = None
    best_path: str | None = None
    best_generation: int = 0
    # the model the next generation trains from when it is not the best (None: the best): a
    # candidate kept as the trainer's head (decided(head=True)); any change of the best clears it
    head_sha256: str | None = None
    head_path: str | None = None
    head_generation: int = 0
    dataset_dir: str | None = None
    dataset_sha256: str | None = None
    run_dir: str | None = None
    candidate_path: str | None = None
    candidate_sha256: str | None = None
    evaluation: dict = field(default_factory=dict)
    promoted: int = 0
    rejected: int = 0
    # the feedback loops' decisions and reasons (feedback_loops.Feedback.to_json), kept across
    # generations and restarts; {} until a loop decided something
    feedback: dict = field(default_factory=dict)

    @property
    def decided(self) -> int:
        """Generations that ended in a promotion or a rejection."""
        return self.promoted + self.rejected


def _expect(state: PipelineState, *stages: Stage) -> None:
    if state.stage not in stages:
        names = "/".join(s.value for s in stages)
        raise PipelineStateError(f"generation {state.generation} is {state.stage.value}, not {names}")


def should_export(state: PipelineState, newest_game_id: int, threshold: int) -> bool:
    """Enough games arrived since the last dataset to train a new generation."""
    return state.stage is Stage.COLLECTING and newest_game_id - state.export_mark >= threshold


def selfplay_workers(state: PipelineState, newest_game_id: int, threshold: int | None, workers: int,
                     collect_workers: int, clustered: bool) -> int:
    """How many self-play workers play the next batch. A lone node collecting games with its
    next export not yet due has nothing else to run, so it plays on `collect_workers`; once the
    export is due the next stages need a core, so the batch about to start stays on `workers`
    (it would still be playing when training starts). `threshold` None: not known yet."""
    if clustered or threshold is None or state.stage is not Stage.COLLECTING:
        return workers
    if should_export(state, newest_game_id, threshold):
        return workers
    return max(workers, collect_workers)


def adopt_generation(state: PipelineState, generation: int) -> PipelineState:
    """Clustered: the leader assigned `generation` to this node (other nodes may have trained
    the ones in between), so the local counter jumps to it."""
    _expect(state, Stage.COLLECTING)
    return replace(state, generation=generation)


def abandoned(state: PipelineState) -> PipelineState:
    """Clustered: the claim on this generation was lost (leader change, lapse, restart), so
    its work is dropped undecided; the leader schedules the generation again."""
    return replace(state, stage=Stage.COLLECTING, dataset_dir=None, dataset_sha256=None, run_dir=None,
                   candidate_path=None, candidate_sha256=None, evaluation={})


def exported(state: PipelineState, dataset_dir: str, dataset_sha256: str, newest_game_id: int) -> PipelineState:
    _expect(state, Stage.COLLECTING)
    return replace(state, stage=Stage.EXPORTED, dataset_dir=dataset_dir, dataset_sha256=dataset_sha256,
                   export_mark=newest_game_id)


def training_started(state: PipelineState, run_dir: str) -> PipelineState:
    """Also accepted in TRAINING: a restart resumes the same run dir (its checkpoint) rather
    than training the generation a second time."""
    _expect(state, Stage.EXPORTED, Stage.TRAINING)
    return replace(state, stage=Stage.TRAINING, run_dir=run_dir)


def trained(state: PipelineState, candidate_path: str, candidate_sha256: str) -> PipelineState:
    _expect(state, Stage.TRAINING)
    return replace(state, stage=Stage.TRAINED, candidate_path=candidate_path, candidate_sha256=candidate_sha256)


def training_failed(state: PipelineState) -> PipelineState:
    """Back to EXPORTED with no run dir: the next attempt starts the run afresh."""
    _expect(state, Stage.TRAINING)
    return replace(state, stage=Stage.EXPORTED, run_dir=None)


def evaluated(state: PipelineState, evaluation: dict) -> PipelineState:
    _expect(state, Stage.TRAINED)
    return replace(state, stage=Stage.EVALUATED, evaluation=evaluation)


def decided(state: PipelineState, promoted: bool, best_path: str | None = None,
            head_path: str | None = None) -> PipelineState:
    """Close the generation. A promoted candidate becomes the best; a rejected one kept as the
    trainer's head (`head_path`: where it is installed) is what the next generation trains from;
    otherwise the next trains from the best. Either way the next generation gets a new number,
    so no generation number is trained twice."""
    _expect(state, Stage.EVALUATED)
    base = replace(
        state, generation=state.generation + 1, stage=Stage.COLLECTING, dataset_dir=None,
        dataset_sha256=None, run_dir=None, candidate_path=None, candidate_sha256=None, evaluation={},
        head_sha256=None, head_path=None, head_generation=0,
    )
    if promoted:
        return replace(base, best_sha256=state.candidate_sha256, best_path=best_path or state.candidate_path,
                       best_generation=state.generation, promoted=state.promoted + 1)
    if head_path is not None:
        base = replace(base, head_sha256=state.candidate_sha256, head_path=head_path, head_generation=state.generation)
    return replace(base, rejected=state.rejected + 1)


def head_resolved(state: PipelineState, sha256: str | None, path: str | None, generation: int) -> PipelineState:
    """Clustered: the head the decided records name (generation_log.trainer_head), installed here,
    before this node trains the claimed generation (None: train from the best)."""
    _expect(state, Stage.EXPORTED, Stage.TRAINING)
    if sha256 is None or sha256 == state.best_sha256:
        return replace(state, head_sha256=None, head_path=None, head_generation=0)
    return replace(state, head_sha256=sha256, head_path=path, head_generation=generation)


def parent(state: PipelineState) -> tuple[str | None, str | None]:
    """(path, sha256) of the model the generation trains from: the head, else the best."""
    if state.head_path is not None:
        return state.head_path, state.head_sha256
    return state.best_path, state.best_sha256


def feedback_decided(state: PipelineState, feedback: dict) -> PipelineState:
    """A feedback loop decided (feedback_loops.py): its decision replaces the last. Any stage."""
    return replace(state, feedback=feedback)


def switched_best(state: PipelineState, sha256: str, path: str, generation: int) -> PipelineState:
    """Self-play now uses the model at `path` (the node's model store copy of the registry's
    current best; after a rollback that may be an older generation). Any stage. A new best
    clears the trainer's head: the next generation trains from the best."""
    head = {} if sha256 == state.best_sha256 else {"head_sha256": None, "head_path": None, "head_generation": 0}
    return replace(state, best_sha256=sha256, best_path=path, best_generation=generation, **head)


def to_json(state: PipelineState) -> dict:
    data = asdict(state)
    data["stage"] = state.stage.value
    return data


def from_json(data: dict) -> PipelineState:
    state = PipelineState(**{**data, "stage": Stage(data["stage"])})
    Feedback.from_json(state.feedback)  # a malformed decision is refused with the file, not met later
    return state


PATH_FIELDS = ("best_path", "head_path", "dataset_dir", "run_dir", "candidate_path")


class PipelineStateStore:
    """The state file of one node's pipeline. Paths in it are stored relative to the file's
    folder (the data dir), so the dir can move; a file written with absolute paths is read
    with them found again under this dir, and written relative at the next save."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> PipelineState:
        if not self.path.exists():
            return PipelineState()
        try:
            data = json.loads(self.path.read_text())
            for key in PATH_FIELDS:
                data[key] = from_stored(data.get(key), self.path.parent)
            return from_json(data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise PipelineStateError(f"{self.path}: unreadable pipeline state: {exc}") from None

    def save(self, state: PipelineState) -> None:
        data = to_json(state)
        for key in PATH_FIELDS:
            data[key] = to_stored(data[key], self.path.parent)
        atomic_write_json(self.path, data, indent=2)

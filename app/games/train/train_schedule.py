"""Pure decisions of a training run: data order, how a batch is split, when to stop.

They are functions of (seed, epoch, step, sizes) and nothing else, in particular not of the
number of processes. That is what lets a checkpoint written by 2 ranks continue on 1 rank
along exactly the same trajectory: every global batch is the same set of samples, split into
the same `micro_batches` slices (BatchNorm statistics are per slice), and each rank simply
takes a contiguous run of those slices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class ScheduleError(ValueError):
    """A batch/world-size combination that cannot be scheduled; says which numbers clash."""


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the n training samples in `epoch`; the same on every rank and every run."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def effective_batch(requested: int, n: int, micro_batches: int) -> int:
    """The global batch size actually used: at most the dataset, a multiple of the slices."""
    size = min(requested, n)
    size -= size % micro_batches
    if size <= 0:
        raise ScheduleError(f"{n} training samples cannot fill {micro_batches} micro-batches")
    return size


def steps_per_epoch(n: int, batch: int) -> int:
    return n // batch  # the ragged tail is dropped, so every step sees a full batch


def resolve_micro_batches(requested: int, world_size: int, previous: int | None = None) -> tuple[int, bool]:
    """(micro_batches, kept) for this run.

    A resumed run keeps the checkpoint's split when the new world size divides it (the
    trajectory then continues exactly); otherwise it must change the split (kept=False) and the
    caller says so. `requested` 0 means one slice per rank.
    """
    if previous:
        if previous % world_size == 0:
            return previous, True
        return world_size, False
    value = requested or world_size
    if value % world_size:
        raise ScheduleError(f"micro_batches={value} is not a multiple of the world size {world_size}")
    return value, True


def rank_slices(micro_batches: int, world_size: int, rank: int) -> range:
    """The micro-batch indices of one rank: a contiguous block, every index owned once."""
    if micro_batches % world_size or not 0 <= rank < world_size:
        raise ScheduleError(f"rank {rank} of {world_size} cannot split {micro_batches} micro-batches")
    per_rank = micro_batches // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def micro_batch_bounds(batch: int, micro_batches: int, index: int) -> tuple[int, int]:
    size = batch // micro_batches
    return index * size, (index + 1) * size


@dataclass(frozen=True)
class EarlyStop:
    """Holdout history as early stopping sees it."""

    best_loss: float = float("inf")
    best_step: int = -1
    evals_since_best: int = 0


def early_stop_update(state: EarlyStop, loss: float, step: int, patience: int, min_delta: float = 0.0) -> tuple[EarlyStop, bool, bool]:
    """(new state, improved, stop) after one holdout evaluation.

    An improvement must beat the best by more than `min_delta`; the run stops after
    `patience` evaluations in a row without one (patience 0 never stops early).
    """
    if loss < state.best_loss - min_delta:
        return EarlyStop(loss, step, 0), True, False
    since = state.evals_since_best + 1
    return EarlyStop(state.best_loss, state.best_step, since), False, patience > 0 and since >= patience


def calibration_indices(seed: int, n: int, count: int) -> np.ndarray:
    """Fixed training samples for BatchNorm recalibration: the same for every rank and step."""
    return np.random.default_rng([seed, 1 << 30]).permutation(n)[: min(count, n)]

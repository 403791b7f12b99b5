"""The step loop of one rank: data order, DDP gradient exchange, evaluation, resumable state.

World-size invariance (see app/games/train/train_schedule.py): a global batch is cut into
`micro_batches` fixed slices and each rank runs its own slices with gradient accumulation,
scaling each slice's loss by W/M so DDP's average over W ranks is exactly the mean over the
M slices. Scaling by a power of two is exact in floating point, so a run on 1 or 2 ranks
with the same M follows the same trajectory to the last bit on CPU.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from app.games.train.dataset import Arrays
from app.shared.process_group import DistContext
from app.games.train.train_schedule import (
    EarlyStop, calibration_indices, early_stop_update, effective_batch, epoch_permutation,
    micro_batch_bounds, rank_slices, steps_per_epoch,
)
from app.games.train.train_task import TrainTask, recalibrate_batchnorm

CALIBRATION_BATCH = 256
EVAL_CHUNK = 1024


def to_tensors(arrays: Arrays, device: torch.device) -> dict[str, torch.Tensor]:
    return {
        "planes": torch.from_numpy(arrays.planes).to(device),
        "policy": torch.from_numpy(arrays.policy).to(device),
        "value": torch.from_numpy(arrays.value).to(device),
    }


class Trainer:
    """One rank's share of a run. Every rank holds the whole (small) dataset and the whole model."""

    def __init__(
        self, ctx: DistContext, model: nn.Module, task: TrainTask, train: Arrays, holdout: Arrays, *,
        batch_size: int, micro_batches: int, lr: float, weight_decay: float, seed: int,
        calibration_samples: int = 2048,
    ) -> None:
        self.ctx = ctx
        self.model = model.to(ctx.device)
        self.task = task
        self.train_data = to_tensors(train, ctx.device)
        self.holdout_data = to_tensors(holdout, ctx.device) if ctx.is_main else None
        self.n_train = len(train)
        self.n_holdout = len(holdout)
        self.micro_batches = micro_batches
        self.batch_size = effective_batch(batch_size, self.n_train, micro_batches)
        self.steps_per_epoch = steps_per_epoch(self.n_train, self.batch_size)
        self.my_slices = rank_slices(micro_batches, ctx.world_size, ctx.rank)
        self.seed = seed
        self.calibration = calibration_indices(seed, self.n_train, calibration_samples)
        self.ddp = DDP(self.model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.step = 0
        self.early = EarlyStop()
        self.stopped_early = False
        self.best_state: dict[str, torch.Tensor] | None = None  # rank 0 only
        self._perm_epoch = -1
        self._perm: torch.Tensor | None = None
        self.step_seconds = 0.0

    # ---- data ------------------------------------------------------------------------------

    def position(self) -> tuple[int, int]:
        """(epoch, step within the epoch) of the next step: the data position."""
        return divmod(self.step, self.steps_per_epoch)

    def global_batch(self) -> torch.Tensor:
        epoch, k = self.position()
        if epoch != self._perm_epoch:
            perm = epoch_permutation(self.seed, epoch, self.n_train)
            self._perm = torch.from_numpy(perm).to(self.ctx.device)
            self._perm_epoch = epoch
        assert self._perm is not None
        return self._perm[k * self.batch_size:(k + 1) * self.batch_size]

    def _batch(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: tensor.index_select(0, idx) for name, tensor in self.train_data.items()}

    # ---- one optimizer step ----------------------------------------------------------------

    def train_step(self) -> torch.Tensor:
        """Run this rank's slices of the next global batch and step the optimizer.

        Returns this rank's sum of per-slice metric means (float64); the sum over ranks
        divided by `micro_batches` is the global batch's metric.
        """
        start = time.perf_counter()
        idx = self.global_batch()
        self.ddp.train()
        self.optimizer.zero_grad(set_to_none=True)
        scale = self.ctx.world_size / self.micro_batches
        sums = torch.zeros(len(self.task.metric_names), dtype=torch.float64, device=self.ctx.device)
        last = self.my_slices[-1]
        for i in self.my_slices:
            lo, hi = micro_batch_bounds(self.batch_size, self.micro_batches, i)
            sync = contextlib.nullcontext() if i == last else self.ddp.no_sync()
            with sync:
                loss, metrics = self.task.loss(self.ddp, self._batch(idx[lo:hi]))
                (loss * scale).backward()
            sums += metrics.to(torch.float64)
        self.optimizer.step()
        self.step += 1
        self.step_seconds += time.perf_counter() - start
        return sums

    def global_metrics(self, sums: torch.Tensor) -> dict[str, float]:
        """Collective: every rank must call it for the same step."""
        total = self.ctx.all_reduce_sum(sums.clone()) / self.micro_batches
        return dict(zip(self.task.metric_names, (float(x) for x in total.cpu())))

    # ---- evaluation --------------------------------------------------------------------------

    @torch.no_grad()
    def _holdout_loss(self) -> float | None:
        if not self.n_holdout or self.holdout_data is None:
            return None
        calib = torch.from_numpy(self.calibration).to(self.ctx.device)
        planes = self.train_data["planes"]
        recalibrate_batchnorm(self.model, [planes.index_select(0, calib[i:i + CALIBRATION_BATCH])
                                           for i in range(0, len(calib), CALIBRATION_BATCH)])
        self.model.eval()
        total = 0.0
        for lo in range(0, self.n_holdout, EVAL_CHUNK):
            chunk = {k: v[lo:lo + EVAL_CHUNK] for k, v in self.holdout_data.items()}
            loss, _ = self.task.loss(self.model, chunk)
            total += float(loss) * len(chunk["value"])
        self.model.train()
        return total / self.n_holdout

    def evaluate(self, patience: int, min_delta: float = 0.0) -> tuple[float | None, bool]:
        """Collective: (holdout loss, improved). Rank 0 evaluates and keeps the best weights;
        its verdict is broadcast so every rank stops at the same step."""
        verdict = None
        if self.ctx.is_main:
            loss = self._holdout_loss()
            improved = False
            if loss is not None:
                self.early, improved, stop = early_stop_update(self.early, loss, self.step, patience, min_delta)
                self.stopped_early = stop
                if improved:
                    self.best_state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
            verdict = (loss, improved, self.stopped_early, self.early)
        loss, improved, self.stopped_early, self.early = self.ctx.broadcast(verdict)
        return loss, improved

    def final_state(self) -> dict[str, torch.Tensor]:
        """Rank 0: the weights to publish: the best on holdout, else the last, with BN recalibrated."""
        if self.best_state is not None:
            return self.best_state
        calib = torch.from_numpy(self.calibration).to(self.ctx.device)
        planes = self.train_data["planes"]
        recalibrate_batchnorm(self.model, [planes.index_select(0, calib[i:i + CALIBRATION_BATCH])
                                           for i in range(0, len(calib), CALIBRATION_BATCH)])
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    # ---- resumable state ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        epoch, k = self.position()
        return {
            "model": {k2: v.detach().cpu() for k2, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "step": self.step, "epoch": epoch, "step_in_epoch": k,
            "batch_size": self.batch_size, "micro_batches": self.micro_batches, "seed": self.seed,
            "early_stop": {"best_loss": self.early.best_loss, "best_step": self.early.best_step,
                           "evals_since_best": self.early.evals_since_best},
            "stopped_early": self.stopped_early,
            "best_model": self.best_state,
            "world_size": self.ctx.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        es = state.get("early_stop") or {}
        self.early = EarlyStop(float(es.get("best_loss", float("inf"))), int(es.get("best_step", -1)),
                               int(es.get("evals_since_best", 0)))
        self.stopped_early = bool(state.get("stopped_early", False))
        self.best_state = state.get("best_model") if self.ctx.is_main else None


def set_global_seed(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))

"""Settings of the training pipeline: model size, search, self-play, export, training,
gauntlet and promotion gates. Read by app/games/search and app/games/train."""

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from app.config.base import StrictModel


# The defaults are `make run`'s: the settings that learned fastest per CPU-hour on 2 cores
# (docs/BENCHMARKS.md, "Learning against solved positions"); configs/gpu.yaml for a GPU node.


class ModelConfig(StrictModel):
    channels: int = 48
    blocks: int = 4


class SearchConfig(StrictModel):
    simulations: int = 64
    c_puct: float = 1.5
    dirichlet_alpha: float = 1.0
    dirichlet_fraction: float = 0.25
    temperature_moves: int = 10  # moves sampled at temperature 1, then greedy
    # A decided game is worth 1 - d * plies / max_plies (app/games/base.py `result_scale`) to
    # the search's terminal states and to the value targets, so a quicker win ranks above a
    # slower one and a later loss above an earlier one, as a solver scores them. 0 = +-1.
    # Measured in docs/BENCHMARKS.md ("A length discount", "A sharper discount"): 0.5 gained
    # +0.04-0.15 raw exact-move accuracy over 0 at equal CPU; 0.75 (a win on the last ply still
    # worth 0.25, clear of a draw) a further ~+0.02 over 0.5 and the 0.80 raw exact aim.
    length_discount: float = Field(0.75, ge=0.0, lt=1.0)
    # Each new node looked at one ply deep by the rules (app/games/search/search_kernel.py): a win on the
    # spot proves it, no safe move proves it lost, and only safe moves are searched otherwise.
    threat_check: bool = True
    # KataGo's forced playouts with policy target pruning, in searches with root noise
    # (self-play): a root move with noisy prior p gets at least sqrt(k * p * N) of N visits, and
    # the policy target gives them back (SearchForest.pruned_counts). k = 2 in KataGo; 0 = off.
    forced_playouts: float = Field(0.0, ge=0.0, le=16.0)


class SelfplayConfig(StrictModel):
    concurrent_games: int = 64
    workers: int = 1
    # Workers while a lone node only collects: no export, training or gauntlet of its own under
    # way, so the core the trainer uses the rest of the time plays too (the batch's games are
    # split among them). Never fewer than `workers`; 0 = `workers`. In a cluster a collecting
    # node may be training or judging for others, so there it is `workers` throughout.
    collect_workers: int = Field(2, ge=0)
    # Playout-cap randomisation (KataGo): a move gets the full search (search.simulations, root
    # noise, a policy target) with this probability, else a fast one of `fast_simulations`
    # (no noise, not a training sample). 1.0 = every move a full search (off).
    full_search_prob: float = Field(1.0, gt=0.0, le=1.0)
    fast_simulations: int = Field(8, ge=1)
    # Random openings: each game starts after k uniformly random moves, k uniform in
    # 0..random_opening_plies (0 = off, every game from the empty board). The random moves are
    # played, recorded and never sampled, so every training position is one the search played on
    # from; they widen coverage beyond the lines the network already likes (docs/BENCHMARKS.md).
    random_opening_plies: int = Field(10, ge=0, le=20)
    # Where a worker's network evaluates the search's leaves: "cpu", "cuda" (every worker shares
    # the node's first GPU; refused where there is none) or "auto" (the GPU when there is one).
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    # One network process for all of a node's self-play workers (app/games/search/network_server.py): each
    # worker's search sends its leaves there and the server evaluates every waiting request in
    # one batch, so one GPU is fed by all the cores (a GPU node's profile). Off: each worker
    # holds its own copy of the network (a CPU node, where a network process would take a core).
    shared_network: bool = False


class ExportConfig(StrictModel):
    window_games: int = 20000  # the newest games trained on (the cap, when the window grows)
    holdout_fraction: float = 0.05
    augment: bool = True
    # Value target = (1 - m) * game result + m * the search's root value (0 = the result only).
    value_target_mix: float = Field(0.25, ge=0.0, le=1.0)
    # A window that grows with the data (KataGo): all games up to `window_base_games`, then
    # base * (1 + beta * ((total / base) ** alpha - 1) / alpha), capped at window_games. 0 = off.
    window_base_games: int = Field(2000, ge=0)
    window_alpha: float = Field(0.75, gt=0.0, le=1.0)
    window_beta: float = Field(0.4, ge=0.0)


class TrainConfig(StrictModel):
    batch_size: int = 256  # global batch, split over all ranks
    lr: float = 2e-3
    weight_decay: float = 1e-4
    epochs: int = 4
    # Optimizer steps per generation at most (0: the epochs decide). Training continues from the
    # best's weights, so a cap keeps each generation's cost fixed while the window grows.
    max_steps: int = Field(400, ge=0)
    nproc: int = 0  # training processes per node; 0 = one per visible GPU, 1 without a GPU
    micro_batches: int = 0  # fixed split of each global batch (0 = one per rank); see app/games/train/train.py
    eval_every: int = 0  # steps between holdout evaluations (0 = once per epoch)
    patience: int = 3  # evaluations without holdout improvement before stopping early
    checkpoint_every: int = 0  # steps between checkpoints (0 = at each evaluation)
    seed: int = 0
    # Spanning one generation's training over several nodes (app/coordination/pipeline/train_join.py).
    # The train options above must match on every node: each rank derives its schedule from them.
    max_nodes: int = 4  # most nodes one generation's training spans
    span_cpu_nodes: bool = False  # CPU-only nodes span too (tests, demos); else only GPU nodes do
    join_timeout_s: float = 120.0  # the claimant waits this long for joiners, then trains alone


class GauntletConfig(StrictModel):
    games_vs_baseline: int = 40
    max_games_vs_best: int = 20  # the SPRT's game cap (with the SPRT as a gate, ~200 decide an Elo-35 step)
    sprt_elo0: float = 0.0  # H0: the candidate is no better than this (Elo vs the best)
    sprt_elo1: float = 35.0  # H1: the candidate is at least this much better
    sprt_alpha: float = 0.05  # P(accept | H0)
    sprt_beta: float = 0.05  # P(reject | H1)
    opening_plies_min: int = 2  # each game pair starts from a distinct random opening
    opening_plies_max: int = 4
    heuristic_depth: int = 2  # negamax plies of the heuristic baseline
    # The fixed anchor: every generation's gauntlet plays it a few games, so every generation
    # is rated against the same reference, pinned at Elo 0 (app/games/train/gauntlet_baselines.py).
    # A baseline spec: heuristic[:depth] (any game: the game's own or the generic search),
    # rollout[:simulations] or random; None turns the games off (Elo falls back to random,
    # else to the first generation). games_vs_anchor: its games per generation, whole pairs
    # (docs/benchmarks/gauntlet.md measures what they cost).
    anchor: str | None = "heuristic"
    games_vs_anchor: int = Field(4, ge=0)
    rollout_simulations: int = 200  # MCTS-with-random-rollouts baseline
    net_simulations: int = 32  # MCTS simulations of network players (0 = policy argmax)
    workers: int = 1  # worker processes playing games in parallel
    # Where the network players' networks run: "cpu", "cuda" (the node's first GPU, shared by
    # every worker; refused where there is none) or "auto" (the GPU when there is one). A worker
    # plays its games in lock step (app/games/train/match_games.py), so a GPU sees batches of games.
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    # In a cluster the baseline games are cut into shards other nodes play (app/coordination/pipeline/gauntlet_spread.py).
    shard_games: int = 10  # games per shard (rounded up to even: whole opening pairs)
    shard_wait_s: float = 120.0  # then the claimant plays the shards still missing itself
    # Solver-scored positions (Connect Four: move_scores.txt) on which every promoted model's raw
    # network is scored after its promotion, off the hot path, for /progress and the dashboard
    # (app/coordination/pipeline/strength_watch.py). None: the shared benchmark beside the
    # repository (../shared/benchmarks/connect4/move_scores.txt). A missing file turns it off.
    solved_positions: Path | None = None

    @field_validator("anchor")
    @classmethod
    def _anchor_is_a_baseline(cls, value: str | None) -> str | None:
        """A fixed player, never a model: the reference must not change between generations."""
        if value is not None and not re.fullmatch(r"random|heuristic(:[1-9]\d*)?|rollout(:[1-9]\d*)?", value):
            raise ValueError(f"anchor {value!r}: use random, heuristic[:depth] or rollout[:simulations] (or null: off)")
        return value


class PromotionConfig(StrictModel):
    # By default every candidate is promoted (AlphaZero, KataGo): training continues from the
    # best's weights, and on 2 cores a gate threw away more progress than it caught regressions.
    # The gauntlet still plays the best and records the result (the regression guard an operator
    # reads on /progress). Set the thresholds and the SPRT to gate again.
    min_score_vs_random: float | None = None  # None disables the gate
    min_score_vs_heuristic: float | None = None
    require_sprt_vs_best: bool = False  # the SPRT vs the current best must accept
    # A candidate the SPRT accepts as stronger than the current best is promoted even if it
    # misses a baseline threshold (the miss is reported): the gates must not throw progress away.
    # False: every baseline threshold also blocks a candidate that beat the best.
    sprt_overrides_baselines: bool = True
    # The first network learns from uniform-prior self-play and cannot yet be expected to hold
    # the heuristic; the heuristic gate applies from this generation on.
    heuristic_gate_from_generation: int = 2


class QualityLoopConfig(StrictModel):
    """quality -> training (app/coordination/pipeline/feedback_loops.py): each export scores its
    games (duplicate share, decisive share, policy-target entropy; one number in [0, 1]); a
    score under `low` makes the next training step gentler (learning rate times `step`, or the
    batch divided by it), one at or above `high` steps it back toward the configured value.
    Between the two nothing moves (hysteresis). Off by default: docs/benchmarks/loops.md."""

    enabled: bool = False
    knob: Literal["lr", "batch_size"] = "lr"  # what a step moves: train.lr down, or train.batch_size up
    # untrained self-play scores ~0.86 (configs/bench_loops.yaml: no duplicates, 0.91 decisive,
    # entropy 0.66); the band sits where a collapsing search or a run of draws takes it
    low: float = Field(0.78, ge=0.0, le=1.0)
    high: float = Field(0.84, ge=0.0, le=1.0)
    step: float = Field(0.7, gt=0.0, lt=1.0)  # the scale's factor per step
    min_scale: float = Field(0.25, gt=0.0, le=1.0)  # lr * scale >= lr * min_scale; batch <= batch / min_scale

    @model_validator(mode="after")
    def _band(self) -> "QualityLoopConfig":
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class PlateauLoopConfig(StrictModel):
    """loss plateau -> exploration (app/coordination/pipeline/feedback_loops.py): after
    `generations` decided generations whose final training losses lie within `tolerance`
    (relative spread), self-play's root noise share (search.dirichlet_fraction) rises by `step`,
    at most to `max_fraction`; an improvement (a loss below the window's best by more than the
    tolerance, or a promotion scoring `improve_score` against the best) lowers it by `step`,
    never below search.dirichlet_fraction. Off by default: docs/benchmarks/loops.md."""

    enabled: bool = False
    generations: int = Field(3, ge=2, le=20)
    tolerance: float = Field(0.02, ge=0.0, le=1.0)
    step: float = Field(0.1, gt=0.0, le=1.0)
    max_fraction: float = Field(0.5, gt=0.0, le=1.0)
    improve_score: float = Field(0.55, ge=0.5, le=1.0)


class FeedbackConfig(StrictModel):
    """The feedback loops a lineage runs on itself (issue 52 part B); each on or off alone."""

    quality: QualityLoopConfig = QualityLoopConfig()
    plateau: PlateauLoopConfig = PlateauLoopConfig()

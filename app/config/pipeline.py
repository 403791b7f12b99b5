"""Settings of the training pipeline: model size, search, self-play, export, training,
gauntlet and promotion gates. Read by app/ai and app/training."""

from app.config.base import StrictModel


class ModelConfig(StrictModel):
    channels: int = 64
    blocks: int = 5


class SearchConfig(StrictModel):
    simulations: int = 64
    c_puct: float = 1.5
    dirichlet_alpha: float = 1.0
    dirichlet_fraction: float = 0.25
    temperature_moves: int = 10  # moves sampled at temperature 1, then greedy


class SelfplayConfig(StrictModel):
    concurrent_games: int = 64
    workers: int = 1


class ExportConfig(StrictModel):
    window_games: int = 20000
    holdout_fraction: float = 0.05
    augment: bool = True


class TrainConfig(StrictModel):
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-4
    epochs: int = 4
    nproc: int = 1


class GauntletConfig(StrictModel):
    games_vs_baseline: int = 40
    max_games_vs_best: int = 200


class PromotionConfig(StrictModel):
    min_score_vs_random: float = 0.95
    min_score_vs_heuristic: float = 0.5

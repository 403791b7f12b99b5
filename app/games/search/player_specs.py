"""What names a player: the picklable `PlayerSpec` a worker process turns into a player
(`players.make_player`), the text forms a user or a config gives, and a network player's
identity in games and ratings. Kept apart from the players themselves so that the
coordination layer, which only reads and compares these names, loads no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.config.pipeline import GauntletConfig, SearchConfig
from app.games import DEFAULT_GAME
from app.games.search.model_meta import read_meta

RANDOM_NAME = "random"  # the uniform player: the rating anchor (Elo 0)


class PlayerSpecError(ValueError):
    """A player description that names no known kind of player, or a missing model."""


def model_player_name(sha256: str, simulations: int) -> str:
    """A network player's identity in games and ratings: the model and its search budget."""
    return f"model:{sha256}:s{simulations}"


def model_sha_of_player(name: str) -> str | None:
    """The sha256 in a network player's name, None for baselines."""
    if not name.startswith("model:"):
        return None
    return name.split(":")[1]


@dataclass(frozen=True)
class PlayerSpec:
    """Picklable description of a player; `make_player` builds it inside a worker process."""

    kind: str  # random | heuristic | rollout | net
    depth: int = 2
    simulations: int = 0
    model_path: str | None = None
    sha256: str | None = None
    c_puct: float = 1.5
    game: str = DEFAULT_GAME
    device: str = "cpu"  # where a net player's network runs ("cpu" or "cuda"); not part of its name

    @property
    def name(self) -> str:
        if self.kind == "random":
            return RANDOM_NAME
        if self.kind == "heuristic":
            return f"heuristic-d{self.depth}"
        if self.kind == "rollout":
            return f"rollout-s{self.simulations}"
        return model_player_name(str(self.sha256), self.simulations)


def net_spec(model_path: str | Path, simulations: int, c_puct: float = 1.5) -> PlayerSpec:
    """A network player's spec, its sha256 and game read from the model's sidecar."""
    path = Path(model_path)
    if not path.exists():
        raise PlayerSpecError(f"{path}: model file not found")
    meta = read_meta(path)
    return PlayerSpec("net", simulations=simulations, model_path=str(path), sha256=meta.sha256,
                      c_puct=c_puct, game=meta.game)


def parse_player_spec(text: str, cfg: GauntletConfig | None = None, search: SearchConfig | None = None,
                      game: str = DEFAULT_GAME) -> PlayerSpec:
    """'random', 'heuristic[:depth]', 'rollout[:simulations]', or a model path (.safetensors)."""
    cfg = cfg or GauntletConfig()
    c_puct = (search or SearchConfig()).c_puct
    kind, _, arg = text.strip().partition(":")
    try:
        if kind == "random":
            return PlayerSpec("random", game=game)
        if kind == "heuristic":
            return PlayerSpec("heuristic", depth=int(arg) if arg else cfg.heuristic_depth, game=game)
        if kind == "rollout":
            sims = int(arg) if arg else cfg.rollout_simulations
            return PlayerSpec("rollout", simulations=sims, c_puct=c_puct, game=game)
    except ValueError:
        raise PlayerSpecError(f"player {text!r}: {arg!r} is not an integer") from None
    if text.endswith(".safetensors"):
        return net_spec(text, cfg.net_simulations, c_puct)
    raise PlayerSpecError(
        f"unknown player {text!r}: use random, heuristic[:depth], rollout[:simulations] or a .safetensors model path")

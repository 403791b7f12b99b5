"""A model's sidecar: what the `<stem>.json` beside its weights says (architecture, game,
generation, lineage, the weights' sha256) and how it is read. Kept apart from the network so
that a node that only moves, checks or lists model files (sync, registry) loads no torch.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SIDECAR_FORMAT = 1


class ModelFormatError(ValueError):
    """A model file that is missing, corrupt, or not what the caller expects; names the path."""


@dataclass(frozen=True)
class Architecture:
    channels: int
    blocks: int
    plane_shape: tuple[int, int, int]
    num_actions: int
    kind: str = "resnet"
    value_size: int = 1  # value outputs: 1 (the mover's, two-player zero-sum) or N (Game.value_size)

    @staticmethod
    def for_game(game, channels: int, blocks: int) -> "Architecture":
        """The net's sizes from the game: planes, board, policy and value outputs."""
        return Architecture(channels, blocks, tuple(game.plane_shape), int(game.num_actions),
                            value_size=int(game.value_size))

    @staticmethod
    def from_dict(data: dict) -> "Architecture":
        return Architecture(
            channels=int(data["channels"]),
            blocks=int(data["blocks"]),
            plane_shape=tuple(int(x) for x in data["plane_shape"]),  # type: ignore[arg-type]
            num_actions=int(data["num_actions"]),
            kind=str(data.get("kind", "resnet")),
            value_size=int(data.get("value_size", 1)),
        )


@dataclass(frozen=True)
class ModelMeta:
    """What the sidecar records; `sha256` is filled in by `save_model`."""

    architecture: Architecture
    game: str
    generation: int = 0
    parent_sha256: str | None = None
    dataset_sha256: str | None = None
    created_at: float = field(default_factory=time.time)
    sha256: str | None = None

    def to_json(self) -> dict:
        data = asdict(self)
        data["architecture"]["plane_shape"] = list(self.architecture.plane_shape)
        if self.architecture.value_size == 1:  # a one-value net's sidecar reads as it always did
            del data["architecture"]["value_size"]
        data["format"] = SIDECAR_FORMAT
        return data


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sidecar_path(weights_path: str | Path) -> Path:
    return Path(weights_path).with_suffix(".json")


def read_meta(path: str | Path) -> ModelMeta:
    """The sidecar of a weights file, validated; raises ModelFormatError naming the file."""
    side = sidecar_path(path)
    try:
        data = json.loads(side.read_text())
        arch = Architecture.from_dict(data["architecture"])
        return ModelMeta(
            architecture=arch,
            game=str(data["game"]),
            generation=int(data["generation"]),
            parent_sha256=data.get("parent_sha256"),
            dataset_sha256=data.get("dataset_sha256"),
            created_at=float(data.get("created_at", 0.0)),
            sha256=str(data["sha256"]),
        )
    except FileNotFoundError:
        raise ModelFormatError(f"{side}: sidecar missing for model {path}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFormatError(f"{side}: unreadable sidecar: {exc}") from None

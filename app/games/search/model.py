"""The policy/value network and its on-disk form.

A model is two files: `<stem>.safetensors` (weights only, so loading never runs code) and
`<stem>.json`, a sidecar naming the architecture, game, generation, parent and dataset, and
the sha256 of the weights file. The sha256 is the model's identity across the mesh: the
registry, promotion and distribution all refer to a model by it, so loading re-checks it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from app.atomic_files import atomic_write_json, replace_durably, temp_sibling

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


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class PolicyValueNet(nn.Module):
    """AlphaZero's residual tower: policy logits over actions and a tanh value for the side to
    move (value_size 1), or one per seat from the mover on (value_size N: entry k for seat
    (to_move + k) % N)."""

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.arch = arch
        c_in, height, width = arch.plane_shape
        ch = arch.channels
        self.stem = nn.Sequential(
            nn.Conv2d(c_in, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch), nn.ReLU()
        )
        self.tower = nn.Sequential(*[ResidualBlock(ch) for _ in range(arch.blocks)])
        self.policy_head = nn.Sequential(
            nn.Conv2d(ch, 2, 1, bias=False), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(),
            nn.Linear(2 * height * width, arch.num_actions),
        )
        self.value_head = nn.Sequential(
            nn.Conv2d(ch, 1, 1, bias=False), nn.BatchNorm2d(1), nn.ReLU(), nn.Flatten(),
            nn.Linear(height * width, ch), nn.ReLU(), nn.Linear(ch, arch.value_size), nn.Tanh(),
        )

        # Channels-last weights and inputs take oneDNN's NHWC convolutions on CPU: on one thread
        # for the 48x4 net, ~1.25x the positions per second in self-play (batch 64) and ~1.2x the
        # training samples per second (batch 256) of the default layout (docs/BENCHMARKS.md).
        # Weights in the same layout as their gradients keep DDP's buckets free of copies;
        # `save_model` writes them contiguous, so model files do not change.
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.tower(self.stem(x.contiguous(memory_format=torch.channels_last)))
        value = self.value_head(h)
        return self.policy_head(h), value.squeeze(-1) if self.arch.value_size == 1 else value


def new_model(arch: Architecture, seed: int | None = None) -> PolicyValueNet:
    """A freshly initialised network; `seed` makes the weights reproducible."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return PolicyValueNet(arch)
    return PolicyValueNet(arch)


@torch.inference_mode()
def predict(net: PolicyValueNet, planes: np.ndarray, legal: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Batched inference: (N, *plane_shape) planes -> (N, A) probabilities and (N,) values
    ((N, value_size) for a net with several value outputs).

    Illegal actions get probability zero when `legal` (N, A bool) is given. A network on a GPU
    gets its input moved there and its answers back; on the CPU nothing is copied.
    """
    net.eval()
    device = next(net.parameters()).device
    x = torch.from_numpy(np.ascontiguousarray(planes, dtype=np.float32)).to(device, non_blocking=True)
    logits, values = net(x)
    if legal is not None:
        logits = logits.masked_fill(~torch.from_numpy(legal).to(device), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return probs.float().cpu().numpy(), values.float().cpu().numpy()


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sidecar_path(weights_path: str | Path) -> Path:
    return Path(weights_path).with_suffix(".json")


def save_model(net: nn.Module, meta: ModelMeta, path: str | Path) -> ModelMeta:
    """Write weights then sidecar, each atomically; returns the meta with its sha256.

    The weights file is renamed into place before the sidecar, so a sidecar never names a
    file that is not complete; a crash in between leaves weights without a sidecar, which
    `load_model` refuses.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ModelFormatError(f"{path}: model files end in .safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    module = net.module if hasattr(net, "module") else net  # unwrap DDP
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    tmp = temp_sibling(path)
    save_file(state, str(tmp))
    replace_durably(tmp, path)
    meta = ModelMeta(**{**meta.__dict__, "sha256": file_sha256(path)})
    atomic_write_json(sidecar_path(path), meta.to_json(), indent=2)
    return meta


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


def load_model(
    path: str | Path,
    expect_game: str | None = None,
    expect_arch: Architecture | None = None,
    expect_sha256: str | None = None,
) -> tuple[PolicyValueNet, ModelMeta]:
    """Load and verify a model; every mismatch is a ModelFormatError naming the path."""
    path = Path(path)
    if not path.exists():
        raise ModelFormatError(f"{path}: model file not found")
    meta = read_meta(path)
    actual = file_sha256(path)
    if actual != meta.sha256:
        raise ModelFormatError(f"{path}: sha256 {actual[:12]} does not match its sidecar ({meta.sha256[:12]}): file corrupt or replaced")
    if expect_sha256 is not None and actual != expect_sha256:
        raise ModelFormatError(f"{path}: sha256 {actual[:12]} is not the expected {expect_sha256[:12]}")
    if expect_game is not None and meta.game != expect_game:
        raise ModelFormatError(f"{path}: model is for game {meta.game!r}, expected {expect_game!r}")
    if expect_arch is not None and meta.architecture != expect_arch:
        raise ModelFormatError(f"{path}: architecture {meta.architecture} differs from expected {expect_arch}")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ModelFormatError(f"{path}: unreadable safetensors: {exc}") from None
    net = PolicyValueNet(meta.architecture)
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelFormatError(f"{path}: weights do not fit the sidecar's architecture: {exc}") from None
    net.eval()
    return net, meta

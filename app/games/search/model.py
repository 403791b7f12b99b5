"""The policy/value network and its on-disk form.

A model is two files: `<stem>.safetensors` (weights only, so loading never runs code) and
`<stem>.json`, a sidecar naming the architecture, game, generation, parent and dataset, and
the sha256 of the weights file. The sha256 is the model's identity across the mesh: the
registry, promotion and distribution all refer to a model by it, so loading re-checks it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from app.atomic_files import atomic_write_json, replace_durably, temp_sibling
from app.games.search.model_meta import (  # noqa: F401 - the sidecar's names, as this module always offered them
    SIDECAR_FORMAT, Architecture, ModelFormatError, ModelMeta, file_sha256, read_meta, sidecar_path,
)


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

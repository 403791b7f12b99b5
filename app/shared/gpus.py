"""How many GPUs this process can use, without loading torch where there can be none.

A node reports its GPUs in its capabilities when it starts; torch takes ~2 CPU seconds to
import, and most nodes (every one on a CPU-only machine) never need it in the node process.
Without a GPU driver (no /proc/driver/nvidia, /dev/nvidiactl or ROCm's /dev/kfd) no CUDA
device can be visible, so the answer is 0 at once; otherwise torch is asked.
"""

from __future__ import annotations

from pathlib import Path

DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")


def visible_gpus() -> int:
    """CUDA devices this process can use (0 on a machine without a GPU driver or a CPU-only build)."""
    if not any(Path(p).exists() for p in DRIVER_PATHS):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0

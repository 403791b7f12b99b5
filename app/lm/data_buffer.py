"""The order in which prompts (or demonstrations) are used: a pure function of (seed, epoch).

Epoch e visits the items in the permutation `Random(seed + e).shuffle(range(n))` of their
ORIGINAL order, never of the previous epoch's, so the order of any epoch can be recomputed
from two integers. The whole state is (seed, epoch, position): a buffer saved at any point
and restored continues with exactly the items the uninterrupted buffer would have given.
The caller's list is copied, never shuffled in place.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    order = list(range(size))
    random.Random(seed + epoch).shuffle(order)
    return order


class DataBuffer(Generic[T]):
    def __init__(self, items: Sequence[T], seed: int) -> None:
        if len(items) == 0:
            raise ValueError("a DataBuffer needs at least one item")
        self._items: tuple[T, ...] = tuple(items)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0
        self._order = epoch_order(len(self._items), self.seed, 0)

    def __len__(self) -> int:
        return len(self._items)

    def next_batch(self, n: int) -> list[T]:
        """The next `n` items; an epoch boundary inside the batch moves on to the next epoch's order."""
        if n < 0:
            raise ValueError(f"batch size must not be negative, got {n}")
        out: list[T] = []
        while len(out) < n:
            if self.position == len(self._items):
                self.epoch += 1
                self.position = 0
                self._order = epoch_order(len(self._items), self.seed, self.epoch)
            take = min(n - len(out), len(self._items) - self.position)
            out.extend(self._items[i] for i in self._order[self.position:self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "size": len(self._items)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`; refuses a state of a buffer over other data or another seed."""
        if int(state["size"]) != len(self._items):
            raise ValueError(f"buffer state is for {state['size']} items, this buffer has {len(self._items)}")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"buffer state has seed {state['seed']}, this buffer {self.seed}")
        position = int(state["position"])
        if not 0 <= position <= len(self._items):
            raise ValueError(f"buffer position {position} is outside 0..{len(self._items)}")
        self.epoch = int(state["epoch"])
        self.position = position
        self._order = epoch_order(len(self._items), self.seed, self.epoch)

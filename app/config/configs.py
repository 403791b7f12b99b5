"""Several configs on one cluster (`configs:`): each a lineage of its own, a game's or (`workload:
lm`) a language model's.

A config names a game with its variant (`connect4_6x5`, `othello`, a user's `pkg.mod:Class`),
the sections where it differs from the node's (model, search, self-play, export, training,
gauntlet, promotion) and an operator weight for the scheduler across configs. Without
`configs:` a node runs one lineage of `node.game`, exactly as before.

Each lineage is the one-lineage machinery run once per config, namespaced by where it lives:
the first config keeps the node's data dir and mesh port (so the default lineage's files,
work item keys and decision keys are today's), every other config `configs/<name>/` under
the data dir and the mesh port plus its `port_offset` (every node's peers shifted by the same
offset). So games, datasets, claims, candidates, gauntlets, decisions, rollbacks, models,
registry rows and replication of one config never meet another's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from app.config.base import StrictModel
from app.config.lm import SHARED_TRAIN_KEYS

CONFIG_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
OVERRIDABLE = ("model", "search", "selfplay", "export", "train", "gauntlet", "promotion")
LINEAGE_SETTINGS_FILE = "lineage_config.yaml"  # a lineage's effective settings, for its torchrun
DEFAULT_PORT_STEP = 100
LM_TRAIN_KEYS = SHARED_TRAIN_KEYS  # train keys an lm config may set: placement, shared by both trainers


class ConfigRequires(StrictModel):
    """What a node must offer to train this config (its training claims carry it: a node whose
    gossiped capabilities do not fit never claims them; app/coordination/p2p/work_rules.fits)."""

    needs_gpu: bool = False
    min_memory_gb: float = Field(0.0, ge=0.0, le=100_000.0)
    min_cpus: int = Field(0, ge=0, le=100_000)

    def work_requirements(self) -> dict[str, Any]:
        """The work item's requirements: only what is asked for."""
        return {k: v for k, v in self.model_dump().items() if v}


class ConfigEntry(StrictModel):
    """One config of the cluster; every node lists the same configs in the same order. A game
    config names its `game`; `workload: lm` makes a language-model lineage beside the games
    (its settings in `lm:`, as an lm node's `lm:` section; no game sections, no `game`)."""

    name: str
    workload: Literal["connect4", "lm"] = "connect4"
    game: str | None = Field(None, min_length=1, max_length=200)
    weight: float = Field(1.0, gt=0.0, le=100.0)  # the operator's weight in the scheduler across configs
    port_offset: int | None = Field(None, ge=1, le=20000)  # None: DEFAULT_PORT_STEP x its index
    requires: ConfigRequires = ConfigRequires()  # each node trains the configs its capabilities allow
    model: dict[str, Any] = {}
    search: dict[str, Any] = {}
    selfplay: dict[str, Any] = {}
    export: dict[str, Any] = {}
    train: dict[str, Any] = {}
    gauntlet: dict[str, Any] = {}
    promotion: dict[str, Any] = {}
    lm: dict[str, Any] = {}

    @model_validator(mode="after")
    def _one_workload(self) -> "ConfigEntry":
        if self.workload == "lm":
            given = [k for k in (*OVERRIDABLE, "game") if getattr(self, k) not in ({}, None)]
            train_only = sorted(set(self.train) - LM_TRAIN_KEYS)
            if given != ["train"] * bool(self.train) or train_only:
                raise ValueError(f"config {self.name}: an lm config takes lm: (and train: {sorted(LM_TRAIN_KEYS)}), "
                                 f"not {[k for k in given if k != 'train'] + [f'train.{k}' for k in train_only]}")
        else:
            if self.game is None:
                raise ValueError(f"config {self.name}: a game config needs `game` (or workload: lm)")
            if self.lm:
                raise ValueError(f"config {self.name}: lm: is for an lm config (workload: lm)")
        return self

    @property
    def label(self) -> str:
        """What it plays: the game, or `lm`."""
        return self.game if self.game is not None else "lm"

    @field_validator("name")
    @classmethod
    def _slug(cls, name: str) -> str:
        if not CONFIG_NAME.match(name):
            raise ValueError(f"config name {name!r}: lower-case letters, digits, '_' or '-', at most 32")
        return name


def check_configs(entries: list[ConfigEntry]) -> None:
    """Names and ports unique; the first config keeps the node's own port (offset 0)."""
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"configs: names must be unique, got {names}")
    if entries and entries[0].port_offset is not None:
        raise ValueError(f"configs[0] ({entries[0].name}): the first config keeps the node's mesh port; "
                         "port_offset is for the others")
    offsets = [port_offset(entries, i) for i in range(len(entries))]
    if len(set(offsets)) != len(offsets):
        raise ValueError(f"configs: port offsets must be unique, got {offsets}")


def port_offset(entries: list[ConfigEntry], index: int) -> int:
    entry = entries[index]
    return 0 if index == 0 else (entry.port_offset if entry.port_offset is not None else DEFAULT_PORT_STEP * index)


def lineage_dir(data_dir: Path, entries: list[ConfigEntry], index: int) -> Path:
    """The first config's lineage lives in the data dir itself (today's layout); another's in
    `configs/<name>/` under it."""
    return data_dir if index == 0 else data_dir / "configs" / entries[index].name


def shift_peer(peer: str, offset: int) -> str:
    """'host:port' or 'id@host:port' with the port moved by `offset` (the same config's mesh
    on that peer)."""
    head, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"mesh.peers: {peer!r} is not host:port")
    return f"{head}:{int(port) + offset}"


def section_with(section: StrictModel, overrides: dict[str, Any], where: str) -> StrictModel:
    """`section` with a config's overrides applied and validated (an unknown key names the config)."""
    if not overrides:
        return section
    unknown = sorted(set(overrides) - set(type(section).model_fields))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}")
    return type(section).model_validate({**section.model_dump(), **overrides})


def lineage_settings(settings: Any) -> list[tuple[ConfigEntry, Any]]:
    """(config, the node's settings for that config's lineage) per config, in order. Without
    `configs:` one lineage: `node.game` under its own name, the settings unchanged."""
    entries: list[ConfigEntry] = list(settings.configs)
    if not entries:
        return [(ConfigEntry(name=default_config_name(settings.node.game), game=settings.node.game), settings)]
    out = []
    for index, entry in enumerate(entries):
        offset = port_offset(entries, index)
        sections: dict[str, Any] = {name: section_with(getattr(settings, name), getattr(entry, name),
                                                       f"configs[{index}].{name}") for name in OVERRIDABLE}
        if entry.workload == "lm":  # its own lm section (a node's lm: is refused on a game node)
            sections.update(workload="lm", lm=type(settings.lm).model_validate(entry.lm))
        node = settings.node.model_copy(update={
            "game": entry.game or settings.node.game, "data_dir": lineage_dir(Path(settings.node.data_dir), entries, index),
            # port 0 (any free port: a lone node, a benchmark) stays 0 for every config
            "mesh_port": settings.node.mesh_port + offset if settings.node.mesh_port else 0})
        mesh = settings.mesh.model_copy(update={"peers": [shift_peer(p, offset) for p in settings.mesh.peers]})
        out.append((entry, settings.model_copy(update={**sections, "node": node, "mesh": mesh})))
    return out


def default_config_name(game: str) -> str:
    """A config name for a game name ('connect4', 'pkg.mod:Class' -> 'class')."""
    tail = re.sub(r"[^a-z0-9_-]+", "_", game.rsplit(":", 1)[-1].rsplit(".", 1)[-1].lower()).strip("_-")
    return (tail or "game")[:32]


class SchedulerConfig(StrictModel):
    """The scheduler across configs (app/coordination/pipeline/config_scheduler.py); acts only
    with two or more configs. Each of its three loops has its setting here."""

    floor: float = Field(0.05, ge=0.0, le=0.5)  # every config's least share (epsilon)
    progress_window: int = Field(4, ge=2, le=64)  # Elo -> self-play: the last K evaluations' slope
    progress: bool = True  # Elo -> self-play on; off: shares by weight and staleness only
    staleness_weight: float = Field(0.2, ge=0.0, le=1.0)  # the staleness share's part of the rest
    regression_margin_elo: float = Field(30.0, gt=0.0)  # regression -> curriculum: Elo below its peak
    regression_boost: float = Field(2.0, ge=1.0, le=10.0)  # a regressing config's share multiplied (1: off)
    rebalance_on_promotion: bool = True  # promotion -> rebalance at once; off: every interval_s only
    interval_s: float = Field(30.0, gt=0.0, le=3600.0)  # recomputed at least this often
    min_change: float = Field(0.02, ge=0.0, le=1.0)  # a share moved this much is an ALLOCATION_CHANGED event

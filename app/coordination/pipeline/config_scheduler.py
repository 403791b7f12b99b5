"""Which config gets the compute: shares per config, a pure function of recorded history.

Per config: its learning progress (the |slope| of its best model's Elo against the fixed
anchor per CPU-hour over the last K evaluations: the absolute value, so a config whose Elo
moves either way is picked again), a staleness share (hours since its last decided
generation, as prioritized level replay's staleness keeps every level visited), the
operator's weight, and a regression boost (a config whose Elo fell more than a margin below
its peak is boosted until it is back within the margin). Every config keeps at least the floor
epsilon. A config with too few evaluations to have a slope is credited with the largest slope
measured (optimism about the unexplored, as teacher-student curricula start every task).

share_c = floor + (1 - n * floor) * raw_c / sum(raw),
raw_c   = weight_c * boost_c * ((1 - s) * progress_c / sum(progress) + s * stale_c / sum(stale))

with s the staleness weight; a term whose sum is zero is uniform. Self-play turns and training
claims on a node follow the shares (app/coordination/pipeline/lineage_gate.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app.config.configs import SchedulerConfig


@dataclass(frozen=True)
class Evaluation:
    """One decided generation of a config: its best model's Elo then (vs the fixed anchor),
    and the CPU-hours that config had used by then."""

    cpu_hours: float
    elo: float


@dataclass(frozen=True)
class ConfigHistory:
    name: str
    weight: float = 1.0
    evaluations: tuple[Evaluation, ...] = ()
    stale_hours: float = 0.0  # since its last decided generation (or since the node started)


@dataclass(frozen=True)
class Allocation:
    shares: dict[str, float]
    reasons: dict[str, str]
    progress: dict[str, float | None] = field(default_factory=dict)  # Elo per CPU-hour (None: not measured)
    regressing: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"shares": {k: round(v, 4) for k, v in self.shares.items()}, "reasons": dict(self.reasons),
                "progress": {k: (None if v is None else round(v, 2)) for k, v in self.progress.items()},
                "regressing": list(self.regressing)}


def elo_slope(evaluations: Sequence[Evaluation], window: int) -> float | None:
    """|least-squares slope| of Elo over CPU-hours in the last `window` evaluations; None with
    fewer than two or no spread of CPU."""
    last = list(evaluations)[-window:]
    if len(last) < 2:
        return None
    xs = [e.cpu_hours for e in last]
    ys = [e.elo for e in last]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var <= 1e-12:
        return None
    return abs(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var)


def regression(evaluations: Sequence[Evaluation], margin: float) -> tuple[float, float] | None:
    """(latest Elo, peak Elo) when the latest is more than `margin` below the peak, else None:
    the config regressed and has not recovered."""
    if len(evaluations) < 2:
        return None
    peak = max(e.elo for e in evaluations)
    latest = evaluations[-1].elo
    return (latest, peak) if latest < peak - margin else None


def _normalized(values: Mapping[str, float]) -> dict[str, float]:
    total = sum(values.values())
    if total <= 0.0:
        return {k: 1.0 / len(values) for k in values}
    return {k: v / total for k, v in values.items()}


def allocate(histories: Sequence[ConfigHistory], cfg: SchedulerConfig) -> Allocation:
    """The shares (summing to 1, each at least the floor) and one reason line per config."""
    if not histories:
        return Allocation({}, {})
    n = len(histories)
    floor = min(cfg.floor, 1.0 / n)
    slopes = {h.name: elo_slope(h.evaluations, cfg.progress_window) for h in histories}
    measured = [v for v in slopes.values() if v is not None]
    optimistic = max(measured) if measured and max(measured) > 0 else 1.0
    progress = {k: (optimistic if v is None else v) for k, v in slopes.items()} if cfg.progress \
        else {h.name: 1.0 for h in histories}
    p_share = _normalized(progress)
    s_share = _normalized({h.name: max(0.0, h.stale_hours) for h in histories})
    mix = cfg.staleness_weight
    raw: dict[str, float] = {}
    regressing: list[str] = []
    notes: dict[str, list[str]] = {}
    for h in histories:
        fell = regression(h.evaluations, cfg.regression_margin_elo)
        boost = cfg.regression_boost if fell is not None else 1.0
        raw[h.name] = h.weight * boost * ((1.0 - mix) * p_share[h.name] + mix * s_share[h.name])
        slope = slopes[h.name]
        note = [("progress off" if not cfg.progress else
                 f"progress {slope:.1f} Elo/CPU-h" if slope is not None else "progress not measured yet (optimistic)"),
                f"stale {h.stale_hours:.2f} h", f"weight {h.weight:g}"]
        if fell is not None:
            regressing.append(h.name)
            note.append(f"regressing (Elo {fell[0]:.0f} < peak {fell[1]:.0f} - {cfg.regression_margin_elo:g}): "
                        f"boost x{boost:g}")
        notes[h.name] = note
    rest = _normalized(raw)
    shares = {k: floor + (1.0 - n * floor) * v for k, v in rest.items()}
    reasons = {}
    for name, share in shares.items():
        at_floor = rest[name] * (1.0 - n * floor) < 1e-9
        reasons[name] = (f"floor {floor:g}: " if at_floor else f"share {share:.3f}: ") + ", ".join(notes[name])
    return Allocation(shares, reasons, {k: slopes[k] for k in shares}, tuple(regressing))


def moved(old: Mapping[str, float], new: Mapping[str, float], min_change: float) -> bool:
    """True when a config appeared, went, or its share moved by at least `min_change`."""
    if set(old) != set(new):
        return True
    return any(abs(old[k] - new[k]) >= min_change for k in new)


def pick_next(shares: Mapping[str, float], used: Mapping[str, float], wanting: Sequence[str]) -> str | None:
    """Of the configs `wanting` a turn, the one furthest below its share of what was `used`
    (stride scheduling: over time each config's use follows its share)."""
    if not wanting:
        return None
    total = sum(used.get(k, 0.0) for k in shares) or 0.0

    def deficit(name: str) -> tuple[float, str]:
        target = shares.get(name, 0.0)
        got = used.get(name, 0.0) / total if total > 0 else 0.0
        return (got - target, name)

    return min(wanting, key=deficit)


def evaluations(generations: Sequence[Mapping], cpu_hours_at: Mapping[int, float]) -> tuple[Evaluation, ...]:
    """A config's evaluations from its decided generations (as /progress lists them: generation,
    promoted, elo): after each promoted generation with an Elo, the best model's Elo and the
    CPU-hours its config had used when this node learned of it (`cpu_hours_at`; a generation
    decided before this node counted is placed at the earliest count known)."""
    out: list[Evaluation] = []
    known = [cpu_hours_at[g] for g in sorted(cpu_hours_at)]
    earliest = known[0] if known else 0.0
    for g in sorted(generations, key=lambda r: int(r.get("generation", 0))):
        elo = g.get("elo")
        if not g.get("promoted") or g.get("rolled_back") or elo is None:
            continue
        generation = int(g["generation"])
        out.append(Evaluation(float(cpu_hours_at.get(generation, earliest)), float(elo)))
    return tuple(out)

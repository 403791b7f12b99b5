"""The node's Prometheus metrics, on a per-process registry.

A fresh CollectorRegistry per Metrics object (never the global default one) so tests and
several in-process nodes can each have their own without "duplicated timeseries" errors.

Conventions (https://prometheus.io/docs/practices/naming/): one namespace, `mesh_` (the mesh
layer's own counters, e.g. `mesh_refusals_total`, share it); base units (seconds, bytes,
timestamps in Unix seconds); counters end in `_total`; every series carries a `node` label (so
one Prometheus sees a cluster without relabelling) and daemon series a `daemon` label. A gauge
that has no value yet is absent, never a made-up 0: gauges appear on their first `set`, and the
views the orchestrator registers (daemon states, the mesh) are read at scrape time and yield
nothing until their source exists.
"""

from __future__ import annotations

import os
import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector,
    disable_created_metrics, generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.coordination.daemons.worker_metrics import WorkerCollector

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
NAMESPACE = "mesh"
DEFAULT_NODE = "local"

disable_created_metrics()  # no `_created` twin per counter: half the series, none of them read


class _NodeBound:
    """A labelled collector with `node` pre-filled: `.labels(x)` fills the remaining labels;
    `.set`/`.inc` act on the node's own series (created on first use, so no fake zero)."""

    def __init__(self, metric: Counter | Gauge | Histogram, node: str) -> None:
        self._metric = metric
        self._node = node

    def labels(self, *values: str, **kw: str) -> Any:
        if kw:
            return self._metric.labels(node=self._node, **kw)
        return self._metric.labels(self._node, *values)

    def set(self, value: float) -> None:
        self._metric.labels(self._node).set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._metric.labels(self._node).inc(amount)

    def observe(self, value: float) -> None:
        self._metric.labels(self._node).observe(value)


class _Both:
    """A series under its name and, for one release, under the name it had before: the same
    value exported twice, so dashboards and alerts can move to the new name at their pace."""

    def __init__(self, current: _NodeBound, deprecated: _NodeBound) -> None:
        self._pair = (current, deprecated)

    def set(self, value: float) -> None:
        for metric in self._pair:
            metric.set(value)

    def inc(self, amount: float = 1.0) -> None:
        for metric in self._pair:
            metric.inc(amount)


class _Views(Collector):
    """Series computed at scrape time from callbacks (daemon states, mesh view)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.daemon_states: Callable[[], list[dict[str, Any]]] | None = None
        self.mesh_view: Callable[[], Mapping[str, Any] | None] | None = None

    def describe(self) -> Iterable[Any]:
        return []  # computed series: no fixed description (keeps registration cheap)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        if self.daemon_states is not None:
            fam = GaugeMetricFamily(f"{NAMESPACE}_daemon_state",
                                    "1 for the state each daemon is in (state set; gave_up: crash loop, given up).",
                                    labels=["node", "daemon", "critical", "state"])
            for d in self.daemon_states():
                state = "gave_up" if d["state"] == "failed" else d["state"]
                fam.add_metric([self.node, d["name"], str(bool(d["critical"])).lower(), state], 1.0)
            yield fam
        view = self.mesh_view() if self.mesh_view is not None else None
        for name, value in (view or {}).items():
            help_text = MESH_VIEW_HELP.get(name, name)
            label = MESH_VIEW_LABELS.get(name)
            fam = GaugeMetricFamily(f"{NAMESPACE}_{name}", help_text, labels=["node"] + ([label] if label else []))
            if label is None:
                fam.add_metric([self.node], float(value))
            else:  # one series per label value, e.g. model_elo{role="best"}
                for label_value, v in value.items():
                    fam.add_metric([self.node, str(label_value)], float(v))
            yield fam


# Old name -> new name: exported with the same value for one release, then removed.
DEPRECATED_ALIASES = {
    "mesh_selfplay_games_total": "mesh_selfplay_items_total",
    "mesh_selfplay_positions_total": "mesh_selfplay_samples_total",
    "mesh_selfplay_positions_per_second": "mesh_selfplay_samples_per_second",
}

# What the orchestrator's mesh view may report (name without namespace -> help).
MESH_VIEW_HELP = {
    "term": "Election term this node is in.",
    "is_leader": "1 when this node is the leader.",
    "leader_known": "1 when this node follows a known leader (or is it).",
    "voters": "Configured voters.",
    "voters_alive": "Voters this node sees alive (itself included when it is one).",
    "quorum_size": "Voters needed for a quorum: a majority of the configured voters.",
    "peers_alive": "Peers this node sees alive.",
    "cluster_best_generation": "Newest promoted generation this node knows the cluster decided.",
    "cluster_games_created": "Self-play games the cluster created, as gossiped (may lag).",
    "best_model_installed_timestamp_seconds": "When this node installed the model it plays with (Unix time).",
    "model_elo": "Elo of the cluster's best model (role=best) and of the newest decided generation "
                 "(role=candidate), fitted over every recorded gauntlet game.",
}
# Views reported as {label value: number}: the label they are split by.
MESH_VIEW_LABELS = {"model_elo": "role"}


# Series about the node process itself, not about one config's lineage: with several configs
# (app/config/configs.py) they are exported once, without a `config` label (the scheduler's
# `mesh_config_*` carry their own where they are about one config).
NODE_WIDE_PREFIXES = ("process_", "python_", f"{NAMESPACE}_build_info", f"{NAMESPACE}_worker_", f"{NAMESPACE}_config_")


class Metrics:
    """Attributes bind `node`; the pipeline and manager set them directly.

    With several configs each config's lineage counts into a Metrics of its own (its daemons,
    events and mesh); the first config's object serves /metrics for all of them
    (`add_configs`), every lineage series labelled with its `config`. `node_wide=False` leaves
    out the process-wide collectors, which the first config's object already exports."""

    def __init__(self, registry: CollectorRegistry | None = None, node: str = DEFAULT_NODE, *,
                 node_wide: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.node = node
        self._configs: list[tuple[str, CollectorRegistry]] = []  # (config, registry); empty: one config
        r = self.registry
        n = NAMESPACE

        def counter(name: str, doc: str, *labels: str) -> _NodeBound:
            metric = Counter(f"{n}_{name}", doc, ["node", *labels], registry=r)
            if not labels:
                metric.labels(node)  # a counter's 0 is a true value: export it from the start
            return _NodeBound(metric, node)

        def gauge(name: str, doc: str, *labels: str) -> _NodeBound:
            return _NodeBound(Gauge(f"{n}_{name}", doc, ["node", *labels], registry=r), node)

        # Pipeline. (Counter names are given without `_total`: prometheus-client appends it.)
        # Self-play counts items (games, or rollout groups) and samples (positions, or
        # completions); the game names are deprecated aliases with the same values (DEPRECATED_ALIASES).
        self.selfplay_items_total = _Both(
            counter("selfplay_items", "Self-play items (games or rollout groups) stored on this node."),
            counter("selfplay_games", "Deprecated alias of mesh_selfplay_items_total (one release)."))
        self.selfplay_samples_total = _Both(
            counter("selfplay_samples", "Self-play samples (positions or completions) generated on this node."),
            counter("selfplay_positions", "Deprecated alias of mesh_selfplay_samples_total (one release)."))
        self.selfplay_samples_per_second = _Both(
            gauge("selfplay_samples_per_second", "Self-play samples per second over the latest batch."),
            gauge("selfplay_positions_per_second", "Deprecated alias of mesh_selfplay_samples_per_second (one release)."))
        self.selfplay_workers = gauge("selfplay_workers", "Self-play worker processes that played the latest batch.")
        self.selfplay_items_dropped_total = counter(
            "selfplay_items_dropped", "Self-play items (rollout groups) played but dropped by a filter, by reason.",
            "reason")
        self.training_loss = gauge("training_loss", "Held-out loss of the latest training run on this node.")
        self.generation = gauge("model_generation", "Generation of the model this node plays with.")
        self.promotions_total = counter("promotions", "Models this node promoted.")
        self.retention_freed_bytes_total = counter(
            "retention_freed_bytes", "Bytes deleted once generations were decided (pipeline/retention.py), by kind.",
            "kind")
        # Feedback loops (app/coordination/pipeline/feedback_loops.py).
        self.data_quality_score = gauge("data_quality_score", "Quality score (0..1) of the latest exported dataset.")
        self.training_scale = gauge(
            "feedback_training_scale", "quality -> training: the next run's scale (lr times it, or batch over it; 1 = as configured).")
        self.selfplay_dirichlet_fraction = gauge(
            "selfplay_dirichlet_fraction", "loss plateau -> exploration: the root noise share self-play plays with.")
        self.feedback_adjustments_total = counter(
            "feedback_adjustments", "Feedback-loop decisions that moved a setting, by loop.", "loop")
        # Replication (app/coordination/pipeline/replication_daemon.py).
        self.games_under_replicated = gauge(
            "games_under_replicated", "This node's own games held by fewer nodes than the replication factor.")
        self.games_under_replicated_oldest_age_seconds = gauge(
            "games_under_replicated_oldest_age_seconds", "Age of this node's oldest under-replicated game.")
        self.replication_pulled_games_total = counter(
            "replication_pulled_games", "Games this node pulled from peers by anti-entropy.")
        self.replication_received_bytes_total = counter(
            "replication_received_bytes", "Bytes of anti-entropy answers this node received.")
        # Push on making (app/coordination/sync/replica_push.py): how long a game took to reach the factor.
        self.replication_lag_seconds = _NodeBound(Histogram(
            f"{n}_replication_lag_seconds", "From a game's end to the replication factor's nodes holding it.",
            ["node"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300), registry=r), node)
        self.replication_pending_oldest_seconds = gauge(
            "replication_pending_oldest_seconds", "Age of this node's oldest game not yet on the factor's nodes (0: none).")
        # Daemons.
        self.daemon_restarts_total = counter(
            "daemon_restarts", "Daemon restarts after a crash or failed health check.", "daemon")
        self.daemon_healthy = gauge("daemon_healthy", "1 when the daemon passes its health check.", "daemon")
        self.ready = gauge("ready", "1 when /readyz answers 200.")
        # Events.
        self.events_published_total = counter("events_published", "Events accepted for delivery.", "type")
        self.events_delivered_total = counter("events_delivered", "Successful handler invocations.", "type")
        self.events_duplicate_total = counter(
            "events_duplicate", "Events dropped as duplicates within the dedup TTL.", "type")
        self.events_failed_total = counter("events_failed", "Handler invocations that raised or timed out.", "type")
        self.dead_letters_abandoned_total = counter(
            "dead_letters_abandoned", "Dead letters given up after the last retry.", "type")
        self._views = _Views(node)
        r.register(self._views)
        if not node_wide:
            return
        # What runs here: the build (a constant 1 with its version labels) and the process's own
        # CPU, memory and file descriptors (prometheus-client's collectors, on this registry).
        build = Gauge(f"{n}_build_info", "The program this node runs (always 1; see the labels).",
                      ["node", "version", "revision", "python"], registry=r)
        build.labels(node, _version(), revision(), platform.python_version()).set(1)
        ProcessCollector(registry=r)
        r.register(WorkerCollector(n))  # its self-play, network, training and gauntlet processes
        PlatformCollector(registry=r)

    def watch_daemons(self, daemon_states: Callable[[], list[dict[str, Any]]]) -> None:
        """Export `mesh_daemon_state` from the manager's daemon states at each scrape."""
        self._views.daemon_states = daemon_states

    def watch_mesh(self, view: Callable[[], Mapping[str, Any] | None]) -> None:
        """Export the mesh view (keys of MESH_VIEW_HELP; a missing key is absent; a dict value is
        a series per value of the MESH_VIEW_LABELS label) at each scrape."""
        self._views.mesh_view = view

    def add_configs(self, first: str, others: list[tuple[str, "Metrics"]]) -> None:
        """Several configs: /metrics renders this object's series as config `first`'s and each
        of `others`' as its config's (one family per name, a `config` label on every lineage
        series; the node-wide ones, NODE_WIDE_PREFIXES, unlabelled)."""
        self._configs = [(first, self.registry), *((name, m.registry) for name, m in others)]

    def value(self, name: str, **labels: str) -> float | None:
        """One sample of this node (`name` with its namespace), e.g. value("mesh_training_loss")."""
        return self.registry.get_sample_value(name, {"node": self.node, **labels})

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric in this registry; series registered
        by other layers without a `node` label (the mesh's refusal counters) get this node's."""
        if self._configs:
            return generate_latest(_ConfigLabelled(self._configs, self.node))  # type: ignore[arg-type]
        return generate_latest(_NodeLabelled(self.registry, self.node))  # type: ignore[arg-type]


@cache
def revision() -> str:
    """The source revision this node runs: MESH_REVISION when a deployment sets it (an image
    built without .git), else the checkout's git commit (short), else "unknown"."""
    if os.environ.get("MESH_REVISION"):
        return os.environ["MESH_REVISION"][:40]
    root = Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _version() -> str:
    try:
        return metadata.version("selfplay-mesh")
    except metadata.PackageNotFoundError:
        return "unknown"


class _NodeLabelled:
    """A registry view that adds `node` to every sample lacking it."""

    def __init__(self, registry: CollectorRegistry, node: str) -> None:
        self.registry, self.node = registry, node

    def collect(self) -> Iterable[Any]:
        for family in self.registry.collect():
            family.samples = [s if "node" in s.labels else s._replace(labels={**s.labels, "node": self.node})
                              for s in family.samples]
            yield family


class _ConfigLabelled:
    """Several configs' registries as one exposition: a family per name (the text format
    allows one), each sample with `node` and, unless node-wide or already labelled (the
    scheduler's `mesh_config_*` gauges), its lineage's `config`."""

    def __init__(self, parts: list[tuple[str, CollectorRegistry]], node: str) -> None:
        self.parts, self.node = parts, node

    def collect(self) -> Iterable[Any]:
        merged: dict[str, Any] = {}
        for config, registry in self.parts:
            for family in registry.collect():
                node_wide = family.name.startswith(NODE_WIDE_PREFIXES)
                extra = {"node": self.node} if node_wide else {"node": self.node, "config": config}
                samples = [s._replace(labels={**extra, **s.labels}) for s in family.samples]
                if family.name in merged:
                    merged[family.name].samples.extend(samples)
                else:
                    family.samples = samples
                    merged[family.name] = family
        yield from merged.values()

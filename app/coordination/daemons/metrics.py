"""The node's Prometheus metrics, on a per-process registry.

A fresh CollectorRegistry per Metrics object (never the global default one) so tests and
several in-process nodes can each have their own without "duplicated timeseries" errors.
Names follow Prometheus conventions: base units (seconds, per second), counters end in _total.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """Attributes are prometheus-client collectors; the pipeline sets them directly."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # Pipeline.
        self.games_total = Counter("games_total", "Self-play games finished on this node.", registry=r)
        self.positions_per_second = Gauge(
            "positions_per_second", "Self-play positions generated per second (recent rate).", registry=r
        )
        self.training_loss = Gauge("training_loss", "Loss of the latest training epoch.", registry=r)
        self.elo = Gauge("elo", "Estimated Elo rating of a model generation.", ["generation"], registry=r)
        self.generation = Gauge("generation", "Generation of the model this node plays with.", registry=r)
        self.promotions_total = Counter("promotions_total", "Models promoted.", registry=r)
        # Daemons.
        self.daemon_restarts_total = Counter(
            "daemon_restarts_total", "Daemon restarts after a crash or failed health check.", ["daemon"], registry=r
        )
        self.daemon_healthy = Gauge("daemon_healthy", "1 when the daemon passes its health check.", ["daemon"], registry=r)
        self.ready = Gauge("ready", "1 when /readyz answers 200.", registry=r)
        # Events.
        self.events_published_total = Counter(
            "events_published_total", "Events accepted for delivery.", ["type"], registry=r
        )
        self.events_delivered_total = Counter(
            "events_delivered_total", "Successful handler invocations.", ["type"], registry=r
        )
        self.events_duplicate_total = Counter(
            "events_duplicate_total", "Events dropped as duplicates within the dedup TTL.", ["type"], registry=r
        )
        self.events_failed_total = Counter(
            "events_failed_total", "Handler invocations that raised or timed out.", ["type"], registry=r
        )
        self.dead_letters_abandoned_total = Counter(
            "dead_letters_abandoned_total", "Dead letters given up after the last retry.", ["type"], registry=r
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric in this registry."""
        return generate_latest(self.registry)

"""One node of the cluster: `python -m app.p2p_orchestrator`.

config -> event router + daemon manager (pipeline daemons) + health server (8790) + mesh
(8770). With no arguments it runs a single-node cluster on SQLite files under ./data until
stopped; SIGTERM or Ctrl-C drains within 30 s. Stopping and starting again resumes where
the pipeline was (see app/coordination/pipeline/state.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from app.atomic_files import atomic_write_text
from app.config import ConfigError, Settings, load_settings
from app.config.configs import LINEAGE_SETTINGS_FILE, ConfigEntry, lineage_settings
from app.config.lm import SHARED_TRAIN_KEYS
from app.config.node import default_node_id
from app.coordination.daemons.manager import DaemonManager, Readiness
from app.coordination.daemons.daemon_registry import build_registry, daemon_settings, read_daemons
from app.config.paths import NODE_DB_URL_ENV
from app.coordination.pipeline.cluster import ClusterPipeline
from app.coordination.pipeline.runner_settings import ExportSettings
from app.coordination.pipeline.runners import pipeline_runners
from app.coordination.pipeline.feedback_apply import feedback_status
from app.coordination.daemons.dlq_retry import INFRA_RUNNERS
from app.coordination.daemons.event_journal import EventJournal
from app.coordination.daemons.event_router import Event, EventRouter
from app.coordination.daemons.events import EventType
from app.coordination.daemons.health_server import HealthServer
from app.coordination.daemons.metrics import Metrics
from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.node_status import default_capabilities
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.steps import ReportsStatus
from app.workloads import pipeline_context
from app.coordination.pipeline.mesh_events import watch_mesh
from app.coordination.pipeline.dashboard_feed import DashboardFeed
from app.coordination.pipeline.lineage_gate import GatedLineage, LineageGate
from app.coordination.pipeline.progress_display import show_progress
from app.coordination.pipeline.retention import watch_retention
from app.coordination.pipeline.strength_watch import watch_strength
from app.db.dead_letters import DeadLetterStore
from app.db.engines import check_reachable
from app.db.registry import ModelRegistry
from app.log import configure_logging, get_logger
from app.shared.gpus import visible_gpus
from app.games.train.gauntlet_baselines import anchor_player
from app.games.train.promotion import progress_report

DEFAULT_DAEMONS_FILE = Path(__file__).resolve().parent.parent / "daemons.yaml"
DRAIN_DEADLINE_S = 25.0  # daemons drain within this; the mesh and health server then get
TEARDOWN_DEADLINE_S = 4.0  # this much: SIGTERM to exit stays inside the promised 30 s

log = get_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.p2p_orchestrator", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="node config YAML (see app/config)")
    p.add_argument("--daemons", type=Path, default=DEFAULT_DAEMONS_FILE, help="daemons file (default: %(default)s)")
    p.add_argument("--data-dir", type=Path, help="where this node keeps its files (default ./data)")
    p.add_argument("--node-id", help="this node's id (default: host name; <host>-<port> on another --port than 8770)")
    p.add_argument("--host", help="address to bind and advertise (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="mesh HTTP port (default 8770)")
    p.add_argument("--health-port", type=int, help="health server port (default 8790)")
    p.add_argument("--role", help="which daemons.yaml roles this node runs (default: all)")
    p.add_argument("--db-url", help="keep registry, games and work queue in this database, e.g. "
                                    "postgresql+psycopg://user@host/mesh_n1 (default: SQLite files in the data dir)")
    p.add_argument("--peers", help="other nodes, host:port or id@host:port, comma separated")
    p.add_argument("--voters", help="voter node ids, comma separated (required with peers)")
    p.add_argument("--priority", type=int, help="bully-order priority of this node (higher leads)")
    p.add_argument("--profile", choices=["lan", "wan", "fast"], help="mesh timing profile")
    p.add_argument("--max-generations", type=int, default=0,
                   help="stop after this many generations were promoted or rejected (0: run until stopped); "
                        "with several configs (configs:), once every config has decided this many of its own")
    p.add_argument("--log-level", default="INFO")
    return p


def node_settings(args: argparse.Namespace) -> Settings:
    """Config file, then command-line overrides of the node section."""
    settings = load_settings(args.config)
    overrides = {
        "data_dir": args.data_dir, "node_id": args.node_id, "host": args.host,
        "mesh_port": args.port, "health_port": args.health_port, "role": args.role, "db_url": args.db_url,
    }
    if args.node_id is None and args.port is not None and "node_id" not in settings.node.model_fields_set:
        overrides["node_id"] = default_node_id(args.port)  # --port alone: an id of its own on this host
    node = settings.node.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    split = lambda text: [x for x in text.split(",") if x] if text is not None else None  # noqa: E731
    mesh_overrides = {"peers": split(args.peers), "voters": split(args.voters), "priority": args.priority,
                      "profile": args.profile}
    mesh = settings.mesh.model_copy(update={k: v for k, v in mesh_overrides.items() if v is not None})
    return settings.model_copy(update={"node": node, "mesh": mesh})


def machine_capabilities() -> dict[str, Any]:
    """What the node gossips it offers: the mesh's cheap facts and the CUDA devices this process
    sees. The leader's schedule makes training require a GPU when a live node has one; without
    the count every node said 0, so a GPU node's training could go to a CPU node."""
    return {**default_capabilities(), "gpus": visible_gpus()}


def build_mesh(settings: Settings, pipe: PipelineContext,
               metrics: Metrics | None = None) -> tuple[MeshNode, ClusterPipeline | None]:
    """The mesh node with the routes the workload serves; clustered when there are other voters
    or peers. With `metrics`, the mesh counts into the node's registry (one /metrics for everything)."""
    node = MeshNode(settings, registry=metrics.registry if metrics is not None else None,
                    capabilities=machine_capabilities())
    node.add_routes(pipe.steps.routes())
    if len(node.voters) > 1 or settings.mesh.peers:
        cluster = ClusterPipeline(node, pipe)
        pipe.cluster = cluster
        node.add_routes(cluster.routes())
        node.set_work_source(cluster.work_source)
        node.set_progress_provider(cluster.progress)
        return node, cluster
    node.set_progress_provider(lambda: _local_progress(pipe))
    return node, None


def _local_progress(pipe: PipelineContext) -> dict:
    with ModelRegistry(pipe.paths.registry_db) as registry:
        report = progress_report(registry, anchor_player(pipe.settings))
    return {**report, **(pipe.steps.progress_extra(pipe) if isinstance(pipe.steps, ReportsStatus) else {})}


@dataclass
class Lineage:
    """One config's whole one-lineage stack on this node (app/config/configs.py)."""

    entry: ConfigEntry
    pipe: PipelineContext
    router: EventRouter
    manager: DaemonManager
    node: MeshNode
    cluster: ClusterPipeline | None
    feed: DashboardFeed
    metrics: Metrics
    dead_letters: DeadLetterStore


async def build_lineage(args: argparse.Namespace, entry: ConfigEntry, settings: Settings, daemons: dict,
                        metrics: Metrics, own_file: bool) -> Lineage:
    export = daemon_settings(daemons, "export", ExportSettings, str(args.daemons))
    if own_file and settings.workload == "lm":  # min_new_games counts the game configs' games; an lm
        export = ExportSettings.model_validate(   # config starts a generation by its lm.export.min_new_groups
            export.model_dump(include=export.model_fields_set - {"min_new_games"}))
    config_path = args.config.resolve() if args.config else None
    if own_file:  # `configs:` given: its torchrun reads this config's sections, not the node file's
        config_path = Path(settings.node.data_dir).resolve() / LINEAGE_SETTINGS_FILE
        await asyncio.to_thread(atomic_write_text, config_path, lineage_yaml(settings))
    pipe = pipeline_context(settings, config_path=config_path, export=export)
    pipe.config_name = entry.name
    pipe.requirements = entry.requires.work_requirements()  # who may claim this config's training
    await asyncio.to_thread(migrate_data_dir, pipe)
    dead_letters = DeadLetterStore(pipe.paths.dead_letters_db)
    router = EventRouter(metrics=metrics, dead_letters=dead_letters)
    EventJournal(pipe.paths.events_file).subscribe(router)
    registry = build_registry(daemons, {**INFRA_RUNNERS, **pipeline_runners(pipe)}, str(args.daemons))
    manager = DaemonManager(registry.select(settings.node.role), router=router, settings=settings, metrics=metrics)
    pipe.wait_draining = manager.wait_draining
    node, cluster = build_mesh(settings, pipe, metrics)

    def ready() -> tuple[bool, str]:
        result = manager.readiness()
        return result.ready, result.reason

    feed = DashboardFeed(pipe, node, readiness=ready)
    base_progress = node.progress_provider
    node.set_progress_provider(lambda: feed.progress(base_progress() if base_progress else {}))
    if cluster is not None:
        cluster.readiness = ready  # gossiped: every node's dashboard shows every node's readiness
    metrics.watch_daemons(manager.daemon_states)
    metrics.watch_mesh(feed.mesh_gauges)
    return Lineage(entry, pipe, router, manager, node, cluster, feed, metrics, dead_letters)


def lineage_yaml(settings: Settings) -> str:
    """The sections a lineage's training run reads (no mesh secrets on disk): a game lineage's
    game sections, an lm lineage's `lm:` as given (a task refuses keys it does not read) and the
    train keys both trainers share (its file must load as an lm node's: no setting of the other
    workload)."""
    if settings.workload == "lm":
        data = {"workload": "lm", "lm": settings.lm.model_dump(mode="json", exclude_unset=True)}
        data["train"] = {k: v for k, v in settings.train.model_dump(mode="json").items() if k in SHARED_TRAIN_KEYS}
        return yaml.safe_dump(data, sort_keys=True)
    data = settings.model_dump(mode="json", include={"workload", "model", "search", "selfplay", "export", "train",
                                                     "gauntlet", "promotion"})
    data["node"] = {"game": settings.node.game}
    return yaml.safe_dump(data, sort_keys=True)


async def run_node(args: argparse.Namespace, settings: Settings) -> int:
    if settings.node.db_url:
        await asyncio.to_thread(check_reachable, settings.node.db_url)  # one line, not a traceback
        os.environ[NODE_DB_URL_ENV] = settings.node.db_url  # its trainers' rollout store (mesh_rollouts.py)
    daemons = read_daemons(args.daemons)
    configured = lineage_settings(settings)
    several = len(configured) > 1
    metrics = Metrics(node=settings.node.node_id)
    lineages = [await build_lineage(args, entry, lsettings, daemons,
                                    metrics if index == 0 else Metrics(node=settings.node.node_id, node_wide=False),
                                    own_file=bool(settings.configs))
                for index, (entry, lsettings) in enumerate(configured)]
    if several:  # one /metrics for every config, each lineage's series labelled with its config
        metrics.add_configs(lineages[0].entry.name, [(x.entry.name, x.metrics) for x in lineages[1:]])
    primary = lineages[0]
    pipe, manager, node, cluster, feed = primary.pipe, primary.manager, primary.node, primary.cluster, primary.feed
    gate = wire_gate(lineages, settings, metrics) if several else None
    health = HealthServer(NodeHealth(lineages) if several else manager, metrics, host=settings.node.host,
                          port=settings.node.health_port,
                          dashboard=lambda: {**feed.snapshot(), **configs_view(lineages, gate)} if gate else feed.snapshot())
    node.add_routes(admin_routes(manager))
    await health.start()
    for lineage in lineages:
        await lineage.node.start()
    manager.install_signal_handlers(deadline_s=DRAIN_DEADLINE_S)
    metrics.generation.set(pipe.state.best_generation)
    log.info("node_starting", data_dir=str(pipe.paths.data_dir), health=health.url,
             generation=pipe.state.generation, stage=pipe.state.stage.value, configs=[x.entry.name for x in lineages])
    background = [asyncio.create_task(show_progress(pipe, metrics))]
    for lineage in lineages:
        background += [asyncio.create_task(lineage.feed.run()), asyncio.create_task(watch_strength(lineage.pipe)),
                       asyncio.create_task(watch_retention(lineage.pipe, lineage.metrics))]
        if lineage.cluster is not None:
            background.append(asyncio.create_task(lineage.cluster.publish_loop(lineage.router)))
            background.append(asyncio.create_task(watch_mesh(lineage.node, lineage.router)))
        else:
            background.append(asyncio.create_task(_show_local_status(lineage.pipe, lineage.node, lineage.feed.readiness,
                                                                     gate)))
    if gate is not None:
        background += [asyncio.create_task(gate.run()), asyncio.create_task(gate.account_training()),
                       asyncio.create_task(_drain_with(manager, [x.manager for x in lineages[1:]]))]
    if args.max_generations:
        background.append(asyncio.create_task(_stop_after([x.pipe for x in lineages], manager, args.max_generations)))
    try:
        await asyncio.gather(*(x.manager.start() for x in lineages))
        await asyncio.gather(*(x.manager.wait_stopped() for x in lineages))
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        try:
            await asyncio.wait_for(_teardown(lineages, health), TEARDOWN_DEADLINE_S)
        except TimeoutError:
            log.warning("teardown_timed_out", deadline_s=TEARDOWN_DEADLINE_S)
        for lineage in lineages:
            lineage.pipe.steps.close()
            lineage.dead_letters.close()
    log.info("node_stopped", generation=pipe.state.generation, promoted=pipe.state.promoted,
             rejected=pipe.state.rejected)
    return 0


class NodeHealth:
    """/readyz and /daemons of a node with several configs: ready only when every config's
    daemons are (a critical daemon that gave up in any config says so, naming the config)."""

    def __init__(self, lineages: list[Lineage]) -> None:
        self.lineages = lineages

    def readiness(self) -> Readiness:
        for lineage in self.lineages:
            result = lineage.manager.readiness()
            if not result.ready:
                return Readiness(False, f"config {lineage.entry.name}: {result.reason}")
        return self.lineages[0].manager.readiness()

    def daemon_states(self) -> list[dict]:
        return [{**state, "name": state["name"] if index == 0 else f"{x.entry.name}.{state['name']}"}
                for index, x in enumerate(self.lineages) for state in x.manager.daemon_states()]


def wire_gate(lineages: list[Lineage], settings: Settings, metrics: Metrics) -> LineageGate:
    """Several configs: the gate they share, told of every lineage's promotions, and the
    allocation in every lineage's gossiped inventory (so in /status)."""
    gated = [GatedLineage(x.entry.name, x.entry.weight, x.pipe, _generations_of(x)) for x in lineages]
    primary = lineages[0]
    gate = LineageGate(gated, settings.scheduler, primary.pipe.paths.data_dir, settings.node.node_id,
                       router=primary.router, registry=metrics.registry)
    for lineage in lineages:
        lineage.pipe.gate = gate
        name = lineage.entry.name

        async def promoted(_event: Event, name: str = name) -> None:
            gate.on_promoted(name)

        lineage.router.subscribe(EventType.MODEL_PROMOTED, promoted, name=f"config_gate.{name}")
        if lineage.cluster is not None:
            lineage.cluster.extra_inventory = lambda name=name: {"config": name, "config_allocation": gate.status()}
    base = primary.node.progress_provider
    primary.node.set_progress_provider(lambda: {**(base() if base else {}), **configs_view(lineages, gate)})
    return gate


def _generations_of(lineage: Lineage) -> Callable[[], list[dict]]:
    return lambda: lineage.feed.config_progress()["generations"]


def configs_view(lineages: list[Lineage], gate: LineageGate | None) -> dict:
    """/progress and the dashboard with several configs: each config's progress and the allocation."""
    return {"configs": {x.entry.name: {"game": x.entry.label, "workload": x.entry.workload, "weight": x.entry.weight,
                                       **x.feed.config_progress()}
                        for x in lineages},
            "allocation": gate.status() if gate is not None else None}


async def _drain_with(primary: DaemonManager, others: list[DaemonManager]) -> None:
    """The node drains as one: the other configs' daemons with the first's (signal, /admin/drain)."""
    await primary.wait_draining()
    await asyncio.gather(*(m.drain_and_stop(DRAIN_DEADLINE_S) for m in others))


def migrate_data_dir(pipe: PipelineContext) -> None:
    """A data dir written before its paths were relative (or restored, or moved): the
    registry's model paths and the pipeline state's paths rewritten relative to it, found
    again under it where the dir moved. Idempotent; logged when it changed anything."""
    paths = pipe.paths
    state_text = paths.state_file.read_text() if paths.state_file.exists() else None
    if state_text is not None:
        pipe.save_state()
    with ModelRegistry(paths.registry_db) as registry:
        rows = registry.rebase_paths(paths.data_dir)
    state_changed = state_text is not None and paths.state_file.read_text() != state_text
    if rows or state_changed:
        log.info("data_dir_migrated", data_dir=str(paths.data_dir), registry_paths=rows, pipeline_state=state_changed)


def admin_routes(manager: DaemonManager) -> list[web.RouteDef]:
    """POST /admin/drain (signed; `python -m app.cli drain`): drain the daemons and stop the node."""
    draining: list[asyncio.Task] = []

    async def drain(request: web.Request) -> web.Response:
        if not draining:
            log.info("drain_requested", by=request.headers.get("X-Mesh-From", "operator"), deadline_s=DRAIN_DEADLINE_S)
            draining.append(asyncio.create_task(manager.drain_and_stop(DRAIN_DEADLINE_S)))
        return web.json_response({"draining": True, "deadline_s": DRAIN_DEADLINE_S}, status=202)

    return [web.post("/admin/drain", drain)]


async def _show_local_status(pipe: PipelineContext, node: MeshNode, ready: Callable[[], tuple[bool, str]] | None,
                             gate: LineageGate | None = None, interval_s: float = 2.0) -> None:
    """A lone node has no gossip loop: its best generation, the items it created and what the
    workload reports about it (an LM node's engines and their weight versions) still reach
    /status, in the keys a cluster node's inventory has them."""
    last_error = ""
    while True:
        try:
            counts = await asyncio.to_thread(pipe.steps.items.created_counts, pipe.node_id)
            last_error = ""
        except Exception as exc:  # noqa: BLE001 - a busy store leaves the counts out (logged once per cause)
            if str(exc) != last_error:
                log.warning("local_status_counts_failed", error=str(exc))
            last_error, counts = str(exc), {}
        state, (is_ready, why) = pipe.state, (ready() if ready is not None else (None, ""))
        reported = pipe.steps.node_status(pipe) if isinstance(pipe.steps, ReportsStatus) else {}
        node.update_local_state(inventory={**counts, **reported,
                                           "best_generation": state.best_generation, "best_sha256": state.best_sha256,
                                           "feedback": feedback_status(pipe),
                                           "ready": is_ready, "ready_reason": why[:200],
                                           **({"config": pipe.config_name, "config_allocation": gate.status()}
                                              if gate is not None else {})})
        await asyncio.sleep(interval_s)


async def _teardown(lineages: list[Lineage], health: HealthServer) -> None:
    """Hand back held claims (so the leader reschedules at once), then close the servers."""
    for lineage in lineages:
        if lineage.cluster is not None:
            await lineage.cluster.release_for_shutdown()
    for lineage in lineages:
        await lineage.node.stop()
    await health.stop()


def generations_reached(pipe: PipelineContext, generations: int) -> bool:
    """One lineage is done for --max-generations: that many generations decided and the last
    promoted model installed in the model store (so a restart plays with it)."""
    state = pipe.state
    distributed = state.best_sha256 is None or state.best_path == str(pipe.steps.models.installed_path(state.best_sha256))
    return pipe.decided_generations() >= generations and distributed


async def _stop_after(pipes: list[PipelineContext], manager: DaemonManager, generations: int) -> None:
    """--max-generations: drain once every config's lineage reached it (an operator asking for
    N generations of a cluster of configs expects N of each, not N of the first); the other
    configs' daemons drain with the first's (_drain_with)."""
    while True:
        waiting = [p for p in pipes if not generations_reached(p, generations)]
        if not waiting:
            break
        await waiting[0].wait_for_change(5.0)
    log.info("max_generations_reached", decided={p.config_name or "default": p.decided_generations() for p in pipes})
    await manager.drain_and_stop(DRAIN_DEADLINE_S)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = node_settings(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.node.node_id, level=args.log_level)
    try:
        return asyncio.run(run_node(args, settings))
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a port in use, an unwritable data dir
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

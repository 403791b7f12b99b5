"""The trainer's head across a cluster, between two real MeshNodes on loopback: a decided record
kept as the head (a language model's GRPO runs on from a rejected candidate) is what the next
claimant trains from, whichever node claims it: the claimant fetches the model by sha256 from
the peer that installed it and its launcher gets `--parent` of it; the next record, not kept
(it regressed past the margin), sends the generation after it back to the best."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.config import load_settings
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.daemons.event_router import EventRouter
from app.coordination.p2p.node import MeshNode
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.cluster import ClusterPipeline
from app.coordination.pipeline.generation_log import GenerationRecord
from app.coordination.pipeline.runner_settings import ExportSettings, TrainSettings
from app.coordination.pipeline.runners import resolve_head
from app.coordination.pipeline.training_job import training_command
from app.games.search.model import Architecture, ModelMeta, load_model, new_model, save_model
from app.log import get_logger
from app.workloads import pipeline_context
from tests.mesh_helpers import free_ports, wait_for

pytestmark = pytest.mark.timeout(60)
SECRET = "head-secret"
ARCH = Architecture(8, 1, (3, 6, 7), 7)


def _model(tmp_path: Path, name: str, seed: int, generation: int) -> tuple[Path, str]:
    path = tmp_path / f"{name}.safetensors"
    return path, str(save_model(new_model(ARCH, seed=seed), ModelMeta(ARCH, "connect4", generation=generation), path).sha256)


async def test_the_next_claimant_fetches_the_head_a_peer_decided_and_trains_from_it(tmp_path: Path) -> None:
    ports = free_ports(2)
    pipes, nodes = [], []
    for i, nid in enumerate(("n0", "n1")):
        settings = load_settings(None, node={"node_id": nid, "data_dir": str(tmp_path / nid)})
        pipe = pipeline_context(settings, export=ExportSettings(min_new_games=10**9))  # no training scheduled
        node = MeshNode(node_id=nid, host="127.0.0.1", port=ports[i], data_dir=tmp_path / nid,
                        peers=[f"n{1 - i}@127.0.0.1:{ports[1 - i]}"], voters=["n0"], profile="fast", secret=SECRET)
        node.add_routes(pipe.steps.routes())  # the model store's routes, as the orchestrator serves them
        pipe.cluster = ClusterPipeline(node, pipe)
        pipes.append(pipe)
        nodes.append(node)
    best_file, best = _model(tmp_path, "best", 1, 1)
    head_file, head = _model(tmp_path, "head", 2, 2)
    pipes[0].steps.models.install(head_file, head)  # n0 decided generation 2 and kept it as the head
    best_path = pipes[1].steps.models.install(best_file, best)
    router = EventRouter()
    ctx = DaemonContext(name="train", settings=TrainSettings(), router=router, app_settings=pipes[1].settings,
                        stopping=asyncio.Event(), log=get_logger("test"), metrics=router.metrics)
    claimant = pipes[1]
    await claimant.update(lambda s: ps.switched_best(s, best, str(best_path), 1))
    claimant.cluster.generations.merge([GenerationRecord(1, best, True, 10, "n0"),
                                        GenerationRecord(2, head, False, 20, "n0", head=True)])
    for node in nodes:
        await node.start()
    publisher = asyncio.create_task(pipes[0].cluster.publish_loop(interval_s=0.2))  # gossips n0's models
    try:
        await wait_for(lambda: _gossips_model(nodes[1], "n0", head), 20)
        await claimant.update(lambda s: ps.exported(ps.adopt_generation(s, 3), "datasets/gen_0003", "d" * 64, 30))
        await resolve_head(claimant, claimant.cluster, ctx)
        state = claimant.state
        assert (state.head_sha256, state.head_generation) == (head, 2)
        assert Path(state.head_path) == claimant.steps.models.installed_path(head)
        assert load_model(state.head_path)[1].sha256 == head  # fetched from n0, verified
        cmd = training_command(claimant, ps.training_started(state, str(tmp_path / "run3")), nproc=1)
        assert cmd[cmd.index("--parent") + 1] == state.head_path

        # generation 3 regressed past the margin: not kept, so generation 4 trains from the best
        claimant.cluster.generations.merge([GenerationRecord(3, "3" * 64, False, 30, "n1")])
        await claimant.update(lambda s: ps.abandoned(s))
        await claimant.update(lambda s: ps.exported(ps.adopt_generation(s, 4), "datasets/gen_0004", "e" * 64, 40))
        await resolve_head(claimant, claimant.cluster, ctx)
        assert claimant.state.head_sha256 is None
        cmd = training_command(claimant, ps.training_started(claimant.state, str(tmp_path / "run4")), nproc=1)
        assert cmd[cmd.index("--parent") + 1] == str(best_path)
    finally:
        publisher.cancel()
        for node in nodes:
            await node.stop()


async def _gossips_model(node: MeshNode, peer: str, sha256: str) -> bool:
    state = node.cluster_view().nodes.get(peer)
    return state is not None and sha256 in state.inventory.get("models", [])

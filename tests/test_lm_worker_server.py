"""A rollout worker whose engine is a server (issue 53, item 1: SGLang or vLLM in the mesh),
between two real MeshNodes on loopback with the loopback SGLang stub of the real routes: the
trainer's node publishes its newest policy and gossips it; the worker's node fetches the
directory by sha256, syncs its server to it through the one sync path (`update_weights_from_disk`
with the policy's version), generates its batch there and stores groups stamped with the
policy's sha256; when it plays the best again the server is synced back to the best."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.config import Settings
from app.coordination.p2p.node import MeshNode
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.cluster import ClusterPipeline
from app.coordination.pipeline.runner_settings import ExportSettings, SelfplaySettings
from app.db.rollout_store import RolloutStore
from app.lm.setup import initial_model
from app.lm.train.policy_publish import POLICIES_DIR, PolicyPublisher, read_policy
from app.workloads import pipeline_context
from tests.engine_stubs import SGLangStub
from tests.mesh_helpers import free_ports, wait_for

pytestmark = pytest.mark.timeout(90)
SECRET = "worker-secret"


async def test_a_worker_plays_the_trainers_policy_on_its_server_then_the_best_again(tmp_path: Path) -> None:
    server = await SGLangStub().start()
    ports = free_ports(2)
    engines = ([{"name": "local", "kind": "in_process"}], [{"name": "sg", "kind": "sglang", "url": server.url}])
    pipes, nodes = [], []
    for i, nid in enumerate(("t0", "w1")):
        settings = Settings.model_validate({"workload": "lm", "node": {"node_id": nid, "data_dir": str(tmp_path / nid)},
                                            "lm": {"engines": engines[i]}})
        pipe = pipeline_context(settings, export=ExportSettings())
        node = MeshNode(node_id=nid, host="127.0.0.1", port=ports[i], data_dir=tmp_path / nid,
                        peers=[f"{('t0', 'w1')[1 - i]}@127.0.0.1:{ports[1 - i]}"], voters=["t0"], profile="fast",
                        secret=SECRET)
        node.add_routes(pipe.steps.routes())
        pipe.cluster = ClusterPipeline(node, pipe)
        pipes.append(pipe)
        nodes.append(node)
    trainer, worker = pipes
    # the trainer's node is training generation 2 and has published its policy as version 3
    run_dir = trainer.paths.runs_dir / "gen_0002"
    run_dir.mkdir(parents=True)
    await trainer.update(lambda s: ps.training_started(ps.exported(ps.adopt_generation(s, 2), "d", "d" * 64, 0),
                                                       str(run_dir)))
    tokenizer = trainer.steps._task_kit()[0]
    model = initial_model(trainer.steps.lm.model, tokenizer)
    publisher = PolicyPublisher(trainer.paths.data_dir / POLICIES_DIR, run_dir, 2, model, tokenizer)
    publisher(3, {k: v.clone() for k, v in model.state_dict().items()})
    policy = read_policy(run_dir)
    assert policy is not None and policy["version"] == 3
    (run_dir / "metrics.jsonl").write_text(json.dumps({"phase": "rl", "step": 4, "weight_version": 3}) + "\n")
    for node in nodes:
        await node.start()
    gossip = asyncio.create_task(trainer.cluster.publish_loop(interval_s=0.2))
    try:
        await wait_for(lambda: _gossips_policy(nodes[1], "t0", policy["sha256"]), 20)
        summary = await asyncio.to_thread(worker.steps.selfplay_batch, worker, SelfplaySettings(), lambda: False)
        assert summary.items > 0 and worker.steps.policy_batches == 1
        synced = server.bodies("/update_weights_from_disk")
        fetched = worker.paths.data_dir / POLICIES_DIR / policy["sha256"]
        assert synced[-1]["model_path"] == str(fetched) and synced[-1]["weight_version"] == "3"
        with RolloutStore(worker.paths.rollouts_db) as store:
            groups = store.groups()
        assert len(groups) == summary.items and {g.model_sha256 for g in groups} == {policy["sha256"]}
        engine = worker.steps.node_status(worker)["lm_engines"]["sg"]
        assert engine["sha256"] == policy["sha256"] and engine["in_service"] is True

        # the worker's server back on the best when the node plays the best (here: no trainer gossips)
        gossip.cancel()
        await nodes[0].stop()
        back = await asyncio.to_thread(worker.steps.engines.rollout_engine, None, 0, None, tokenizer)
        assert back is not None and server.bodies("/update_weights_from_disk")[-1]["weight_version"] == "0"
        assert worker.steps.node_status(worker)["lm_engines"]["sg"]["sha256"] is None  # the initial model
    finally:
        gossip.cancel()
        for node in nodes:
            await node.stop()
        await server.stop()
        for pipe in pipes:
            pipe.steps.close()


async def _gossips_policy(node: MeshNode, peer: str, sha256: str) -> bool:
    state = node.cluster_view().nodes.get(peer)
    training = state.inventory.get("lm_training") if state is not None else None
    return isinstance(training, dict) and (training.get("policy") or {}).get("sha256") == sha256

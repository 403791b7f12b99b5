"""LM self-play into the rollout store, with the real model, engine and SQLite store: groups
round-trip exactly, storage is idempotent by uid, malformed records are refused before any
write, replication between real loopback MeshNodes carries rollouts as it carries games, a
writer killed with SIGKILL mid-batch leaves whole groups only, none counted twice on rerun,
and a window exports to a dataset a peer fetches by its manifest's sha256."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.node import MeshNode
from app.coordination.sync.dataset_fetch import fetch_manifest_dir
from app.coordination.sync.dataset_server import dataset_routes
from app.coordination.sync.replica_server import replica_routes
from app.coordination.sync.replication import Replicator
from app.lm.workload.rollout_replica import STORE_NAME, RolloutReplicaStore
from app.db.rollout_store import RolloutGroupRecord, RolloutStore, RolloutStoreError
from app.lm.rollout.rollout_dataset import (
    RolloutDatasetError, export_rollouts, load_rollout_dataset, read_rollout_manifest, verify_rollout_dataset,
)
from app.lm.rollout.batches import batch_prompts, group_uid, rollout_batch, to_group, to_record
from app.lm.rollout.engine_config import build_engine
from app.lm.setup import (
    build_task, build_tokenizer, initial_model, rollout_settings, train_prompts,
)
from tests import lm_rollout_writer_job as writer_job
from tests.lm_rollout_writer_job import CONFIG
from tests.mesh_helpers import refused_both_ways
from tests.orchestrator_helpers import ROOT, wait_until

pytestmark = pytest.mark.timeout(180)
SECRET = b"rollout-replication-secret"
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def lm():  # type: ignore[no-untyped-def]
    tok = build_tokenizer(CONFIG.tokenizer)
    engine = build_engine(CONFIG.engines[0], initial_model(CONFIG.model, tok), tok, weight_version=3)
    task = build_task(CONFIG.task)
    return tok, engine, task, train_prompts(task, CONFIG.task)


def run_batch(lm, store: RolloutStore, node: str, batch: int):  # type: ignore[no-untyped-def]
    tok, engine, task, pool = lm
    prompts = batch_prompts(pool, 0, batch, CONFIG.rollout.batch_groups)
    return rollout_batch(engine, task, tok, prompts, rollout_settings(CONFIG.rollout), store, node_id=node,
                         model_id="m", seed=batch)


def test_a_batch_is_stored_whole_once_and_round_trips_exactly(tmp_path: Path, lm) -> None:
    tok, _, task, pool = lm
    prompts = batch_prompts(pool, 0, 0, 8)
    with RolloutStore(tmp_path / "rollouts.db") as store:
        first = run_batch(lm, store, "a", 0)
        assert first.stored == 8 and first.already == 0 and first.reward_mean is not None
        again = run_batch(lm, store, "a", 0)
        assert again.stored == 0 and again.already == 8  # idempotent by uid: nothing generated or stored twice
        assert store.count() == 8 and store.integrity_problems() == []
        records = store.groups()
        assert [r.prompt_id for r in records] == [p.prompt_id for p in prompts]
        for r, prompt in zip(records, prompts):
            assert r.prompt_tokens == tok(prompt.text)["input_ids"]
            assert r.uid == group_uid("a", "m", 0, r.prompt_id) and r.weight_version == 3 and r.task == task.name
            assert len(r.samples) == CONFIG.rollout.n
            group = to_group(r)
            # stored -> read back -> stored again gives the very same record (floats included)
            assert to_record(group, uid=r.uid, node_id="a", task=r.task, model_sha256=None,
                             created_at=r.created_at) == r
            for s in group.samples:
                assert s.weight_version == 3 and s.finish_reason in ("stop", "length")
        # the newest window and the staleness bound
        run_batch(lm, store, "a", 1)
        assert [r.uid for r in store.groups(newest=8)] == store.uids()[8:]
        assert store.groups(min_version=4) == [] and len(store.groups(min_version=3)) == 16


def test_batches_draw_distinct_prompts_and_replay_the_same_ones(lm) -> None:
    pool = lm[3][:10]
    seen = [p.prompt_id for b in range(5) for p in batch_prompts(pool, 7, b, 4)]
    for b in range(5):
        batch = batch_prompts(pool, 7, b, 4)
        assert len({p.prompt_id for p in batch}) == 4 and batch == batch_prompts(pool, 7, b, 4)
    assert set(seen) == {p.prompt_id for p in pool}  # two epochs cover the pool
    with pytest.raises(ValueError, match="pool"):
        batch_prompts(pool, 0, 0, 11)


def good_record(uid: str = "ab" * 16, origin: str = "b") -> dict:
    sample = {"group_index": 0, "response_tokens": [14, 15, 2], "loss_mask": [1, 1, 1],
              "rollout_logprobs": [-0.5, -0.25, -1e-9], "reward": 1.0, "weight_version": 2,
              "finish_reason": "stop", "terminated": True, "truncated": False, "truncation_reason": None}
    return {"uid": uid, "node_id": origin, "task": "copy3-3", "prompt_id": "copy3-3:123",
            "prompt_tokens": [1, 4, 12, 13, 14, 21], "weight_version": 2, "model_sha256": None,
            "created_at": 1.0, "samples": [sample, {**sample, "group_index": 1, "reward": 0.0}]}


BAD = [
    (lambda r: r["samples"][0].update(loss_mask=[1, 1]), "2 mask values"),
    (lambda r: r["samples"][0].update(truncated=True), "truncation_reason"),
    (lambda r: r["samples"][1].update(group_index=0), "appears twice"),
    (lambda r: r.update(weight_version=1), "oldest"),
    (lambda r: r["samples"][0].update(finish_reason="done"), "finish_reason"),
    (lambda r: r.update(extra=1), "extra"),
]


@pytest.mark.parametrize(("spoil", "why"), BAD, ids=[w for _, w in BAD])
def test_a_malformed_record_is_refused_and_nothing_of_its_batch_stored(tmp_path: Path, spoil, why: str) -> None:
    replica = RolloutReplicaStore(tmp_path / "r.db")
    try:
        bad = good_record("cd" * 16)
        spoil(bad)
        with pytest.raises(ValueError, match=why):
            replica.insert([good_record(), bad])
        assert replica.count() == 0
        assert replica.insert([good_record()]) == 1 and replica.insert([good_record()]) == 0
        assert RolloutGroupRecord.model_validate(good_record()).rewards == [1.0, 0.0]
    finally:
        replica.close()


async def test_replication_carries_rollouts_between_real_nodes(tmp_path: Path, lm) -> None:
    stores, nodes, clients = {}, {}, {}
    try:
        for nid in ("a", "b"):
            stores[nid] = RolloutReplicaStore(tmp_path / nid / "rollouts.db")
            node = MeshNode(node_id=nid, host="127.0.0.1", port=0, data_dir=tmp_path / nid, profile="fast",
                            secret=SECRET)
            node.add_routes(replica_routes(STORE_NAME, stores[nid]))
            await node.start()
            nodes[nid], clients[nid] = node, MeshClient(SECRET, timeout=5.0)
        run_batch(lm, stores["a"].store, "a", 0)
        run_batch(lm, stores["b"].store, "b", 1)
        reps = {nid: Replicator(nid, clients[nid], stores[nid], factor=2, store_name=STORE_NAME, batch=3)
                for nid in nodes}
        for nid, rep in reps.items():
            other = "b" if nid == "a" else "a"
            report = await rep.run_round({other: nodes[other].addr}, ["a", "b"])
            assert report.errors == {} and report.pulled == 8, report
        held = {nid: stores[nid].store.groups() for nid in nodes}
        assert {r.uid for r in held["a"]} == {r.uid for r in held["b"]} and len(held["a"]) == 16
        by_uid = {r.uid: r for r in held["a"]}
        assert all(by_uid[r.uid] == r for r in held["b"])  # the same records, byte for byte in meaning
        assert all(stores[nid].store.integrity_problems() == [] for nid in nodes)
        report = await reps["a"].run_round({"b": nodes["b"].addr}, ["a", "b"])
        assert report.pulled == 0 and report.status.under_replicated == 0 and report.status.own_held_by == {"b": 8}
        await refused_both_ways(nodes["a"].addr, "GET", f"/replica/{STORE_NAME}/digest")
    finally:
        for node in nodes.values():
            await node.stop()
        for c in clients.values():
            await c.close()
        for s in stores.values():
            s.close()


@pytest.mark.slow
def test_a_writer_killed_mid_batch_leaves_whole_groups_and_a_rerun_counts_none_twice(tmp_path: Path) -> None:
    db = tmp_path / "rollouts.db"
    per_batch, n = CONFIG.rollout.batch_groups, CONFIG.rollout.n
    cmd = [sys.executable, "-m", "tests.lm_rollout_writer_job", "--db", str(db)]
    proc = subprocess.Popen([*cmd, "--batches", "1000"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        def stored() -> int:
            try:
                with RolloutStore(db, readonly=True) as s:
                    return s.count()
            except RolloutStoreError:
                return 0  # not created yet, or its tables not yet

        wait_until(lambda: stored() >= per_batch + 3, timeout=120, what="two batches under way")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with RolloutStore(db) as store:
        assert store.integrity_problems() == []
        killed_at = store.count()
        assert all(len(r.samples) == n for r in store.groups())
    batches = killed_at // per_batch + 2  # the batch that was cut, and one more
    rerun = writer_job.main(["--db", str(db), "--batches", str(batches)])  # the node restarted (in process)
    assert sum(already for _, already in rerun) == killed_at  # what the killed run stored was found, not made again
    assert sum(stored for stored, _ in rerun) == batches * per_batch - killed_at
    with RolloutStore(db) as store:
        assert store.integrity_problems() == [] and store.count() == batches * per_batch
        uids = store.uids()
        assert len(uids) == len(set(uids))


async def test_a_window_exports_to_a_dataset_a_joiner_fetches_by_its_sha256(tmp_path: Path, lm) -> None:
    with RolloutStore(tmp_path / "rollouts.db") as store:
        run_batch(lm, store, "a", 0)
        run_batch(lm, store, "a", 1)
        newest = store.groups(newest=10)
        made = export_rollouts(store, tmp_path / "a" / "lm_datasets" / "gen_0001", window_groups=10)
        with pytest.raises(RolloutDatasetError, match="already exists"):
            export_rollouts(store, made.path, window_groups=10)
        with pytest.raises(RolloutDatasetError, match="no rollouts"):
            export_rollouts(store, tmp_path / "none", window_groups=10, min_version=4)
    assert made.groups == 10 and made.samples == 10 * CONFIG.rollout.n
    assert sorted(p.name for p in made.path.parent.iterdir()) == ["gen_0001"]  # no staging left
    groups = load_rollout_dataset(made.path, expect_sha256=made.sha256)
    assert [g.to_dict() for g in groups] == [to_group(r).to_dict() for r in newest]
    node = MeshNode(node_id="a", host="127.0.0.1", port=0, data_dir=tmp_path / "a", profile="fast", secret=SECRET)
    node.add_routes(dataset_routes(made.path.parent, route="/lm_datasets", what="rollout dataset",
                                   reader=read_rollout_manifest))
    client = MeshClient(SECRET, timeout=5.0)
    await node.start()
    try:
        path, failures = await fetch_manifest_dir(client, made.sha256, [node.addr], tmp_path / "b" / "lm_datasets",
                                                  what="rollout dataset", route="/lm_datasets",
                                                  verify=verify_rollout_dataset)
        assert failures == {} and path is not None
        assert [g.to_dict() for g in load_rollout_dataset(path, made.sha256)] == [g.to_dict() for g in groups]
    finally:
        await node.stop()
        await client.close()
    data = bytearray((made.path / "groups.jsonl").read_bytes())
    data[10] ^= 0x01
    (made.path / "groups.jsonl").write_bytes(bytes(data))
    with pytest.raises(RolloutDatasetError, match="groups.jsonl: sha256 does not match"):
        load_rollout_dataset(made.path, made.sha256)

"""Rollout workers on other nodes feeding the online trainer (issue 53, item 1), in one process
with the real parts: the trainer publishes each step's weights as a verified directory with a
pointer (policy_publish.py), a "worker" loads the published directory into its own engine and
stores a self-play batch made with it in a rollout store (batches.rollout_batch, as
rollout_worker.py does), and the trainer's next steps take those groups first (remote_groups.py
through RolloutManager.offer), stamped with the version the trainer published them as, never
with what the group says, and within `max_staleness` steps. The three-node e2e test
(test_lm_workload_e2e.py) runs the same across real nodes.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from app.coordination.p2p.membership import Liveness
from app.coordination.p2p.node_status import default_capabilities
from app.coordination.p2p.schemas import NodeState
from app.coordination.p2p.view import ClusterView
from app.db.rollout_store import RolloutStore
from app.lm.causal_lm import LMModelConfig, build_model, load_model
from app.lm.model_dir import verify_model_dir
from app.lm.rollout.batches import rollout_batch
from app.lm.rollout.engine import InProcessEngine
from app.lm.tasks import DigitTask
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.train.backend import LocalBackend, OptimConfig
from app.lm.train.consumed import ConsumedGroups
from app.lm.train.grpo import GRPOConfig, grpo_loss_fn, sft_loss
from app.lm.train.mesh_rollouts import policies_kept
from app.lm.train.policy_publish import POLICY_FILE, PolicyPublisher, read_policy
from app.lm.train.remote_groups import RemoteGroups, rank_of
from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters
from app.lm.train.sft_grpo import grpo_step
from app.lm.truncation import RolloutSettings
from app.lm.workload.rollout_worker import trainer_policy

pytestmark = pytest.mark.timeout(120)
TOK = build_digit_tokenizer()
TASK = DigitTask("copy", 2, 3, "partial")  # partial credit: a random model's groups have variance
PROMPTS = TASK.make_prompts(48, 3, "train")
ROLLOUT = RolloutSettings(n=4, max_new_tokens=4, temperature=1.0, length_is_parse_failure=False)


def trainer(tmp_path: Path, staleness: int) -> tuple[LocalBackend, GeneratedGroups, PolicyPublisher, RemoteGroups]:
    torch.set_num_threads(1)
    model = build_model(LMModelConfig(seed=3), TOK)
    sampler = copy.deepcopy(model).eval()
    publisher = PolicyPublisher(tmp_path / "policies", tmp_path / "run", 2, sampler, None, keep=3)
    remote = RemoteGroups(tmp_path / "rollouts.db", publisher.versions, model.config.vocab_size)
    source = GeneratedGroups(InProcessEngine(sampler, TOK, name="trainer"), TASK, TOK, PROMPTS[:24], seed=1,
                             prompts_per_step=4, rollout=ROLLOUT, filters=LoopFilters(2.0, "drop", staleness),
                             policy=publisher, remote=remote)
    return LocalBackend(model, OptimConfig(lr=1e-3), sft_loss), source, publisher, remote


def worker_batch(tmp_path: Path, sha: str, version: int, seed: int) -> int:
    """What a rollout worker does with a published policy: load it, play a batch stamped with
    `version`, store it."""
    engine = InProcessEngine(load_model(tmp_path / "policies" / sha), TOK, weight_version=version, name="policy")
    with RolloutStore(tmp_path / "rollouts.db") as store:
        return rollout_batch(engine, TASK, TOK, PROMPTS[24:40], ROLLOUT, store, node_id="worker", model_id=sha,
                             seed=seed, model_sha256=sha).stored


def test_workers_groups_of_the_published_policy_are_trained_within_the_staleness_bound(tmp_path: Path) -> None:
    backend, source, publisher, remote = trainer(tmp_path, staleness=2)
    loss = grpo_loss_fn(GRPOConfig(tis_cap=2.0))
    (tmp_path / "run").mkdir()
    source.begin(backend, 0)  # version 0 published for the workers
    v0 = read_policy(tmp_path / "run")
    assert v0 is not None and v0["version"] == 0 and v0["generation"] == 2
    assert verify_model_dir(tmp_path / "policies" / v0["sha256"], v0["sha256"]) is None
    assert worker_batch(tmp_path, v0["sha256"], 0, seed=1) > 0
    first = grpo_step(backend, source, TOK.pad_token_id, loss, 1)
    assert first["remote_groups"] == 4 and first["staleness_groups"] == [4, 0, 0, 0]  # the workers' fill it
    mine = [g for g in source.manager.ready if g.uid in remote.uids]
    assert all(g.oldest_version == 0 for g in mine)  # carried, still version 0
    for step in (2, 3):  # the trainer's own engine and the carried groups, within 2 versions
        stats = grpo_step(backend, source, TOK.pad_token_id, loss, step)
        assert stats["staleness_groups"][-1] == 0 and sum(stats["staleness_groups"]) == 4
    # the newest published policy plays a batch, claiming version 0 (3 steps stale, past the bound):
    # the trainer stamps the version it published those weights as, 3, and takes them
    newest = read_policy(tmp_path / "run")
    assert newest is not None and newest["version"] == 3
    assert worker_batch(tmp_path, newest["sha256"], 0, seed=2) > 0
    stats = grpo_step(backend, source, TOK.pad_token_id, loss, 4)
    assert stats["remote_groups"] == 4 and stats["staleness_groups"][0] == 4  # version 3 = step 4 - 1
    assert len(publisher.published) == 3 and len(list((tmp_path / "policies").iterdir())) == 3  # keep 3


def test_groups_of_weights_the_trainer_did_not_publish_or_too_stale_are_never_taken(tmp_path: Path) -> None:
    backend, source, publisher, remote = trainer(tmp_path, staleness=0)
    (tmp_path / "run").mkdir()
    source.begin(backend, 0)
    sha0 = read_policy(tmp_path / "run")["sha256"]  # type: ignore[index]
    worker_batch(tmp_path, sha0, 0, seed=1)
    with RolloutStore(tmp_path / "rollouts.db") as store:  # a group claiming an unknown sha256
        forged = store.groups()[0].model_copy(update={"uid": "f" * 32, "model_sha256": "e" * 64})
        store.add_group(forged)
    loss = grpo_loss_fn(GRPOConfig(tis_cap=2.0))
    grpo_step(backend, source, TOK.pad_token_id, loss, 1)  # takes version 0's groups (step 1: on-policy)
    stats = grpo_step(backend, source, TOK.pad_token_id, loss, 2)  # version 0 is now 1 step old: bound 0
    assert stats["remote_groups"] == 0 and stats["staleness_groups"] == [4, 0]
    assert "f" * 32 not in remote.uids


def test_ranks_split_the_workers_groups_and_the_gossiped_policy_is_validated() -> None:
    uids = [f"{i:032x}" for i in range(200)]
    owners = [rank_of(u, 2) for u in uids]
    assert set(owners) == {0, 1} and all(rank_of(u, 2) == o for u, o in zip(uids, owners))  # pure, both used

    def state(nid: str, policy: object) -> NodeState:
        return NodeState(node_id=nid, addr=f"127.0.0.1:{len(nid)}", capabilities=default_capabilities(),
                         inventory={"lm_training": {"policy": policy}})

    good = {"generation": 3, "version": 7, "sha256": "a" * 64}
    nodes = {"me": state("me", {**good, "version": 9}), "t": state("t", good),
             "bad": state("bad", {"generation": 3, "version": 8, "sha256": "../etc"}),
             "old": state("old", {**good, "generation": 2, "version": 50})}
    view = ClusterView(self_id="me", term=1, leader=None, nodes=nodes, liveness={n: Liveness.ALIVE for n in nodes})
    assert trainer_policy(view, "me") == ("t", good)  # not our own, not malformed, the newest generation


def test_a_resumed_publisher_keeps_its_versions_and_a_new_run_sweeps_the_old_ones(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model = build_model(LMModelConfig(seed=3), TOK)
    (tmp_path / "run").mkdir()
    first = PolicyPublisher(tmp_path / "policies", tmp_path / "run", 2, model, None)
    sha = first(0, model.state_dict())
    again = PolicyPublisher(tmp_path / "policies", tmp_path / "run", 2, model, None)  # the run resumed
    assert again.versions() == {sha: 0} and (tmp_path / "policies" / sha).is_dir()
    (tmp_path / "next").mkdir()
    PolicyPublisher(tmp_path / "policies", tmp_path / "next", 3, model, None)  # the next generation's run
    assert not (tmp_path / "policies" / sha).exists()
    assert json.loads((tmp_path / "run" / POLICY_FILE).read_text())["published"] == [[0, sha]]


def test_a_trainer_that_stays_takes_the_groups_of_its_last_runs_policies(tmp_path: Path) -> None:
    """A worker still playing the last generation's policy when that run ended: the next run of a
    trainer that stays inherits those policies renumbered (its candidate is version 0 again) and
    takes the groups within `max_staleness`, where a new trainer's run sweeps them; what the last
    run read of them is carried in the consumed record and never taken again."""
    backend, source, publisher, remote = trainer(tmp_path, staleness=2)
    loss = grpo_loss_fn(GRPOConfig(tis_cap=2.0))
    (tmp_path / "run").mkdir()
    source.begin(backend, 0)
    v0 = read_policy(tmp_path / "run")["sha256"]  # type: ignore[index]
    assert worker_batch(tmp_path, v0, 0, seed=1) > 0
    assert grpo_step(backend, source, TOK.pad_token_id, loss, 1)["remote_groups"] > 0
    grpo_step(backend, source, TOK.pad_token_id, loss, 2)
    last = publisher.versions()
    assert sorted(last.values()) == [0, 1, 2]
    (tmp_path / "run2").mkdir()
    stays = PolicyPublisher(tmp_path / "policies", tmp_path / "run2", 3, publisher.model, None, keep=3,
                            inherited=publisher.carried(last_version=2))
    assert stays.versions() == {sha: version - 2 for sha, version in last.items()}
    read = remote.read_of(stays.versions())
    assert remote.uids and remote.uids <= read  # what run 1 trained of version 0's groups
    consumed = ConsumedGroups(tmp_path / "run2")
    consumed.carry(read)
    assert ConsumedGroups(tmp_path / "run2").uids == read  # durable: a resume after a kill excludes them too
    one_back = next(sha for sha, version in last.items() if version == 1)
    assert worker_batch(tmp_path, one_back, 1, seed=5) > 0  # made from the last run's version 1, now -1
    following_remote = RemoteGroups(tmp_path / "rollouts.db", stays.versions, publisher.model.config.vocab_size,
                                    exclude=consumed.uids)
    following = GeneratedGroups(source.engine, TASK, TOK, PROMPTS[:24], seed=2, prompts_per_step=4, rollout=ROLLOUT,
                                filters=LoopFilters(2.0, "drop", 2), policy=stays, remote=following_remote,
                                consumed=consumed)
    following.begin(backend, 0)
    assert read_policy(tmp_path / "run2")["sha256"] == next(s for s, v in last.items() if v == 2)  # type: ignore[index]
    stats = grpo_step(backend, following, TOK.pad_token_id, loss, 1)
    taken = stats["remote_groups"]  # the worker's groups with a signal (zero-variance ones dropped), one step old
    assert taken >= 2 and stats["staleness_groups"] == [4 - taken, taken, 0, 0]
    assert not following_remote.uids & read


def test_a_large_models_trainer_publishes_every_few_steps(tmp_path: Path) -> None:
    """`lm.rollout.publish_every`: each policy is the whole model on disk."""
    model = build_model(LMModelConfig(seed=3), TOK)
    (tmp_path / "run").mkdir()
    publisher = PolicyPublisher(tmp_path / "policies", tmp_path / "run", 2, model, None, keep=4, every=3)
    state = model.state_dict()
    published = [publisher(version, {k: v + version if v.is_floating_point() else v for k, v in state.items()})
                 is not None for version in range(7)]
    assert published == [True, False, False, True, False, False, True]
    assert sorted(publisher.versions().values()) == [0, 3, 6]
    assert policies_kept(12, every=3) == 5 and policies_kept(12) == 13


def test_a_policy_stays_published_as_long_as_its_groups_may_be_taken() -> None:
    """A worker that saw a version late still finds its directory while its groups are within
    `max_staleness` (a dropped one is a 404 and a lost batch), bounded as each is a full copy."""
    assert [policies_kept(s) for s in (0, 3, 6, 12, 1000)] == [4, 4, 7, 13, 16]

"""The language-model workload on the same orchestrator and mesh as Connect Four (issue 14):
real nodes, real torchrun training, real rollout stores. GRPO runs online (configs/lm_copy.yaml,
issue 53): each generation's trainer generates its groups from its own newest weights.

- One node: kill -9 while it writes rollouts (nothing half-written, nothing twice), then it
  learns: generation 1 (SFT on the task's demonstrations) lifts held-out exact match from the
  random init's ~0 to >= 0.6, a GRPO generation is trained from it and decided, /progress shows
  held-out reward by generation with its interval and /status the engine's weight version.
- One trainer and two rollout-only nodes, a rollout node (the leader) and later the trainer killed -9
  mid-run (the generation trained again from its checkpoint; the consumed records keep every
  group uid to one training): generations keep being decided, one model per generation,
  every node ends on the same weights and the same engine weight version, and rollouts are
  replicated between the nodes as games are. The nodes without the training claim are rollout
  workers of the online trainer (issue 53): groups they made from its published policy are
  trained, and every step keeps within `max_staleness` trainer steps.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path

import psutil
import pytest
import yaml

from app.coordination.pipeline.generation_log import GenerationRecord, trainer_head
from app.db.registry import ModelRegistry
from app.db.rollout_store import RolloutStore
from app.lm.model_dir import verify_model_dir
from app.lm.train.policy_publish import POLICIES_DIR
from app.shared.json_lines import parse_line
from tests.orchestrator_helpers import (
    BUSY_CPU_TIMING, ROOT, NodeFiles, get_json, kill_group, leader_of, nodes_running, start_node, start_voter,
    tail, wait_until, write_node_files,
)

pytestmark = pytest.mark.slow


def lm_config(**overrides) -> dict:
    """configs/lm_copy.yaml, smaller: generation 1 is 40 SFT steps (greedy exact ~0.97), later
    generations 10 GRPO steps on 64 fresh groups; 32 held-out prompts."""
    cfg = yaml.safe_load((ROOT / "configs" / "lm_copy.yaml").read_text())
    lm = cfg["lm"]
    lm["task"]["heldout_prompts"] = 32
    lm["grpo"]["steps"] = 10
    lm["grpo"]["sft"]["steps"] = 40
    lm["export"] = {"min_new_groups": 32, "window_groups": 64}
    return {**cfg, **overrides}


LM_DAEMONS = {
    "restart": {"base_s": 0.5, "cap_s": 5},
    "daemons": {
        "dlq_retry": {},
        "selfplay": {"critical": True, "stop_timeout_s": 15},
        "export": {"critical": True, "settings": {"poll_s": 0.5, "sync_budget_s": 20}},
        "train": {"depends_on": ["export"], "critical": True, "stop_timeout_s": 15, "settings": {"poll_s": 0.5}},
        "gauntlet": {"depends_on": ["train"], "critical": True, "settings": {"poll_s": 0.5}},
        "promote": {"depends_on": ["gauntlet"], "critical": True, "settings": {"poll_s": 0.5}},
        "distribution": {"critical": True, "settings": {"poll_s": 0.5}},
        "replication": {"settings": {"interval_s": 0.5}},
    },
}


def _rollouts(files: NodeFiles) -> int:
    path = files.data_dir / "rollouts.db"
    if not path.exists():
        return 0
    with RolloutStore(path, create=False) as store:
        return store.count()


def _check_rollouts(files: NodeFiles, node_id: str) -> int:
    """Whole groups only, each stored once; returns how many."""
    with RolloutStore(files.data_dir / "rollouts.db", create=False) as store:
        assert store.integrity_problems() == []
        uids = store.uids()
        assert len(uids) == len(set(uids)) == store.count() == store.count(node_id)
        return len(uids)


def _check_online_runs(files: NodeFiles) -> list[dict]:
    """`lm.grpo.rollouts: online` (configs/lm_copy.yaml): every GRPO step of every generation trained the
    config's groups, none older than `lm.rollout.max_staleness` trainer steps (the last bucket
    of the step's staleness histogram), and no group uid twice in a run (its consumed record).
    Returns the runs' results."""
    results = []
    for run in sorted((files.data_dir / "runs").glob("gen_*")):
        if not (run / "result.json").exists():
            continue
        results.append(json.loads((run / "result.json").read_text()))
        assert results[-1]["rollouts"] == "online", results[-1]
        steps = _rl_steps(run)
        if results[-1]["parent_sha256"] is None:  # generation 1 of sft+rl: SFT alone, no GRPO step
            assert results[-1]["sft_steps"] > 0 and results[-1]["rl_steps"] == 0 and not steps, results[-1]
            continue
        assert steps and all(m["staleness_groups"][-1] == 0 and sum(m["staleness_groups"]) == 8 for m in steps), run
        uids = [u for f in (run / "consumed").glob("rank_*.jsonl") for line in f.read_text().splitlines()
                for u in json.loads(line)["uids"]]
        assert len(uids) == len(set(uids)) >= 8 * len({m["step"] for m in steps}), run
    return results


def _decided(files: NodeFiles) -> int:
    path = files.data_dir / "registry.db"
    if not path.exists():
        return 0
    with ModelRegistry(path, create=False) as registry:
        return sum(m.status.value in ("promoted", "rejected") or m.promoted_at is not None
                   for m in registry.models() if m.generation > 0)


@pytest.mark.timeout(1200)  # generous bounds (deadlines on state): two busy cores
def test_lm_node_survives_kill9_while_writing_rollouts_then_learns(tmp_path) -> None:
    cfg = lm_config()
    cfg["lm"]["eval"] = {**cfg["lm"].get("eval", {}), "rollback_margin": 1.0}  # every rejection keeps the head
    files = write_node_files(tmp_path / "lm", "lm", cfg, LM_DAEMONS)
    proc = start_node(files)
    try:
        wait_until(lambda: _rollouts(files) >= 40, 300, what="rollouts being written")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        before = _check_rollouts(files, "lm")

        proc = start_node(files)  # the same data dir: it carries on
        wait_until(lambda: _rollouts(files) >= before + 32, 300, what="rollouts after the restart")
        # (the trainer's kill -9 mid-run and its resume: the three-node test below)
        wait_until(lambda: _decided(files) >= 2, 900, interval=1.0, what="two decided generations")

        progress = get_json(files.mesh_port, "/progress")
        assert progress is not None
        heldout = {row["generation"]: row for row in progress["heldout"]}
        assert heldout[0]["exact_match"] < 0.15, heldout  # the random init
        for row in heldout.values():
            low, high = row["interval"]
            assert 0.0 <= low <= row["reward"] <= high <= 1.0, row
        state = files.state()
        best = state["best_generation"]
        assert best >= 1 and heldout[best]["exact_match"] >= 0.6, heldout
        assert state["best_path"] == f"lm_models/{state['best_sha256']}"  # relative to the data dir
        assert verify_model_dir(files.data_dir / state["best_path"], state["best_sha256"]) is None

        status = wait_until(lambda: (s := get_json(files.mesh_port, "/status")) and s["inventory"].get("lm_engines")
                            and s, 30, what="/status with the engines")
        assert status["inventory"]["lm_engines"]["local"]["weight_version"] == best
        assert status["inventory"]["lm_engines"]["local"]["sha256"] == state["best_sha256"]
        # the dashboard's LM panel: what the node trains from, held-out reward by generation
        panel = wait_until(lambda: ((get_json(files.health_port, "/dashboard.json") or {}).get("workload") or {})
                           .get("heldout"), 30, what="the dashboard's LM panel") and \
            get_json(files.health_port, "/dashboard.json")["workload"]
        own = {r["node_id"]: r for r in panel["training"]}["lm"]
        assert own["trains_from"]["model"] in ("head", "best") and own["trains_from"]["generation"] >= 1, own
        assert {r["generation"] for r in panel["heldout"]} >= {0, 1}, panel["heldout"]
        # retention (pipeline/retention.py): the heads installed at each rejection leave the model
        # store once superseded, decided runs but the best's and the head's lose their checkpoints
        wait_until(lambda: _retained(files), 60, interval=1.0, what="only the kept models and checkpoints on disk")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, tail(files)
    except AssertionError:
        print(tail(files, 6000))
        raise
    finally:
        kill_group(proc)
    assert _check_rollouts(files, "lm") > before
    # generation 2 and later train GRPO on from the one before, promoted or not (the trainer's
    # head; no rejection regresses past a margin of 1 reward): its run names the parent
    results = _check_online_runs(files)
    assert any(r["generation"] >= 2 and r["parent_sha256"] and r["rl_steps"] > 0 for r in results), results
    candidates = {r["generation"]: r["candidate_sha256"] for r in results}
    assert all(r["parent_sha256"] == candidates[r["generation"] - 1] for r in results if r["generation"] >= 2), results
    # a node without peers has no rollout workers elsewhere: its trainer published no policy
    assert not (files.data_dir / POLICIES_DIR).exists(), sorted((files.data_dir / POLICIES_DIR).iterdir())


def _retained(files: NodeFiles) -> bool:
    """The model store holds only the best, the head and promoted models; no decided run but the
    best's and the head's has a checkpoint left (read while the node runs: polled)."""
    state = files.state()
    with ModelRegistry(files.data_dir / "registry.db") as registry:
        promoted = {m.sha256 for m in registry.models() if m.promoted_at is not None}
    kept = promoted | {state.get("best_sha256"), state.get("head_sha256")}
    installed = {p.name for p in (files.data_dir / "lm_models").iterdir() if len(p.name) == 64}
    protected = {state.get("best_generation"), state.get("head_generation") if state.get("head_sha256") else None}
    runs = [r for r in (files.data_dir / "runs").glob("gen_*") if int(r.name[4:]) < state["generation"]
            and int(r.name[4:]) not in protected]
    return installed <= kept and not any((r / "rl").exists() or (r / "sft").exists() for r in runs)


def _grpo_run_at(files: NodeFiles, step: int) -> Path | None:
    """A GRPO run (generation >= 2) of this node that logged `step` and has not finished."""
    for run in sorted((files.data_dir / "runs").glob("gen_*")):
        if run.name != "gen_0001" and not (run / "result.json").exists() and \
                any(m.get("step", 0) >= step for m in _rl_steps(run)):
            return run
    return None


def _kill_trainer(node_pid: int) -> list[int]:
    """SIGKILL every process of the node's training run (launcher, torchrun, ranks)."""
    killed = []
    for child in psutil.Process(node_pid).children(recursive=True):
        try:
            if any("app.lm.train.generation" in part for part in child.cmdline()):
                child.send_signal(signal.SIGKILL)
                killed.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return killed


IDS = ["m0", "m1", "m2"]


WORKER_STALENESS = 12


def _rl_steps(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    lines = []
    for text in path.read_text().splitlines() if path.exists() else []:
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue  # a line being written, or torn by the kill
    return [m for m in lines if m.get("phase") == "rl"]


def _worker_groups_trained(files: NodeFiles) -> list[tuple[str, str]]:
    """(trainer node, maker node) of each group a GRPO run on this node trained that a rollout
    worker made: the run's consumed uids found in the node's rollout store (the trainer's own
    groups are never stored), with the node that stored them first."""
    out = []
    for run in sorted((files.data_dir / "runs").glob("gen_*")):
        uids = [u for f in (run / "consumed").glob("rank_*.jsonl") for line in f.read_text().splitlines()
                if line.endswith("]}") for u in json.loads(line)["uids"]]  # not a line being appended
        if not uids or not (files.data_dir / "rollouts.db").exists():
            continue
        with RolloutStore(files.data_dir / "rollouts.db", create=False) as store:
            out += [(files.root.name, r.node_id) for r in store.groups(uids=uids)]
    return out


def _records(files: NodeFiles) -> list[dict]:
    progress = get_json(files.mesh_port, "/progress")
    return progress["generations"] if progress else []


TRAINER_ONLY = ("export", "train", "gauntlet", "promote")  # the daemons of the one trainer node
ROLE_DAEMONS = {**LM_DAEMONS, "daemons": {
    name: {**spec, "roles": ["trainer"] if name in TRAINER_ONLY else ["trainer", "rollout"]}
    for name, spec in LM_DAEMONS["daemons"].items()}}


@pytest.mark.timeout(1800)
def test_one_trainer_and_two_rollout_nodes_learn_through_a_rollout_node_kill_and_a_trainer_kill(
        tmp_path: Path, monkeypatch) -> None:
    """Issue 53's three-node acceptance: m0 trains (the one node with export, train and the gate),
    m1 and m2 only make rollout groups from its newest policy. m2, the leader by priority, is
    killed -9 while the trainer's GRPO run is mid-step; later the trainer itself (launcher and
    ranks). Training resumes from its checkpoint, no group id is trained twice, every step within
    the staleness bound, and a GRPO generation is promoted over the SFT model (held-out reward
    above it by the gate's sign test); m2, back, ends on the newest model as every node."""
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    cfg = lm_config(mesh={"timing": BUSY_CPU_TIMING})
    # rollout workers' groups travel gossip -> fetch -> a batch -> replication before the trainer
    # reads them: several trainer steps of this tiny model on two shared cores, so the bound is
    # WORKER_STALENESS steps here, and a run is long enough to take them
    cfg["lm"]["rollout"]["max_staleness"] = WORKER_STALENESS
    cfg["lm"]["grpo"]["steps"] = 30
    cfg["lm"]["grpo"]["sft"]["steps"] = 28  # configs/lm_copy.yaml's: ~0.5 exact, room above it (40: ~0.97)
    roles = {"m0": "trainer", "m1": "rollout", "m2": "rollout"}
    nodes = [write_node_files(tmp_path / nid, nid, cfg, ROLE_DAEMONS) for nid in IDS]
    procs = {nid: start_voter(nodes, IDS, i, "--role", roles[nid]) for i, nid in enumerate(IDS)}
    trainer = nodes[0]
    with nodes_running(nodes, procs, stop_timeout=35):
        wait_until(lambda: leader_of(nodes), 120, what="a leader")
        wait_until(lambda: _grpo_run_at(trainer, 2), 600, interval=0.5, what="the trainer's GRPO run mid-step")
        os.killpg(procs["m2"].pid, signal.SIGKILL)  # a rollout node (the leader, by priority)
        procs["m2"].wait(timeout=10)
        assert wait_until(lambda: leader_of(nodes[:2]), 120, what="a leader of the two left") != "m2"

        def killed_mid_run() -> tuple[Path, int] | None:
            """A GRPO run past step 2 whose trainer was killed before it finished (its steps are
            ~0.1 s: a run found mid-step may be over by the kill; then the next one is taken)."""
            run = _grpo_run_at(trainer, 2)
            if run is None or not _kill_trainer(procs["m0"].pid):
                return None
            done = len({m["step"] for m in _rl_steps(run)})
            return (run, done) if not (run / "result.json").exists() and done < cfg["lm"]["grpo"]["steps"] else None

        run, done = wait_until(killed_mid_run, 600, interval=0.3, what="the trainer killed in a GRPO run mid-step")
        result = wait_until(lambda: (f := run / "result.json").exists() and json.loads(f.read_text()), 600,
                            interval=1.0, what="the killed run resumed and finished")
        assert result["rl_steps"] == cfg["lm"]["grpo"]["steps"] > done  # resumed from its checkpoint
        log = (run / "launcher.log").read_text()  # started twice: launched or handed over, then after the kill
        assert log.count("rank 0 started") + log.count("handed to the running trainer") >= 2, run
        wait_until(lambda: any(r["promoted"] and r["generation"] >= 2 for r in _records(trainer)), 900,
                   interval=1.0, what="a GRPO generation promoted over the SFT model")
        procs["m2"] = start_voter(nodes, IDS, 2, "--role", "rollout")  # back: it must catch up

        def settled() -> bool:
            records = [_records(f) for f in nodes]
            newest = max((r["generation"], r["sha256"]) for rs in records for r in rs if r["promoted"])
            engines = [(get_json(f.mesh_port, "/status") or {}).get("inventory", {}).get("lm_engines", {}) for f in nodes]
            return ({f.state().get("best_sha256") for f in nodes} == {newest[1]}
                    and all(e.get("local", {}).get("weight_version") == newest[0] for e in engines))

        wait_until(settled, 300, interval=1.0, what="every node on the newest promoted model and weight version")
        wait_until(lambda: {maker for _, maker in _worker_groups_trained(trainer)} - {"m0"}, 600, interval=2.0,
                   what="a GRPO run that trained groups a rollout node made")

    # the leader's kill kept the training claim: the new leader adopted it, nothing was claimed twice
    events = [e for e in (parse_line(line) for line in (trainer.root / "node.log").read_text().splitlines()) if e]
    claimed = [e["generation"] for e in events if e.get("event") == "generation_claimed"]
    assert claimed and len(claimed) == len(set(claimed)), claimed
    assert not [e for e in events if e.get("event") in ("generation_claim_lost", "decision_not_committed")]
    records = {r["generation"]: r for r in json.loads((trainer.data_dir / "generations.json").read_text())}
    sft = records[1]["heldout"]
    grpo = [r for g, r in records.items() if g >= 2 and r["promoted"]]
    assert grpo and all(r["heldout"]["reward"] > sft["reward"] for r in grpo), (sft, grpo)
    for files in nodes[1:]:  # rollout-only: no dataset, run or candidate of their own
        assert not (files.data_dir / "runs").exists() and files.state().get("promoted", 0) == 0
    by_generation: dict[int, set[str]] = {}
    for files in nodes:
        for rec in json.loads((files.data_dir / "generations.json").read_text()):
            by_generation.setdefault(rec["generation"], set()).add(rec["sha256"])
    assert by_generation and all(len(shas) == 1 for shas in by_generation.values()), by_generation
    # every run trained from the head the decided records name (the best, or a rejected candidate
    # kept as the trainer's head)
    decided = {g: GenerationRecord.from_value(r) for g, r in records.items()}
    results = [json.loads(f.read_text()) for f in (trainer.data_dir / "runs").glob("gen_*/result.json")]
    for result in results:
        head = trainer_head({g: r for g, r in decided.items() if g < result["generation"]})
        assert result["parent_sha256"] == (head.sha256 if head else None), (result, decided)
    # the trainer stayed between generations (resident_trainer.py): one was handed its next
    # generation and trained on with the weights and optimizer it held, without a launch
    assert any((r.get("continued_from") or {}).get("in_memory") for r in results), results
    union: set[str] = set()
    created = replicated = 0
    for files in nodes:
        with RolloutStore(files.data_dir / "rollouts.db", create=False) as store:
            assert store.integrity_problems() == []
            uids = store.uids()
            assert len(uids) == len(set(uids))
            created += store.count(files.root.name)
            replicated += len(uids) - store.count(files.root.name)
            union |= set(uids)
    assert len(union) == created  # no group lost or stored under two uids
    assert replicated > 0  # rollouts travel between nodes as games do
    lines = [json.loads(line) for run in (trainer.data_dir / "runs").glob("gen_*")
             for f in (run / "consumed").glob("rank_*.jsonl") for line in f.read_text().splitlines() if line.endswith("}")]
    trained = [u for line in lines if not line.get("carried") for u in line["uids"]]  # carried: the last run's
    assert trained and len(trained) == len(set(trained))  # no group id trained twice, across the kills
    for run in (trainer.data_dir / "runs").glob("gen_*"):  # every GRPO step within the staleness bound
        steps = _rl_steps(run)
        assert all(m["staleness_groups"][-1] == 0 and len(m["staleness_groups"]) == WORKER_STALENESS + 2
                   for m in steps), run


@pytest.mark.timeout(1200)
def test_two_lm_nodes_span_one_generations_training(tmp_path: Path, monkeypatch) -> None:
    """The claimant's GRPO run spans both nodes (FSDP2 over gloo, world size 2): the joiner
    fetches the rollout dataset by its sha256 and runs node rank 1 of the same launch."""
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    ids = ["s0", "s1"]
    cfg = lm_config(train={"nproc": 1, "max_nodes": 2, "span_cpu_nodes": True, "join_timeout_s": 150},
                    mesh={"timing": {**BUSY_CPU_TIMING, "claim_ttl": 30.0}})
    cfg["lm"]["grpo"]["sft"]["steps"] = 12  # about the span, not the model: generation 1's SFT is the run
    daemons = {**LM_DAEMONS, "daemons": {**LM_DAEMONS["daemons"],
                                         "train_join": {"settings": {"poll_s": 0.5}, "stop_timeout_s": 15}}}
    nodes = [write_node_files(tmp_path / nid, nid, cfg, daemons) for nid in ids]
    procs = [start_node(files, "--voters", ids[0], "--peers", f"{ids[1 - i]}@127.0.0.1:{nodes[1 - i].mesh_port}",
                        "--priority", str(i), "--profile", "fast") for i, files in enumerate(nodes)]

    def spanned() -> tuple[NodeFiles, dict, dict] | None:
        for claimant, joiner in ((nodes[0], nodes[1]), (nodes[1], nodes[0])):
            for joined in (joiner.data_dir / "runs").glob("join_gen_*/join_result.json"):
                generation = int(joined.parent.name.rsplit("_", 1)[1])
                result = claimant.data_dir / "runs" / f"gen_{generation:04d}" / "result.json"
                if result.exists():
                    return joiner, json.loads(joined.read_text()), json.loads(result.read_text())
        return None

    with nodes_running(nodes, procs, stop_timeout=35, tail_chars=4000):
        joiner, joined, result = wait_until(spanned, 900, interval=1.0, what="a generation trained by both nodes")
    assert result["world_size"] == 2 and joined["status"] == "completed" and joined["nnodes"] == 2, (result, joined)
    assert joined["dataset_sha256"] == result["dataset_sha256"]
    dataset = joiner.data_dir / "datasets" / result["dataset_sha256"]
    assert (dataset / "groups.jsonl").exists()  # the claimant's rollouts, fetched by sha256

"""Terms that cannot be exhausted or wedged (issue 45, item 1), on real nodes on 127.0.0.1.

One correctly signed message claiming a term far ahead of every other voter's (2**53, the old
wire bound, or just beyond the bounded step) is refused with a reason, counted and shown,
whichever path it takes (heartbeat, commit, commit/read, commit/decided, vote, pre-vote, an
answer); elections go on afterwards; a persisted term is held to the same rule at start-up."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from app.config import ConfigError
from app.coordination.p2p.election import TERM_ALERT, TERM_CEILING, term_refusal
from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.persist import TermStore
from app.coordination.p2p.schemas import MAX_TERM
from tests.mesh_helpers import wait_for
from tests.test_mesh_hostile import durable, send, settled, trio  # noqa: F401 - trio: the fixture

pytestmark = pytest.mark.timeout(120)
SECRET = b"hostile-test-secret"  # test_mesh_hostile's: `send` signs with it


def test_the_rule_refuses_far_ahead_and_above_the_ceiling_and_allows_honest_steps() -> None:
    assert term_refusal(5, 5, [5, 5], 1000) is None  # not an adoption
    assert term_refusal(6, 5, [5], 1000) is None  # the next election
    assert term_refusal(900, 5, [], 1000) is None  # within the step of our own
    assert term_refusal(5000, 5, [4990], 1000) is None  # a rejoining voter follows the others
    assert "more than 1000 above" in (term_refusal(2000, 5, [7], 1000) or "")
    assert "ceiling" in (term_refusal(TERM_CEILING + 1, TERM_CEILING, [TERM_CEILING], 1000) or "")
    assert "ceiling" in (term_refusal(MAX_TERM, 0, [MAX_TERM], 10**20) or "")
    assert TERM_ALERT < TERM_CEILING < MAX_TERM


async def metric(node: MeshNode, reason: str) -> float:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{node.addr}/metrics") as r:
            text = await r.text()
    for line in text.splitlines():
        if line.startswith("mesh_refusals_total{") and f'reason="{reason}"' in line and 'direction="in"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_one_signed_message_with_a_huge_term_is_refused_on_every_path_and_elections_go_on(
        trio: list[MeshNode]) -> None:
    leader = await settled(trio)
    target, other = [n for n in trio if n is not leader]
    term = leader.term
    kept = {n.node_id: durable(n) for n in trio}
    bombs = [  # each correctly signed by the voter it names
        ("/heartbeat", {"term": 2**53, "leader_id": other.node_id}),
        ("/heartbeat", {"term": term + 100_000, "leader_id": other.node_id}),
        ("/commit", {"term": 2**53, "leader_id": other.node_id, "key": "generation/1", "value": "evil"}),
        ("/commit/read", {"term": 2**53 - 1, "leader_id": other.node_id, "key": "generation/1"}),
        ("/commit/decided", {"term": TERM_CEILING + 1, "leader_id": other.node_id, "key": "generation/1",
                             "value": "evil"}),
        ("/vote", {"term": 2**53, "candidate_id": other.node_id, "priority": 99}),
        ("/vote", {"term": 2**53, "candidate_id": other.node_id, "priority": 99, "pre_vote": True}),
    ]
    for path, body in bombs:
        status, data = await send(target, path, body, other.node_id)
        assert status in (200, 409), (path, data)
        assert data.get("ok") is False or data.get("stored") is False or data.get("granted") is False, (path, data)
        reason = data.get("reason", "")
        if path == "/commit/decided":  # no term is adopted from it: it is taken on its certificate alone
            assert "no ack certificate" in reason, data
            continue
        assert path == "/commit/read" or "above every other voter's" in reason or "ceiling" in reason, (path, data)
    assert target.term == term and target.leader_id == leader.node_id
    assert {n.node_id: durable(n) for n in trio} == kept  # nothing persisted
    status = target.status()["terms"]
    assert status["refused"] == len(bombs) - 1 and status["last_refused"]["from"] == other.node_id
    assert await metric(target, "term_far_ahead") == len(bombs) - 1

    # the cluster still elects: the leader hands over, the new leader's term is the next one
    assert await leader.consensus.transfer_leadership(target.node_id, {n.node_id for n in trio}) is None
    new = await settled(trio, 30.0)
    assert term < new.term <= term + 3  # honest steps, not 2**53


async def test_a_bomb_in_an_answer_is_refused(trio: list[MeshNode]) -> None:
    """The caller side: a voter's answer naming a huge term (as a lying or broken voter would
    send) is refused by the same rule, not adopted."""
    leader = await settled(trio)
    other = next(n for n in trio if n is not leader)
    term = leader.term
    leader.consensus.observe_answer(other.node_id, 2**53)
    leader.consensus.observe_answer(other.node_id, term + 5000)
    assert leader.term == term and leader.is_leader
    assert leader.status()["terms"]["refused"] == 2


async def test_a_persisted_term_is_held_to_the_same_rule_at_start_up(tmp_path: Path) -> None:
    poisoned = tmp_path / "poisoned"
    poisoned.mkdir()
    (poisoned / "mesh_term.json").write_text(json.dumps({"current_term": 2**53, "voted_for": None,
                                                         "incarnation": 3}))
    with pytest.raises(ConfigError, match=r"mesh_term.json: term 9007199254740992 is outside 0\.\.4503599627370496"):
        TermStore(poisoned / "mesh_term.json")
    node = MeshNode(node_id="solo", host="127.0.0.1", port=0, data_dir=poisoned, profile="fast", secret=SECRET)
    with pytest.raises(ConfigError, match="poisoned message or a corrupt file"):
        await node.start()

    # a lone voter just below the ceiling (past the alert) still elects itself: room is left
    high = tmp_path / "high"
    high.mkdir()
    (high / "mesh_term.json").write_text(json.dumps({"current_term": TERM_CEILING - 1, "incarnation": 1}))
    node = MeshNode(node_id="solo", host="127.0.0.1", port=0, data_dir=high, profile="fast", secret=SECRET)
    await node.start()
    try:
        async def leads() -> bool:
            return node.is_leader
        await wait_for(leads, 20.0)
        assert node.term == TERM_CEILING and node.status()["terms"]["alert"] is True
    finally:
        await node.stop()


def test_the_mesh_history_is_stamped_timestamp_and_old_ts_lines_still_read(tmp_path: Path) -> None:
    """mesh_history.jsonl uses `timestamp` as every file the node writes; a line written before
    (an epoch `ts`) is still read by the same reader."""
    import time

    from app.coordination.p2p.persist import HistoryLog, read_history
    from app.log import epoch_of

    path = tmp_path / "mesh_history.jsonl"
    path.write_text(json.dumps({"ts": 1_700_000_000.5, "node": "n0", "term": 1, "event": "became_leader"}) + "\n")
    before = time.time()
    HistoryLog(path, "n0").append("stepped_down", 2, reason="shutdown")
    old, new = read_history(path)
    assert "ts" not in new and new["timestamp"].endswith("Z") and new["reason"] == "shutdown"
    assert epoch_of(old) == 1_700_000_000.5 and before - 1e-3 <= epoch_of(new) <= time.time()

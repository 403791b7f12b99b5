"""Events that mean something: each type is published by the node itself, the journal is the
I/O handler the dead-letter queue protects, mesh changes become events, daemons wake on them."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import yaml

from app.config import Settings
from app.coordination.daemons.event_journal import EventJournal
from app.coordination.daemons.event_router import EventRouter
from app.coordination.daemons.events import EventType
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.pipeline.context import wait_for_wake, wake_on
from app.workloads import pipeline_context
from app.coordination.pipeline.mesh_events import MeshSnapshot, mesh_changes
from app.coordination.pipeline.runner_settings import ExportSettings, SelfplaySettings
from app.coordination.pipeline.runners import export_daemon, pipeline_runners, selfplay_daemon
from app.coordination.pipeline.state import Stage
from app.db.dead_letters import DeadLetterStore
from app.db.replay_db import GameRecord, MoveRecord, ReplayDB
from app.log import epoch_of, get_logger

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[1]
SHA = "ab" * 32


def test_every_event_type_is_published_by_the_node_not_only_by_tests() -> None:
    source = "\n".join(p.read_text() for p in (REPO / "app").rglob("*.py") if p.name != "events.py")
    unpublished = [t.name for t in EventType if not re.search(rf"EventType\.{t.name}\b", source)]
    assert unpublished == []


async def test_journal_failure_goes_to_the_dead_letter_queue_and_a_retry_writes_once(tmp_path) -> None:
    blocker = tmp_path / "journal"
    blocker.write_text("a file where the journal's directory should be")  # the write fails
    letters = DeadLetterStore(tmp_path / "dlq.db")
    now = [1_000.0]
    router = EventRouter(dead_letters=letters, clock=lambda: now[0])
    journal = EventJournal(blocker / "events.jsonl")
    journal.subscribe(router)
    try:
        result = await router.publish(EventType.TRAINING_FAILED, {"generation": 3, "node_id": "n1", "error": "oom"})
        assert result.failed == 1
        assert [letter.handler for letter in letters.letters()] == ["event_journal"]

        blocker.unlink()  # the operator frees the path; the retry daemon's next round delivers
        now[0] += 3600.0
        report = await router.retry_due()
        assert report.delivered == 1
        await journal.record(result.event)  # a second delivery of the same event writes nothing
        lines = [json.loads(line) for line in (blocker / "events.jsonl").read_text().splitlines()]
        assert [(e["type"], e["payload"]["generation"]) for e in lines] == [("training_failed", 3)]
        # the one format of every file the node writes: JSON lines stamped `timestamp` (ISO, UTC)
        assert "t" not in lines[0] and lines[0]["timestamp"].endswith("Z")
        assert abs(epoch_of(lines[0]) - result.event.published_at) < 1e-3
        assert EventJournal(blocker / "events.jsonl").entries() == lines  # a restarted node reads it back
    finally:
        letters.close()


def test_mesh_changes_are_leader_and_quorum_events() -> None:
    healthy = MeshSnapshot(term=3, leader_id="a", quorum_level="HEALTHY", alive_voters=3, total_voters=3)
    assert mesh_changes(None, healthy) == [(EventType.LEADER_ELECTED, {"term": 3, "leader_id": "a"})]
    assert mesh_changes(healthy, healthy) == []
    leaderless = MeshSnapshot(term=4, leader_id=None, quorum_level="LOST", alive_voters=1, total_voters=3)
    assert mesh_changes(healthy, leaderless) == [(EventType.QUORUM_CHANGED, {
        "level": "LOST", "previous": "HEALTHY", "alive_voters": 1, "total_voters": 3})]
    new_leader = MeshSnapshot(term=5, leader_id="b", quorum_level="MINIMUM", alive_voters=2, total_voters=3)
    assert [t for t, _ in mesh_changes(leaderless, new_leader)] == [EventType.LEADER_ELECTED, EventType.QUORUM_CHANGED]
    same_leader_new_term = MeshSnapshot(term=6, leader_id="b", quorum_level="MINIMUM", alive_voters=2, total_voters=3)
    assert mesh_changes(new_leader, same_leader_new_term) == [
        (EventType.LEADER_ELECTED, {"term": 6, "leader_id": "b"})]


async def test_a_daemon_wakes_on_its_event_long_before_its_poll(tmp_path) -> None:
    router = EventRouter()
    ctx = DaemonContext(name="export", settings=ExportSettings(), router=router, app_settings=Settings(), stopping=asyncio.Event(),
                        log=None, metrics=router.metrics)
    wake = wake_on(ctx, EventType.NEW_ITEMS_AVAILABLE, EventType.LEADER_ELECTED)
    waiter = asyncio.create_task(wait_for_wake(ctx, wake, timeout_s=3600))
    await router.publish(EventType.LEADER_ELECTED, {"term": 2, "leader_id": "n2"})
    assert await asyncio.wait_for(waiter, 10) is False  # woken, not stopped
    assert not wake.is_set()  # cleared for the next round


async def test_a_decided_generation_starts_the_next_export_without_waiting_for_games(tmp_path) -> None:
    """Games that arrived while a generation trained are enough for the next one: the decision
    itself wakes the export daemon, not the next self-play batch or the poll (an hour here)."""
    export = ExportSettings(min_new_games=2, poll_s=3600)
    pipe = pipeline_context(Settings.model_validate({"node": {"data_dir": str(tmp_path)}}), export=export)
    router = EventRouter()
    ctx = DaemonContext(name="export", settings=export,
                        router=router, app_settings=pipe.settings, stopping=asyncio.Event(),
                        log=get_logger("test.export"), metrics=router.metrics)
    beats: list[float] = []
    ctx.on_healthy = lambda: beats.append(0.0)  # once on start, once after each look at the DB
    exports = wake_on(ctx, EventType.TRAINING_THRESHOLD_REACHED)
    daemon = asyncio.create_task(export_daemon(pipe, ctx))
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while len(beats) < 2:  # the daemon found no games and sleeps on its wake-up
            assert asyncio.get_running_loop().time() < deadline, "the export daemon never looked at the DB"
            await asyncio.sleep(0.01)
        uniform = [1 / 7] * 7
        with ReplayDB(pipe.paths.games_db) as db:  # stored with no NEW_ITEMS_AVAILABLE
            for uid in ("g1", "g2"):
                db.add_game(GameRecord(uid=uid, game="connect4", winner=0,
                                       moves=[MoveRecord(a, uniform, 0.0) for a in (0, 1, 0, 1, 0, 1, 0)]))
        assert not exports.is_set()
        await router.publish(EventType.PROMOTION_REJECTED, {"generation": 1, "candidate_sha256": SHA, "reason": "test"})
        await asyncio.wait_for(exports.wait(), 30)
        assert pipe.state.stage is Stage.EXPORTED and pipe.state.export_mark == 2
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(daemon, 30)


def test_each_runner_setting_has_one_default(tmp_path) -> None:
    """The runner table declares a typed schema per daemon; daemons.yaml names a key only to
    change it, never to repeat its default (that is how 2000/1000/600 drifted apart)."""
    pipe = pipeline_context(Settings.model_validate({"node": {"data_dir": str(tmp_path)}}))
    table = pipeline_runners(pipe)
    daemons = yaml.safe_load((REPO / "daemons.yaml").read_text())["daemons"]
    repeated = []
    for name, entry in table.items():
        schema = entry.defaults
        assert isinstance(schema, type), f"{name}: settings must be a pydantic schema"
        defaults = schema().model_dump()
        for key, value in (daemons.get(name) or {}).get("settings", {}).items():
            if defaults.get(key) == value:
                repeated.append(f"daemons.{name}.settings.{key}")
    assert repeated == []
    assert table["export"].defaults().min_new_games == 400



def _selfplay_ctx(tmp_path: Path, rest_s: float) -> tuple:
    settings = Settings.model_validate({"node": {"data_dir": str(tmp_path)}, "selfplay": {"workers": 0},
                                        "model": {"channels": 8, "blocks": 1}})
    router = EventRouter()
    cfg = SelfplaySettings(batch_games=2, simulations=2, rest_s=rest_s)
    ctx = DaemonContext(name="selfplay", settings=cfg, router=router, app_settings=settings,
                        stopping=asyncio.Event(), log=None, metrics=router.metrics)
    return pipeline_context(settings), ctx


async def _wait_for_games(pipe, n: int, deadline_s: float = 120) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while await asyncio.to_thread(pipe.newest_item_id) < n:
        assert loop.time() < end, f"fewer than {n} games stored"
        await asyncio.sleep(0.05)


async def test_selfplay_rests_between_batches(tmp_path) -> None:
    """`rest_s` (a shared machine, the mesh tests) leaves the CPU to other stages after each
    batch: the next batch's first game starts no sooner than the rest after the last one ended."""
    pipe, ctx = _selfplay_ctx(tmp_path, rest_s=0.5)
    daemon = asyncio.create_task(selfplay_daemon(pipe, ctx))
    try:
        await _wait_for_games(pipe, 4)
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(daemon, 30)
    with ReplayDB(pipe.paths.games_db) as db:
        games = db.games()
    first, second = games[:2], games[2:4]
    assert min(g.started_at for g in second) - max(g.finished_at for g in first) >= 0.5


async def test_a_stop_ends_a_selfplay_rest_at_once(tmp_path) -> None:
    pipe, ctx = _selfplay_ctx(tmp_path, rest_s=3600)
    daemon = asyncio.create_task(selfplay_daemon(pipe, ctx))
    await _wait_for_games(pipe, 2)  # the first batch is stored; an hour's rest follows
    ctx.stopping.set()
    await asyncio.wait_for(daemon, 30)  # returned on the stop, not after the hour
    assert await asyncio.to_thread(pipe.newest_item_id) == 2


@pytest.mark.timeout(120)
async def test_a_lone_node_plays_on_its_idle_core_until_its_export_is_due(tmp_path) -> None:
    """Self-play knows how many games start a generation (the node's export threshold, read
    once); it plays on both workers while fewer have arrived, on one for the batch that training
    will overlap."""
    settings = Settings.model_validate({"node": {"data_dir": str(tmp_path)}, "model": {"channels": 8, "blocks": 1},
                                        "selfplay": {"workers": 1, "collect_workers": 2, "concurrent_games": 4}})
    export = ExportSettings(min_new_games=6, poll_s=0.2)
    pipe = pipeline_context(settings, export=export)
    router = EventRouter()
    ctx = DaemonContext(name="export", settings=export,
                        router=router, app_settings=settings, stopping=asyncio.Event(), log=None,
                        metrics=router.metrics)
    export = asyncio.create_task(export_daemon(pipe, ctx))
    batch = SelfplaySettings(batch_games=4, simulations=2)
    try:
        assert pipe.export_threshold == 6
        first = await asyncio.to_thread(pipe.steps.selfplay_batch, pipe, batch, lambda: False)
        second = await asyncio.to_thread(pipe.steps.selfplay_batch, pipe, batch, lambda: False)
        assert (first.items, first.workers) == (4, 2)  # 0 of 6 new games: nothing else to run
        assert second.workers == 2 and pipe.steps._pool.started == 2
        # 8 games >= 6: the export is due (or done), so the next batch leaves the trainer its core
        third = await asyncio.to_thread(pipe.steps.selfplay_batch, pipe, batch, lambda: False)
        assert (third.items, third.workers) == (4, 1)
    finally:
        ctx.stopping.set()
        export.cancel()
        await asyncio.gather(export, return_exceptions=True)
        pipe.steps.close_selfplay()

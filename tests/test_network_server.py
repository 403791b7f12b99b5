"""One network process serving several search processes (app/games/search/network_server.py): answers
equal to the network's own, each client's share counted, a wrong key refused, a promotion
loaded in place, and self-play's workers wired to it by `selfplay.shared_network`."""

from __future__ import annotations

from multiprocessing.connection import Client
from pathlib import Path

import numpy as np
import pytest

from app.games.search.evaluators import NetworkEvaluator
from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.games.search.network_server import NetworkServer, SharedNetworkClient
from app.config import Settings
from app.db.replay_db import ReplayDB
from app.games import get_game
from app.games.train.selfplay import run_selfplay
from app.games.train.selfplay_pool import WorkerPool

GAME = get_game("connect4")
ARCH = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)


def model(tmp_path: Path, seed: int) -> tuple[Path, str, object]:
    net = new_model(ARCH, seed=seed)
    path = tmp_path / f"m{seed}.safetensors"
    meta = save_model(net, ModelMeta(ARCH, GAME.name), path)
    return path, meta.sha256, net


@pytest.mark.timeout(240)
def test_clients_get_the_networks_answers_and_their_shares_are_counted(tmp_path: Path) -> None:
    path, sha, net = model(tmp_path, 1)
    other_path, other_sha, other_net = model(tmp_path, 2)
    states = [GAME.parse(m) for m in ("", "4", "44", "4455", "1234567", "76")]
    words = GAME.state_words(states)
    server = NetworkServer(path, sha, GAME.name)
    try:
        a = SharedNetworkClient.connect(server.address, server.authkey, GAME.name, "a")
        b = SharedNetworkClient.connect(server.address, server.authkey, GAME.name, "b")
        want_p, want_v = NetworkEvaluator(net, GAME).evaluate_batch(words)
        got_p, got_v = a.evaluate_batch(words[:4])
        more_p, more_v = b.evaluate(states[4:])
        assert np.allclose(np.concatenate([got_p, more_p]), want_p, atol=1e-5)
        assert np.allclose(np.concatenate([got_v, more_v]), want_v, atol=1e-5)
        stats = server.stats()
        assert stats["evaluations"] == 6 and stats["clients"] == {"a": 4, "b": 2}
        with pytest.raises(Exception):  # noqa: B017 - multiprocessing's AuthenticationError or a reset
            Client(server.address, authkey=b"not the key").send(("eval", words))
        server.load(other_path, other_sha)  # a promotion: the same process, the connections kept
        got_p, _ = a.evaluate_batch(words)
        assert np.allclose(got_p, NetworkEvaluator(other_net, GAME).evaluate_batch(words)[0], atol=1e-5)
        a.close()
        b.close()
    finally:
        server.close()
    assert not server.alive()


@pytest.mark.timeout(300)
def test_selfplay_workers_share_one_network_process(tmp_path: Path) -> None:
    path, sha, _ = model(tmp_path, 3)
    settings = Settings.model_validate({"model": {"channels": 8, "blocks": 1},
                                        "selfplay": {"concurrent_games": 3, "shared_network": True}})
    pool = WorkerPool(2)
    try:
        summary = run_selfplay(games=6, simulations=4, db_path=tmp_path / "games.db", model_path=path, workers=2,
                               seed=1, node_id="n", settings=settings, pool=pool)
        assert summary.games == 6
        assert pool.server is not None and pool.server.alive()
        stats = pool.server.stats()
        assert set(stats["clients"]) == {"selfplay-0", "selfplay-1"}
        assert stats["evaluations"] == sum(stats["clients"].values()) > 0
        with ReplayDB(tmp_path / "games.db") as db:
            assert {g.model_sha256 for g in db.iter_games()} == {sha}
    finally:
        pool.close()
    assert pool.server is not None and not pool.server.alive()

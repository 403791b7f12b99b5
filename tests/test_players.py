"""Players: legal play, the heuristic's tactics, the MCTS players, specs and names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.games.search.model import Architecture, ModelFormatError, ModelMeta, new_model, save_model
from app.games.search.players import (
    HeuristicPlayer, NetMCTSPlayer, PlayerSpec, PlayerSpecError, RandomPlayer, RolloutMCTSPlayer,
    make_player, model_player_name, model_sha_of_player, parse_player_spec,
)
from app.config.pipeline import GauntletConfig
from app.games import get_game

GAME = get_game("connect4")


def play_out(first, second, seed_moves: str = "") -> tuple[int | None, str]:
    state = GAME.parse(seed_moves)
    players = (first, second)
    while not state.is_terminal:
        move = players[state.to_move].select_move(state)
        assert state.legal_mask()[move], f"illegal move {move} in {state.to_text()!r}"
        state = state.play(move)
    return state.winner, state.to_text()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    path = tmp_path_factory.mktemp("models") / "tiny.safetensors"
    save_model(new_model(arch, seed=0), ModelMeta(arch, "connect4", generation=0), path)
    return path


def test_random_player_plays_legal_moves_and_varies() -> None:
    a, b = RandomPlayer(np.random.default_rng(1)), RandomPlayer(np.random.default_rng(2))
    games = {play_out(a, b)[1] for _ in range(10)}
    assert len(games) > 5


def test_heuristic_takes_a_win() -> None:
    # First player has three in column 1 (moves 1,1,1 with the opponent in 2): 1 wins.
    state = GAME.parse("121212")
    assert HeuristicPlayer(2).select_move(state) == 0


def test_heuristic_blocks_an_immediate_loss() -> None:
    # Second player to move; the first threatens a horizontal four at column 4 (index 3).
    state = GAME.parse("15263")  # first has 1,2,3 on the bottom row; second (to move) must block 4
    assert state.to_move == 1
    assert HeuristicPlayer(1).select_move(state) == 3


def test_heuristic_opens_in_the_centre() -> None:
    assert HeuristicPlayer(2).select_move(GAME.initial_state()) == 3


def test_heuristic_rejects_bad_depth() -> None:
    with pytest.raises(ValueError, match="depth"):
        HeuristicPlayer(0)


def test_heuristic_crushes_random() -> None:
    heuristic = HeuristicPlayer(2, np.random.default_rng(0))
    rnd = RandomPlayer(np.random.default_rng(1))
    score = 0.0
    for i in range(20):
        winner, _ = play_out(heuristic, rnd) if i % 2 == 0 else play_out(rnd, heuristic)
        score += 0.5 if winner is None else float(winner == i % 2)
    assert score >= 19


def test_rollout_mcts_finds_the_winning_move() -> None:
    player = RolloutMCTSPlayer("connect4", simulations=64, rng=np.random.default_rng(0))
    assert player.select_move(GAME.parse("121212")) == 0
    assert player.name == "rollout-s64"


def test_net_player_plays_legal_moves_and_reuses_its_tree(tiny_model: Path) -> None:
    player = NetMCTSPlayer(tiny_model, simulations=16, rng=np.random.default_rng(0))
    state = GAME.initial_state()
    move = player.select_move(state)
    tree, forest = player.tree, player.forest
    kept = forest.root_counts(tree).sum()  # the chosen move's subtree, kept
    assert 1 <= kept <= 15  # the chosen move's visits but the one that made its node
    state = state.play(move).play(0)
    player.select_move(state)  # two plies on: the same tree, advanced
    assert player.tree == tree
    assert forest.root_state(tree).ply == state.ply + 1
    assert forest.root_state(tree).to_text().startswith(state.to_text())
    player.select_move(GAME.parse("7777"))  # unrelated position: the slot rooted afresh
    assert forest.root_state(player.tree).to_text()[:4] == "7777"
    player.reset()
    assert player.tree is None
    winner, moves = play_out(player, RandomPlayer(np.random.default_rng(3)))
    end = GAME.parse(moves)  # the game as played replays to the same end by the rules
    assert end.is_terminal and end.winner == winner
    assert winner is not None or len(moves) == 42  # a draw only on a full board (7 x 6)


def test_select_moves_keeps_one_tree_a_game_and_answers_as_one_game_at_a_time(tiny_model: Path) -> None:
    """Several games' positions in one call: each game gets its own tree, reused on its next
    move, and each answer is the one a player searching that game alone would give."""
    positions = [GAME.parse(m) for m in ("", "44", "4455", "1234567")]
    together = NetMCTSPlayer(tiny_model, simulations=24, rng=np.random.default_rng(0))
    moves = together.select_moves(positions, ["a", "b", "c", "d"])
    for state, move in zip(positions, moves):
        alone = NetMCTSPlayer(tiny_model, simulations=24, rng=np.random.default_rng(0))
        assert alone.select_move(state) == move
    assert set(together.trees) == {"a", "b", "c", "d"}
    tree_b = together.trees["b"]
    after_b = positions[1].play(moves[1]).play(0)
    together.select_moves([after_b], ["b"])  # game b two plies on: its tree, advanced
    assert together.trees["b"] == tree_b
    assert together.forest.root_state(tree_b).ply == after_b.ply + 1
    with pytest.raises(ValueError, match="different game"):
        together.select_moves(positions[:2], ["a", "a"])
    raw = NetMCTSPlayer(tiny_model, simulations=0)
    assert raw.select_moves(positions, [0, 1, 2, 3]) == [raw.select_move(s) for s in positions]
    heuristic = HeuristicPlayer(1, np.random.default_rng(0))
    assert heuristic.select_moves([GAME.parse("121212")], [0]) == [0]


def test_net_player_with_zero_simulations_plays_the_policy_argmax(tiny_model: Path) -> None:
    from app.games.search.model import load_model, predict

    net, meta = load_model(tiny_model)
    state = GAME.parse("44")
    probs, _ = predict(net, state.planes()[None], state.legal_mask()[None])
    player = NetMCTSPlayer(tiny_model, simulations=0)
    assert player.select_move(state) == int(np.argmax(probs[0]))
    assert player.name == model_player_name(meta.sha256, 0)
    assert model_sha_of_player(player.name) == meta.sha256
    assert model_sha_of_player("heuristic-d2") is None


def test_net_player_refuses_a_model_with_the_wrong_sha(tiny_model: Path) -> None:
    with pytest.raises(ModelFormatError, match="expected"):
        NetMCTSPlayer(tiny_model, 4, expect_sha256="0" * 64)


def test_specs_parse_and_build(tiny_model: Path) -> None:
    cfg = GauntletConfig(heuristic_depth=3, rollout_simulations=50, net_simulations=8)
    assert parse_player_spec("random", cfg).name == "random"
    assert parse_player_spec("heuristic", cfg).name == "heuristic-d3"
    assert parse_player_spec("heuristic:1", cfg).name == "heuristic-d1"
    assert parse_player_spec("rollout", cfg).name == "rollout-s50"
    net = parse_player_spec(str(tiny_model), cfg)
    assert net.kind == "net" and net.simulations == 8 and net.sha256 and net.name.endswith(":s8")
    for spec in (parse_player_spec("random"), parse_player_spec("heuristic:1"), net):
        player = make_player(spec, seed=0)
        assert player.name == spec.name
        assert GAME.initial_state().legal_mask()[player.select_move(GAME.initial_state())]
    with pytest.raises(PlayerSpecError, match="unknown player"):
        parse_player_spec("grandmaster")
    with pytest.raises(PlayerSpecError, match="not an integer"):
        parse_player_spec("heuristic:deep")
    with pytest.raises(PlayerSpecError, match="not found"):
        parse_player_spec("/nowhere/model.safetensors")
    with pytest.raises(PlayerSpecError, match="kind"):
        make_player(PlayerSpec("oracle"))


def test_heuristic_generic_path_uses_only_the_state_interface() -> None:
    from app.games.search.heuristic import heuristic_move

    rng = np.random.default_rng(0)
    assert heuristic_move(GAME.parse("121212"), 2, rng, game_name="generic") == 0  # take the win
    assert heuristic_move(GAME.parse("15263"), 2, rng, game_name="generic") == 3  # block the four

"""Tic-tac-toe variants each wrong in one way, for the start-up check's bad-input tests."""

from __future__ import annotations

import numpy as np

from tests.user_games.tictactoe import TicTacToe, TicTacToeState


class NoRules(TicTacToe):
    """Names a rules module that does not exist."""

    rules_module = "tests.user_games.no_such_rules"


class WrongSize(TicTacToe):
    """Says 10 actions while its rules say 9."""

    num_actions = 10


class _ReturnsEarly(TicTacToeState):
    def returns(self) -> np.ndarray:
        return np.zeros(2)  # answers before the end

    def play(self, action: int) -> "_ReturnsEarly":
        s = super().play(action)
        return _ReturnsEarly(s.x, s.o, s.moves)


class ReturnsEarly(TicTacToe):
    def initial_state(self) -> _ReturnsEarly:
        return _ReturnsEarly()


class _RaisesOnLegal(TicTacToeState):
    def play(self, action: int) -> "_RaisesOnLegal":
        if action == 4 and self.ply == 0:
            raise RuntimeError("centre not implemented")
        s = super().play(action)
        return _RaisesOnLegal(s.x, s.o, s.moves)


class RaisesOnLegal(TicTacToe):
    def initial_state(self) -> _RaisesOnLegal:
        return _RaisesOnLegal()


class TooShort(TicTacToe):
    """States a longest game shorter than the rules allow (and than its rules module says)."""

    max_plies = 5


class Abstract(TicTacToe.__mro__[1]):  # Game itself: no part written
    name = "abstract"


class ProofsNotZeroSum(TicTacToe):
    """Two seats whose returns it says do not cancel, with the solver's proofs turned on."""

    two_player_zero_sum = False
    solver_proofs = True

"""How a model plays a game: the network, the search, and the players built from them.

    model.py        the residual policy/value net; safetensors + JSON sidecar (sha256 = identity)
    search_tree.py  one game's PUCT tree: selection, expansion, backup, reuse
    mcts.py         PUCT search batched across many trees per evaluator call
    evaluators.py   leaf evaluators: network, uniform prior, random rollouts
    heuristic.py    the heuristic baseline: win now, block now, shallow negamax
    players.py      random, heuristic, rollout MCTS and network MCTS players for gauntlets
"""

"""How a model plays a game: the network, the search, and the players built from them.

    model.py           the residual policy/value net; safetensors + JSON sidecar (sha256 = identity)
    mcts.py            the search's public face: SearchForest, SearchResult, choose_action, search()
    search_forest.py   every tree of a batch in one set of arrays; the round loop against one evaluator
    search_kernel.py   the compiled steps (numba): selection, virtual loss, expansion, backup, proofs,
                       threat check at node creation, noise at the root, reuse after a move
    kernel_build.py    the templates (search_kernel.py, playout_kernel.py) bound to a game's rules,
                       compiled by numba and cached on disk per game; old keys pruned
    playout_kernel.py  random playouts over any game's compiled rules (the rollout evaluator's)
    search_result.py   what a search says about its root; choosing a move from visits
    evaluators.py      leaf evaluators on the game's batch form: network, uniform prior, random rollouts
    network_server.py  one network serving several search processes, their batches merged
    heuristic.py       the heuristic baseline: win now, block now, shallow negamax
    players.py         random, heuristic, rollout MCTS and network MCTS players for gauntlets
"""

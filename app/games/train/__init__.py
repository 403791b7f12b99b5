"""How a game-playing network improves: self-play, export, distributed training, gauntlets, promotion gates.

    selfplay.py        worker processes play many games; one writer stores them
    export.py          replay DBs -> NPZ dataset with manifest (dataset.py: the layout)
    train.py           the torchrun target; trainer.py the step loop, train_schedule.py its pure
                       decisions, train_task.py the swappable training step, checkpoint.py
    gauntlet.py        candidate vs baselines and best; gauntlet_shard.py a slice played anywhere
    sprt.py, elo.py    early stopping of matches; Elo by maximum likelihood
    promotion.py       the gate decision (pure) and the registry actions around it

Knows no daemon and no mesh: app/coordination and the pipeline steps (app/games/workload/)
call these functions. Below it: the search (app/games/search/) and the rules (app/games/).
"""

"""The generation flow, selfplay -> export -> train -> gauntlet -> promote -> distribute, as
daemons on one node and as claims and decisions across the mesh.

    state.py              PipelineState: the persisted stage machine (resume, not repeat)
    steps.py              the seam: what a workload provides (WorkloadSteps and its parts, optional
                          capabilities) and what it reads of the pipeline (Pipe, Cluster)
    context.py            PipelineContext: what the daemons of one node share
    runners.py            one async runner per pipeline daemon (the runner table)
    runner_settings.py    each daemon's typed settings with their one default
    mesh_events.py        leader and quorum changes of the mesh as events
    evaluation_record.py  a gauntlet's outcome as JSON and the decision taken from it
    progress_display.py   the operator's one-line view of the loop
    cluster.py            ClusterPipeline: gossip, the leader's side, claims, proposals
    scheduling.py         what work the leader asks for (pure)
    generation_log.py     one decided record per generation, learned by gossip
    rollback.py           withdrawing the cluster's best: `rollback/<g>` decided through the quorum
    dashboard_feed.py     what the dashboard and the mesh gauges show (memory only; disk by a sampler)
    gauntlet_plan.py      a gauntlet request cut into shards (pure)
    shard_board.py        the spread-gauntlet requests and results a node gossips
    shard_worker.py       the daemon that plays other nodes' gauntlet shards
    gauntlet_spread.py    the claimant's gauntlet: shards spread, SPRT at home
    training_job.py       one generation's training as a torchrun subprocess
    train_join.py         the daemon that lends this node to another node's training run
"""

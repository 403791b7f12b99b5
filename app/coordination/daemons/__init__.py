"""Daemon supervision on one node: which daemons run, how they are kept alive, how they talk.

    registry.py       DaemonSpec/RunnerEntry from daemons.yaml + the code's runner table, DaemonContext
    manager.py        start in dependency order, health loop, restart with backoff, crash-loop give-up
    backoff.py        pure timing decisions (restart delays, retry delays)
    events.py         the typed events and their payload schemas
    event_router.py   in-process pub/sub with SHA-256 dedup and a persisted dead-letter queue
    dlq_retry.py      the daemon that retries dead letters with backoff
    metrics.py        the node's Prometheus registry
    health_server.py  port 8790: /livez /readyz /metrics /daemons

Nothing here knows the pipeline or the mesh: they plug in as runners and event subscribers.
"""

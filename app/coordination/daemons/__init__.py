"""Daemon supervision on one node: which daemons run, how they are kept alive, how they talk.

    daemon_registry.py DaemonSpec/RunnerEntry from daemons.yaml + the code's runner table, DaemonContext
    manager.py        start in dependency order, health loop, restart with backoff, crash-loop give-up
    backoff.py        pure timing decisions (restart delays, retry delays)
    events.py         the typed events and their payload schemas
    event_router.py   in-process pub/sub with SHA-256 dedup and a persisted dead-letter queue
    event_journal.py  every event as a JSON line (the I/O handler the DLQ protects)
    dlq_retry.py      the daemon that retries dead letters with backoff
    metrics.py        the node's Prometheus registry (`mesh_*`, a `node` label on every series)
    health_server.py  port 8790: /livez /readyz /metrics /daemons, and the dashboard
    dashboard.py      the dashboard: GET / (static/dashboard.html, plain SVG) and /dashboard.json

Nothing here knows the pipeline or the mesh: they plug in as runners and event subscribers.
"""

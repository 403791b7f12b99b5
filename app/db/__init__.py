"""What a node keeps in SQL databases (SQLAlchemy 2.x; SQLite files by default).

    sqlite_files.py     connection pragmas (WAL) and race-safe table creation
    replay_db.py        finished games and their search statistics, idempotent by uid
    registry.py         models (generation, sha256, parent, Elo, status) and gauntlet games
    registry_tables.py  the registry's ORM rows
    dead_letters.py     event deliveries that failed, with their retry schedule
    work_queue.py       the rows of the leader's work queue
    rollout_store.py    the LM workload's rollout groups, one transaction per group, idempotent by uid
    rollout_records.py  the rollout records (pydantic), as stored and as replication sends them
"""

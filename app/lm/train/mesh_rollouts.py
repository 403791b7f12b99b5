"""Whether an online GRPO run works with rollout workers on other nodes, and the two parts it
then uses: the publisher of its policy (policy_publish.py) and the reader of the groups the
workers make from it (remote_groups.py).

Only a run a node with peers launched does: the node passes its data dir (`--mesh-data-dir`,
steps.TrainingJob.mesh_flag), where it serves what the trainer publishes and replicates the
workers' groups into its rollout store. A run started by hand keeps to its own engine, and so
does a run spanning several nodes (its joiners restart whole; rank 0's node alone serves), and
so does the run of a node without peers (no worker could fetch a policy, and each is a whole
copy of the weights written every step). The node names its data dir rather than the trainer
reading it from the config file: a node started with `--data-dir` or with several configs runs
on another dir than its file says (a shared file for three nodes on one host took no worker's
group: the trainer looked in the file's dir). Its rollout store in a database: the node passes
the URL in the environment (NODE_DB_URL_ENV, not on a command line anyone can read), else the
config's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import os

from app.config import load_settings
from app.config.paths import NODE_DB_URL_ENV, NodePaths
from app.lm.train.policy_publish import POLICIES_DIR, PolicyPublisher, published_versions
from app.lm.train.remote_groups import RemoteGroups


MIN_KEPT, MAX_KEPT = 4, 16  # published policy directories kept (each a whole copy of the weights)


def node_paths_of_run(data_dir: Path, db_url: str | None, run_dir: Path) -> NodePaths | None:
    """The node's paths when `run_dir` is one of its runs, else None."""
    paths = NodePaths(Path(data_dir), os.environ.get(NODE_DB_URL_ENV) or db_url)
    return paths if run_dir.resolve().parent == paths.runs_dir.resolve() else None


def policies_kept(max_staleness: int, every: int = 1) -> int:
    """A worker's groups of a version are taken up to `max_staleness` steps later, so its
    directory stays that long for a worker that saw it late (a fetch of a dropped one is a 404
    and a lost batch): one published every `every` steps; bounded, as each is a full copy on disk."""
    return min(MAX_KEPT, max(MIN_KEPT, max_staleness // max(1, every) + 1))


def mesh_rollouts(config: Path, run_dir: Path, generation: int, model: Any, vocab_size: int, *, rank: int,
                  world_size: int, node_data_dir: Path | None, inherited: Sequence[tuple[int, str]] = (),
                  exclude: Collection[str] = ()) -> tuple[PolicyPublisher | None, RemoteGroups | None]:
    """(publisher on rank 0, reader on every rank), or (None, None) for a run of its own
    (`node_data_dir` None); `inherited`: the policies a trainer that stays published in its last
    run (policy_publish.py); `exclude`: the uids the reader never takes (the consumed record)."""
    if node_data_dir is None:
        return None, None
    settings = load_settings(config)
    paths = node_paths_of_run(node_data_dir, settings.node.db_url, run_dir)
    if paths is None:
        return None, None
    keep = policies_kept(settings.lm.rollout.max_staleness, settings.lm.rollout.publish_every)
    publisher = (PolicyPublisher(paths.data_dir / POLICIES_DIR, run_dir, generation, model, None, keep=keep,
                                 every=settings.lm.rollout.publish_every, inherited=inherited)
                 if rank == 0 else None)
    versions = publisher.versions if publisher is not None else (lambda: published_versions(run_dir))
    return publisher, RemoteGroups(paths.rollouts_db, versions, vocab_size, rank, world_size, exclude)

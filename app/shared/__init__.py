"""What both workloads use and neither owns.

    process_group.py   how a torchrun rank picks its device and joins; DistContext; rank shares
    launcher.py        torchrun wrapped for daemons and scripts (rank_entry.py, rank_watch.py:
                       per-rank logs, exits, teardown)
    manifests.py       a directory named by the sha256 of its manifest: the reader, file digests
"""

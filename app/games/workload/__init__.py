"""The game workload's pipeline steps (the seam: app/coordination/pipeline/steps.py), the one
part of the game home above the daemons; only app/workloads.py imports it."""

"""The game workload's pipeline steps (the seam: app/coordination/pipeline/steps.py)."""

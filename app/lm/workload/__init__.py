"""The language-model workload's pipeline steps (the seam: app/coordination/pipeline/steps.py):
self-play into the rollout store, rollout export, the held-out paired gate, model directories
over the mesh, engine weight sync."""

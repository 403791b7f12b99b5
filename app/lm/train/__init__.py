"""How a language model learns: backends (one process, FSDP2), GRPO/SFT losses, the one
SFT -> GRPO run over a rollout source, DCP / full-state / Hugging Face checkpoints, and the
torchrun target of one generation (generation.py)."""

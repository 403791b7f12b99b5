"""The language-model training core: backends (one process, FSDP2), GRPO/SFT losses and loops,
the DataBuffer, DCP / full-state / Hugging Face checkpoints, and ticket-parallel rollout."""

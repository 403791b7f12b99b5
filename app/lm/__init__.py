"""A language model and how it acts: tokenizer, model, tasks, engines, rollouts (see docs/ARCHITECTURE.md)."""

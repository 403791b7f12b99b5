"""The language-model workload, in one home (docs/ARCHITECTURE.md).

    tokenizer.py, causal_lm.py   the digit tokenizer built in process; a causal LM from a shape or a local dir
    tasks.py, calculator.py      prompts, verifiable rewards, demonstrations, episodes (the calculator tool)
    samples.py, truncation.py    Sample / Group; rollout settings and what truncation does to a reward
    data_buffer.py               the order items are drawn in: a pure function of (seed, epoch)
    setup.py                     the `lm:` config section -> tokenizer, model, task, prompts, settings
    model_dir.py                 a Hugging Face directory named by its manifest's sha256; verified install
    rollout/                     engines, weight sync, agent steps, groups, stored batches, rollout datasets
    train/                       backends, losses, the one SFT -> GRPO run, the torchrun target
    workload/                    the pipeline steps of this workload (app/coordination/pipeline/steps.py)

Imports run downward: workload -> train -> rollout -> this package's own modules; nothing
here imports the game workload (app/training, app/ai, app/games).
"""

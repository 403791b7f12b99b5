"""The language-model workload, in one home (docs/ARCHITECTURE.md).

    tokenizer.py, causal_lm.py   the digit tokenizer built in process, any saved one read with AutoTokenizer;
                                 any local causal-LM directory (AutoModelForCausalLM), or a Llama from a shape
    demo_model.py                the 2-core demo's BPE tokenizer, small Qwen2 and arithmetic prompts, built offline
    lora.py                      LoRA adapters (peft) and the merged weights everything outside the trainer sees
    tasks.py, calculator.py      prompts, verifiable rewards, demonstrations, episodes (the calculator tool)
    prompt_file.py, rewards.py   the user's task: a JSONL prompt file, a reward named by import path; built-ins
    samples.py, truncation.py    Sample / Group; rollout settings and what truncation does to a reward
    data_buffer.py               the order items are drawn in: a pure function of (seed, epoch)
    setup.py                     the `lm:` config section -> tokenizer, model, task, prompts, settings
    model_dir.py                 a Hugging Face directory named by its manifest's sha256; verified install
    rollout/                     engines, weight sync, agent steps, groups, stored batches, rollout datasets
    train/                       backends, losses, the one SFT -> GRPO run, the torchrun target
    workload/                    the pipeline steps of this workload (app/coordination/pipeline/steps.py)

Imports run downward: workload -> train -> rollout -> this package's own modules; nothing
here imports the game workload (app/games/train, app/games/search, app/games).

Nothing is downloaded, ever: the hub is switched off for this process before transformers is
imported (a config that names a hub model gets a one-line error from causal_lm.py instead).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

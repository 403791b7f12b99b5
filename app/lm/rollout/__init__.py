"""How a language model acts: engines (in process, SGLang, vLLM), weight sync, agent steps,
scored groups, the rollout manager, stored self-play batches, rollout datasets, ticket rollouts."""

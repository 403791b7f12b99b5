"""Generation engines behind one protocol, and the in-process one (the default).

`InProcessEngine` runs a transformers causal LM in this process: all prompts x n completions
in one left-padded batch, a KV cache (`past_key_values`) so each step feeds one token, and
sampling from its own seeded `torch.Generator` (the caller's global RNG is never touched, and
the same call gives the same completions). It returns the log-prob of every sampled token
under the distribution it was drawn from (logits / temperature; temperature 0 is greedy and
reports the plain softmax), which is what the GRPO ratio compares against.

A completion includes its stop token (eos or a task's stop marker), so the trainer learns to
stop; `finish_reason` is "stop" then, "length" when `max_new_tokens` ran out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str                  # "stop" | "length" | "abort"
    weight_version: int | None = None   # as reported by the engine that produced it, when it says


class Engine(Protocol):
    """What a rollout needs from an engine: batched generation and a weight version."""

    name: str
    weight_version: int

    def generate(self, prompt_token_lists: Sequence[Sequence[int]], *, n: int, max_new_tokens: int,
                 temperature: float, seed: int,
                 stop_token_ids: Sequence[int] | None = None) -> list[list[Completion]]: ...


class InProcessEngine:
    def __init__(self, model: PreTrainedModel, tokenizer, weight_version: int = 0,
                 name: str = "in-process") -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.weight_version = weight_version
        self.name = name
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = tokenizer.eos_token_id

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace the weights (strict: a missing or unexpected key is an error) and the version."""
        self.model.load_state_dict(dict(state_dict), strict=True)
        self.weight_version = version

    def load_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        """Weights from a `save_pretrained` directory (what the HTTP engines are pointed at)."""
        from app.lm.causal_lm import load_model

        self.load_weights(load_model(model_path).state_dict(), version)

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        """The weight-sync entry point shared with the HTTP engines."""
        await asyncio.to_thread(self.load_weights_from_disk, model_path, version)

    @torch.no_grad()
    def generate(self, prompt_token_lists: Sequence[Sequence[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, seed: int = 0,
                 stop_token_ids: Sequence[int] | None = None) -> list[list[Completion]]:
        """`n` completions per prompt, grouped by prompt in input order."""
        if n < 1 or max_new_tokens < 1:
            raise ValueError(f"n={n} and max_new_tokens={max_new_tokens} must both be >= 1")
        if temperature < 0:
            raise ValueError(f"temperature {temperature} must be >= 0")
        if not prompt_token_lists:
            return []
        if any(len(p) == 0 for p in prompt_token_lists):
            raise ValueError("an empty prompt cannot be continued: every prompt needs at least one token")
        stops = torch.tensor(sorted({self.eos_id, *(stop_token_ids or ())}))
        rows = [list(p) for p in prompt_token_lists for _ in range(n)]
        input_ids, mask = self._left_pad(rows)
        device = next(self.model.parameters()).device
        input_ids, mask, stops = input_ids.to(device), mask.to(device), stops.to(device)
        generator = torch.Generator(device=device).manual_seed(seed)

        batch = len(rows)
        out_tokens = torch.full((batch, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros((batch, max_new_tokens), device=device)
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        cache = DynamicCache()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        step_ids = input_ids
        for step in range(max_new_tokens):
            logits = self.model(input_ids=step_ids, attention_mask=mask, position_ids=positions,
                                past_key_values=cache, use_cache=True).logits[:, -1, :].float()
            token, logprob = self._pick(logits, temperature, generator)
            live = ~done
            out_tokens[live, step] = token[live]
            out_logprobs[live, step] = logprob[live]
            lengths += live.long()
            hit_stop = torch.isin(token, stops) & live
            stopped |= hit_stop
            done |= hit_stop
            if bool(done.all()):
                break
            step_ids = torch.where(done, torch.full_like(token, self.pad_id), token).unsqueeze(-1)
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=-1)
            positions = positions[:, -1:] + 1
        return self._collect(out_tokens, out_logprobs, lengths, stopped, len(prompt_token_lists), n)

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
        return ids, mask

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if temperature == 0:
            logprobs = torch.log_softmax(logits, dim=-1)
            token = logits.argmax(dim=-1)
        else:
            logprobs = torch.log_softmax(logits / temperature, dim=-1)
            token = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
        return token, logprobs.gather(-1, token.unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def _collect(tokens: torch.Tensor, logprobs: torch.Tensor, lengths: torch.Tensor, stopped: torch.Tensor,
                 prompts: int, n: int) -> list[list[Completion]]:
        tokens, logprobs, lengths, stopped = tokens.cpu(), logprobs.cpu(), lengths.cpu(), stopped.cpu()
        flat = [Completion(tokens=tokens[i, : lengths[i]].tolist(), logprobs=logprobs[i, : lengths[i]].tolist(),
                           finish_reason="stop" if bool(stopped[i]) else "length")
                for i in range(prompts * n)]
        return [flat[p * n:(p + 1) * n] for p in range(prompts)]

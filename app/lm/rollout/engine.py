"""Generation engines behind one protocol, and the in-process one (the default).

Every engine (in-process, SGLang, vLLM: sglang_engine.py, vllm_engine.py) does two things:
`generate` (batched, token ids in, token ids and their log-probs out) and `load` (new
weights, from a directory or from tensors, answered with the weight version the engine
reports having loaded). `weight_sync.sync_engines` is the one caller of `load`: it bounds it
by the engine's own `sync_timeout_s` and keeps `in_service` and `weight_version` honest, so a
rollout is never labelled with weights the engine did not confirm.

Sampling is reproducible per request: completion j of prompt i is drawn with seed
`seeds[i] + j` (vLLM's own rule for the children of an n > 1 request), so a completion is
a function of (weights, prompt, seed), whatever else shares its batch.

`InProcessEngine` runs a transformers causal LM in this process: all prompts x n completions
in one left-padded batch, a KV cache (`past_key_values`) so each step feeds one token, one
`torch.Generator` per row (the caller's global RNG is never touched). It returns the log-prob
of every sampled token under the distribution it was drawn from (logits / temperature;
temperature 0 is greedy and reports the plain softmax), which is what the GRPO ratio compares
against. A completion includes its stop token (eos or a task's stop marker), so the trainer
learns to stop; `finish_reason` is "stop" then, "length" when `max_new_tokens` ran out.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

WeightsProvider = Callable[[], Mapping[str, torch.Tensor]]  # full weights (LoRA: merged ones)


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str                  # "stop" | "length" | "abort"
    weight_version: int | None = None   # as reported by the engine that produced it, when it says


@dataclass(frozen=True)
class WeightUpdate:
    """New weights for the engines, as `version`: a `save_pretrained` directory (engines that
    load from disk), a provider of the full tensors (engines that take tensors), or both."""

    version: int
    path: Path | None = None
    tensors: WeightsProvider | None = None


class EngineError(RuntimeError):
    """An engine refused, failed or answered something we cannot use; the message names it."""


class EngineOutOfService(EngineError):
    """The engine's weights are not known to be the ones it was last told to load (a failed
    sync, a restart): nothing it generates is used until a sync succeeds."""


class Engine(Protocol):
    name: str
    kind: str               # "in_process" | "sglang" | "vllm"
    sync_mode: str          # what `load` reads from a WeightUpdate: "disk" (its path) or "tensor"
    sync_timeout_s: float   # the bound weight_sync puts on one `load`
    weight_version: int     # what the engine reported after its last successful load
    in_service: bool        # False from a failed sync until a sync succeeds
    last_error: str | None
    lock: threading.Lock    # held while generating and while loading: the two never overlap

    def generate(self, prompt_token_lists: Sequence[Sequence[int]], *, n: int, max_new_tokens: int,
                 temperature: float, seeds: Sequence[int],
                 stop_token_ids: Sequence[int] | None = None) -> list[list[Completion]]: ...
    async def start(self) -> None: ...   # start-up checks (a vLLM server's log-prob mode)
    async def load(self, update: WeightUpdate) -> int: ...   # the version the engine reports after it


def check_seeds(prompts: Sequence[Sequence[int]], seeds: Sequence[int]) -> None:
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts need as many seeds, got {len(seeds)}")


class InProcessEngine:
    kind = "in_process"

    def __init__(self, model: PreTrainedModel, tokenizer, weight_version: int = 0,
                 name: str = "in-process", sync_mode: str = "tensor", sync_timeout_s: float = 300.0) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.weight_version = weight_version
        self.name = name
        self.sync_mode = sync_mode
        self.sync_timeout_s = sync_timeout_s
        self.in_service = True
        self.last_error: str | None = None
        self.lock = threading.Lock()
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = tokenizer.eos_token_id

    def __deepcopy__(self, memo: dict) -> InProcessEngine:
        """A copy with its own model and its own (free) lock."""
        return InProcessEngine(copy.deepcopy(self.model, memo), self.tokenizer, self.weight_version, self.name,
                               self.sync_mode, self.sync_timeout_s)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace the weights (strict: a missing or unexpected key is an error) and the version."""
        self.model.load_state_dict(dict(state_dict), strict=True)
        self.weight_version = version

    async def start(self) -> None:
        """Nothing to check: the model is in this process."""

    async def load(self, update: WeightUpdate) -> int:
        """The update's tensors (sync mode "tensor": no disk round trip) or its directory ("disk")."""
        if (update.tensors if self.sync_mode == "tensor" else update.path) is None:
            raise EngineError(f"in-process engine {self.name} syncs by {self.sync_mode}, but the update to "
                              f"{update.version} has no {'tensors' if self.sync_mode == 'tensor' else 'directory'}")
        await asyncio.to_thread(self._load, update)
        return update.version

    def _load(self, update: WeightUpdate) -> None:
        if self.sync_mode == "tensor":
            assert update.tensors is not None
            self.load_weights(update.tensors(), update.version)
        else:
            from app.lm.causal_lm import load_model

            self.load_weights(load_model(update.path).state_dict(), update.version)

    @torch.no_grad()
    def generate(self, prompt_token_lists: Sequence[Sequence[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, seeds: Sequence[int],
                 stop_token_ids: Sequence[int] | None = None) -> list[list[Completion]]:
        """`n` completions per prompt, grouped by prompt in input order."""
        if n < 1 or max_new_tokens < 1:
            raise ValueError(f"n={n} and max_new_tokens={max_new_tokens} must both be >= 1")
        if temperature < 0:
            raise ValueError(f"temperature {temperature} must be >= 0")
        check_seeds(prompt_token_lists, seeds)
        if not prompt_token_lists:
            return []
        if any(len(p) == 0 for p in prompt_token_lists):
            raise ValueError("an empty prompt cannot be continued: every prompt needs at least one token")
        with self.lock:
            return self._generate(prompt_token_lists, n, max_new_tokens, temperature, seeds, stop_token_ids)

    def _generate(self, prompt_token_lists: Sequence[Sequence[int]], n: int, max_new_tokens: int,
                  temperature: float, seeds: Sequence[int],
                  stop_token_ids: Sequence[int] | None) -> list[list[Completion]]:
        stops = torch.tensor(sorted({self.eos_id, *(stop_token_ids or ())}))
        rows = [list(p) for p in prompt_token_lists for _ in range(n)]
        input_ids, mask = self._left_pad(rows)
        device = next(self.model.parameters()).device
        input_ids, mask, stops = input_ids.to(device), mask.to(device), stops.to(device)
        generators = [torch.Generator(device=device).manual_seed(int(s) + j) for s in seeds for j in range(n)]

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
            token, logprob = self._pick(logits, temperature, generators)
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
        return self._collect(out_tokens, out_logprobs, lengths, stopped, len(prompt_token_lists), n,
                             self.weight_version)

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
              generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """Inverse-CDF sampling with one uniform draw per row from that row's own generator, so
        a row's token depends on its seed and its logits only."""
        if temperature == 0:
            logprobs = torch.log_softmax(logits, dim=-1)
            token = logits.argmax(dim=-1)
        else:
            logprobs = torch.log_softmax(logits / temperature, dim=-1)
            cdf = logprobs.exp().cumsum(dim=-1)
            u = torch.cat([torch.rand(1, generator=g, device=logits.device) for g in generators]).unsqueeze(-1)
            token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
        return token, logprobs.gather(-1, token.unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def _collect(tokens: torch.Tensor, logprobs: torch.Tensor, lengths: torch.Tensor, stopped: torch.Tensor,
                 prompts: int, n: int, version: int) -> list[list[Completion]]:
        tokens, logprobs, lengths, stopped = tokens.cpu(), logprobs.cpu(), lengths.cpu(), stopped.cpu()
        flat = [Completion(tokens=tokens[i, : lengths[i]].tolist(), logprobs=logprobs[i, : lengths[i]].tolist(),
                           finish_reason="stop" if bool(stopped[i]) else "length", weight_version=version)
                for i in range(prompts * n)]
        return [flat[p * n:(p + 1) * n] for p in range(prompts)]

"""An SGLang server as an engine: token ids in, token ids and log-probs out, weights loaded
from a directory or from tensors. Route and field names are SGLang's own
(python/sglang/srt/entrypoints/http_server.py, python/sglang/srt/managers/io_struct.py):

    POST /generate                    {input_ids, return_logprob, sampling_params: [one per row]}
                                      sampling_params carries `sampling_seed` (SamplingParams,
                                      python/sglang/srt/sampling/sampling_params.py); every answer's
                                      meta_info carries the `weight_version` that produced it
    POST /update_weights_from_disk    UpdateWeightFromDiskReqInput {model_path, weight_version,
                                      flush_cache, abort_all_requests}
    POST /update_weights_from_tensor  UpdateWeightsFromTensorReqInput {serialized_named_tensors (one
                                      per TP rank), load_format, flush_cache, abort_all_requests,
                                      weight_version}
    GET  /model_info                  {model_path, ..., weight_version}: read back after every load

`serialized_named_tensors` is SGLang's MultiprocessingSerializer format: a list of (name,
tensor) pickled by torch's ForkingPickler (tensors travel as shared-memory handles, so the
server must be on the same host), base64-encoded. The version an engine's rollouts carry is
the one /model_info reports after the load, and every completion's own meta_info version must
match it: a server restarted with its old weights reports another one, and the engine goes
out of service instead of labelling its completions with weights it does not hold.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch.multiprocessing  # noqa: F401  (registers the tensor reductions ForkingPickler uses)

from app.lm.rollout.engine import Completion, WeightUpdate, check_seeds
from app.lm.rollout.http_engine import HttpEngine


def serialize_named_tensors(named: Sequence[tuple[str, Any]]) -> str:
    """SGLang's MultiprocessingSerializer.serialize(named, output_str=True)."""
    buf = io.BytesIO()
    ForkingPickler(buf).dump([(name, t.detach().contiguous().share_memory_()) for name, t in named])
    return base64.b64encode(buf.getvalue()).decode("ascii")


class SGLangEngine(HttpEngine):
    kind = "sglang"

    def __init__(self, name: str, base_url: str, *, abort_all_requests: bool = False, flush_cache: bool = True,
                 tp_size: int = 1, **kwargs: Any) -> None:
        super().__init__(name, base_url, **kwargs)
        self.abort_all_requests = abort_all_requests
        self.flush_cache = flush_cache
        self.tp_size = tp_size

    async def _generate(self, prompt_token_lists, n, max_new_tokens, temperature, seeds,
                        stop_token_ids) -> list[list[Completion]]:
        check_seeds(prompt_token_lists, seeds)
        rows = [list(p) for p in prompt_token_lists for _ in range(n)]
        if not rows:
            return []
        params = [{"temperature": temperature, "max_new_tokens": max_new_tokens,
                   "stop_token_ids": list(stop_token_ids or []), "skip_special_tokens": False, "no_stop_trim": True,
                   "sampling_seed": int(seed) + j} for seed in seeds for j in range(n)]
        payload = {"input_ids": rows, "return_logprob": True, "sampling_params": params}
        answer = await self.request("POST", "/generate", payload)
        if isinstance(answer, dict):
            answer = [answer]
        if not isinstance(answer, list) or len(answer) != len(rows):
            got = len(answer) if isinstance(answer, list) else type(answer).__name__
            raise self._fail(f"/generate answered {got} completions for {len(rows)} requests")
        flat = [self._completion(item) for item in answer]
        return [flat[i * n:(i + 1) * n] for i in range(len(prompt_token_lists))]

    def _completion(self, item: Any) -> Completion:
        try:
            meta = item["meta_info"]
            pairs = meta["output_token_logprobs"]
            reason = meta["finish_reason"]["type"]
        except (KeyError, TypeError) as exc:
            raise self._fail(f"/generate answer lacks meta_info output_token_logprobs/finish_reason: {exc!r}") from exc
        shown = meta.get("weight_version")
        if str(shown) != str(self.weight_version):
            raise self.take_out_of_service(f"/generate answered with weight_version {shown!r}, but the last "
                                           f"confirmed load was {self.weight_version} (restarted with old weights?)")
        return Completion(tokens=[int(p[1]) for p in pairs], logprobs=[float(p[0]) for p in pairs],
                          finish_reason=self._finish(reason), weight_version=self.weight_version)

    async def _load_from_disk(self, update: WeightUpdate) -> int:
        payload = {"model_path": str(update.path), "weight_version": str(update.version),
                   "flush_cache": self.flush_cache, "abort_all_requests": self.abort_all_requests}
        return await self._update("/update_weights_from_disk", payload, update.version)

    async def _load_tensors(self, update: WeightUpdate) -> int:
        assert update.tensors is not None
        named = list(update.tensors().items())
        payload = {"serialized_named_tensors": [serialize_named_tensors(named) for _ in range(self.tp_size)],
                   "load_format": None, "flush_cache": self.flush_cache,
                   "abort_all_requests": self.abort_all_requests, "weight_version": str(update.version)}
        return await self._update("/update_weights_from_tensor", payload, update.version)

    async def _update(self, path: str, payload: dict, version: int) -> int:
        answer = await self.request("POST", path, payload, timeout_s=self.sync_timeout_s)
        if not isinstance(answer, dict) or answer.get("success") is not True:
            raise self._fail(f"{path} to version {version} not successful: {answer!r}")
        info = await self.request("GET", "/model_info", timeout_s=self.sync_timeout_s)
        shown = info.get("weight_version") if isinstance(info, dict) else None
        if str(shown) != str(version):
            raise self._fail(f"after {path}, /model_info shows weight_version {shown!r}, expected {str(version)!r}")
        return int(shown)

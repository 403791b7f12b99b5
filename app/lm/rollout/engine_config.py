"""Which engine an `lm.engines` entry names: the in-process one or an SGLang / vLLM server,
with its sync mode and timeouts as configured."""

from __future__ import annotations

from app.config.lm import LMEngineSettings
from app.lm.rollout.engine import Engine, InProcessEngine
from app.lm.rollout.sglang_engine import SGLangEngine
from app.lm.rollout.vllm_engine import VLLMEngine


def build_engine(cfg: LMEngineSettings, model=None, tokenizer=None, weight_version: int = 0) -> Engine:
    """An engine from its settings; the in-process one needs the model and tokenizer. An HTTP
    engine starts out of service: its weights are unknown until this node's first load."""
    if cfg.kind == "in_process":
        if model is None or tokenizer is None:
            raise ValueError(f"engine {cfg.name}: an in_process engine needs a model and a tokenizer")
        return InProcessEngine(model, tokenizer, weight_version=weight_version, name=cfg.name,
                               sync_mode=cfg.sync_mode, sync_timeout_s=cfg.sync_timeout_s)
    assert cfg.url is not None
    common = dict(weight_version=weight_version, sync_mode=cfg.sync_mode, sync_timeout_s=cfg.sync_timeout_s,
                  request_timeout_s=cfg.request_timeout_s)
    if cfg.kind == "sglang":
        return SGLangEngine(cfg.name, cfg.url, tp_size=cfg.tp_size, **common)
    return VLLMEngine(cfg.name, cfg.url, model=cfg.model, nccl_master=cfg.nccl_master, **common)

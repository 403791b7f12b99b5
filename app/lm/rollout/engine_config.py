"""Which engine an `lm.engines` entry names: the in-process one or an SGLang / vLLM server."""

from __future__ import annotations

from app.config.lm import LMEngineSettings
from app.lm.rollout.engine import InProcessEngine
from app.lm.rollout.http_engines import SGLangEngine, VLLMEngine


def build_engine(cfg: LMEngineSettings, model=None, tokenizer=None, weight_version: int = 0):
    """An engine from its settings; the in-process one needs the model and tokenizer."""
    if cfg.kind == "in_process":
        if model is None or tokenizer is None:
            raise ValueError(f"engine {cfg.name}: an in_process engine needs a model and a tokenizer")
        return InProcessEngine(model, tokenizer, weight_version=weight_version, name=cfg.name)
    assert cfg.url is not None
    if cfg.kind == "sglang":
        return SGLangEngine(cfg.name, cfg.url, weight_version=weight_version)
    return VLLMEngine(cfg.name, cfg.url, model=cfg.model, weight_version=weight_version)

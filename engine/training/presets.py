"""Model presets for training and the model config a `--model-config` spec names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dfim.engine.model.config import ModelConfig

# Model presets. `small` is the shipped candidate (~15.5 M parameters, 31 MB in bf16).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(  # CPU smoke tests: a few hundred thousand parameters outside the embedding
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=1,
        sliding_window=64,
        num_experts=2,
        top_k_experts=1,
        moe_intermediate_size=64,
    ),
    "small": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=8,  # 5 sliding + 1 full, then 1 sliding + 1 full (the last is always full)
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        global_head_dim=128,
        num_global_key_value_heads=1,
        sliding_window=512,  # covers the whole training context, so sliding == full during training
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=256,
    ),
    "base": dict(  # the multilingual embedded model: wider, not deeper (2-core cost is mostly per op)
        hidden_size=384,
        intermediate_size=1152,
        num_hidden_layers=8,  # the same layer pattern as small
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
        global_head_dim=128,
        num_global_key_value_heads=1,
        sliding_window=1024,  # covers the trained context (CONTEXT_TOKENS), so sliding == full in training
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=384,
        # vocab_size comes from --tokenizer, as for every preset: sized for the retrained 16,384-token
        # multilingual vocabulary (36.1 M parameters then, 29.0 M active per token).
    ),
}

# The encoder input a preset trains on when --context-tokens is not given (FIM and bos tokens included).
# `base` serves a longer file window than `small` did: the server gives the model 1,024 tokens.
CONTEXT_TOKENS: dict[str, int] = {"base": 1024}
DEFAULT_CONTEXT_TOKENS = 512


def context_tokens_for(spec: str) -> int:
    """The default --context-tokens of a --model-config spec."""
    return CONTEXT_TOKENS.get(spec, DEFAULT_CONTEXT_TOKENS)


def model_config(spec: str, vocab_size: int, canvas_length: int) -> ModelConfig:
    """A preset name, a JSON file, or inline JSON (flat ModelConfig fields or an HF config.json).

    ValueError (one line) for anything else, for JSON that is not an object and for unknown fields."""
    if spec in PRESETS:
        values: dict[str, Any] = dict(PRESETS[spec])
    else:
        text = spec
        if not spec.lstrip().startswith("{"):
            path = Path(spec)
            if not path.is_file():
                raise ValueError(f"{spec!r} is not a preset ({', '.join(PRESETS)}), a JSON file or JSON")
            text = path.read_text(encoding="utf-8")
        try:
            values = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"not valid JSON ({err})") from None
        if not isinstance(values, dict):
            raise ValueError("expected a JSON object of model config fields")
        if "text_config" in values:
            try:
                return ModelConfig.from_hf(values)
            except (KeyError, TypeError) as err:
                raise ValueError(f"incomplete HF config ({type(err).__name__}: {err})") from None
    values.setdefault("vocab_size", vocab_size)
    values.setdefault("canvas_length", canvas_length)
    return ModelConfig.from_dict(values)

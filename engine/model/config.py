"""The DiffusionGemma text architecture as one flat dataclass, and its HF `config.json` form.

`config.json` of a DiffusionGemma checkpoint nests the text stack under `text_config` and spells the
full-attention layers' overrides as `per_layer_config`; we flatten that here so the network reads
plain fields. `ModelConfig.to_hf()` writes a valid `DiffusionGemmaConfig`, so transformers loads
our checkpoints and we load the released ones unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"

# transformers needs a vision tower to instantiate DiffusionGemma; a text-only checkpoint carries the
# smallest one that builds. Our engine never runs it (dfim is text only).
TINY_VISION_CONFIG: dict[str, Any] = {
    "model_type": "gemma4_vision",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "patch_size": 2,
    "position_embedding_size": 4,
    "pooling_kernel_size": 1,
}


def default_layer_types(num_layers: int) -> list[str]:
    """Five sliding-window layers then one full layer, repeated; the last layer is always full."""
    types = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(num_layers)]
    types[-1] = FULL
    return types


@dataclass
class ModelConfig:
    vocab_size: int = 8192
    hidden_size: int = 256
    intermediate_size: int = 768  # dense MLP of every layer, and the self-conditioning MLP
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # sliding layers (grouped-query attention)
    head_dim: int = 64  # sliding layers
    global_head_dim: int = 128  # full layers use wider heads
    num_global_key_value_heads: int | None = 1  # full layers; None = num_key_value_heads
    sliding_window: int = 512  # a sliding layer sees this many positions, itself included
    layer_types: list[str] | None = None  # None = default_layer_types(num_hidden_layers)
    num_experts: int = 4  # every layer sums a dense MLP and a mixture of experts
    top_k_experts: int = 2
    moe_intermediate_size: int = 256
    rms_norm_eps: float = 1e-6
    sliding_rope_theta: float = 10_000.0
    full_rope_theta: float = 1_000_000.0
    full_partial_rotary_factor: float = 0.25  # full layers rotate only this share of each head
    final_logit_softcapping: float = 30.0  # logits = tanh(x / cap) * cap
    hidden_activation: str = "gelu_pytorch_tanh"
    pad_token_id: int = 0
    eos_token_id: int = 1
    bos_token_id: int = 2
    canvas_length: int = 256  # the largest canvas (block) the model was trained for
    max_position_embeddings: int = 131_072

    def __post_init__(self) -> None:
        if self.layer_types is None:
            self.layer_types = default_layer_types(self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers"
            )
        unknown = set(self.layer_types) - {SLIDING, FULL}
        if unknown:
            raise ValueError(f"unknown layer types {sorted(unknown)}")
        if self.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_activation {self.hidden_activation!r} is not supported")
        if not 1 <= self.top_k_experts <= self.num_experts:
            raise ValueError("top_k_experts must be between 1 and num_experts")

    @property
    def global_kv_heads(self) -> int:
        return self.num_global_key_value_heads or self.num_key_value_heads

    # --- HF config.json -------------------------------------------------------------------------

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """Read a DiffusionGemma `config.json` (the whole file, or just its `text_config`)."""
        text = config.get("text_config", config)
        if text.get("use_bidirectional_attention") == "all":
            raise ValueError("use_bidirectional_attention='all' (bidirectional encoder) is not supported")
        num_layers = int(text["num_hidden_layers"])
        layer_types = text.get("layer_types") or default_layer_types(num_layers)
        full_layers = [i for i, t in enumerate(layer_types) if t == FULL]

        global_head_dim = text.get("global_head_dim", 512)
        global_kv = text.get("num_global_key_value_heads")
        per_layer = text.get("per_layer_config") or {}
        if full_layers and str(full_layers[0]) in per_layer:
            override = per_layer[str(full_layers[0])]
            global_head_dim = override.get("head_dim", global_head_dim)
            global_kv = override.get("num_key_value_heads", global_kv)

        rope = text.get("rope_parameters") or {}
        sliding_rope = rope.get(SLIDING, {"rope_type": "default", "rope_theta": 10_000.0})
        full_rope = rope.get(
            FULL, {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}
        )
        if sliding_rope.get("rope_type", "default") != "default":
            raise ValueError(f"sliding rope_type {sliding_rope.get('rope_type')!r} is not supported")
        if (
            full_rope.get("rope_type", "proportional") != "proportional"
            or full_rope.get("factor", 1.0) != 1.0
        ):
            raise ValueError(f"full-attention rope {full_rope} is not supported")

        def token_id(name: str, default: int) -> int:
            value = text.get(name, default)
            return int(value[0] if isinstance(value, list) else value)

        return cls(
            vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text["intermediate_size"]),
            num_hidden_layers=num_layers,
            num_attention_heads=int(text["num_attention_heads"]),
            num_key_value_heads=int(text["num_key_value_heads"]),
            head_dim=int(text["head_dim"]),
            global_head_dim=int(global_head_dim),
            num_global_key_value_heads=None if global_kv is None else int(global_kv),
            sliding_window=int(text.get("sliding_window", 512)),
            layer_types=list(layer_types),
            num_experts=int(text["num_experts"]),
            top_k_experts=int(text["top_k_experts"]),
            moe_intermediate_size=int(text["moe_intermediate_size"]),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            sliding_rope_theta=float(sliding_rope.get("rope_theta", 10_000.0)),
            full_rope_theta=float(full_rope.get("rope_theta", 1_000_000.0)),
            full_partial_rotary_factor=float(full_rope.get("partial_rotary_factor", 1.0)),
            final_logit_softcapping=float(text.get("final_logit_softcapping") or 30.0),
            hidden_activation=text.get("hidden_activation", "gelu_pytorch_tanh"),
            pad_token_id=token_id("pad_token_id", 0),
            eos_token_id=token_id("eos_token_id", 1),
            bos_token_id=token_id("bos_token_id", 2),
            canvas_length=int(config.get("canvas_length") or 256),
            max_position_embeddings=int(text.get("max_position_embeddings", 131_072)),
        )

    def to_hf(self, dtype: str = "bfloat16") -> dict[str, Any]:
        """A `config.json` that transformers reads as a `DiffusionGemmaConfig`."""
        assert self.layer_types is not None
        full_override = {"head_dim": self.global_head_dim}
        if self.num_global_key_value_heads is not None:
            full_override["num_key_value_heads"] = self.num_global_key_value_heads
        text_config = {
            "model_type": "diffusion_gemma_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_activation": self.hidden_activation,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": self.eos_token_id,
            "bos_token_id": self.bos_token_id,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "sliding_window": self.sliding_window,
            "layer_types": list(self.layer_types),
            "final_logit_softcapping": self.final_logit_softcapping,
            "use_bidirectional_attention": None,
            "num_experts": self.num_experts,
            "top_k_experts": self.top_k_experts,
            "moe_intermediate_size": self.moe_intermediate_size,
            "rope_parameters": {
                SLIDING: {"rope_type": "default", "rope_theta": self.sliding_rope_theta},
                FULL: {
                    "rope_type": "proportional",
                    "partial_rotary_factor": self.full_partial_rotary_factor,
                    "rope_theta": self.full_rope_theta,
                },
            },
            "per_layer_config": {
                str(i): dict(full_override) for i, t in enumerate(self.layer_types) if t == FULL
            },
        }
        return {
            "architectures": ["DiffusionGemmaForBlockDiffusion"],
            "model_type": "diffusion_gemma",
            "dtype": dtype,
            "canvas_length": self.canvas_length,
            "tie_word_embeddings": True,
            "text_config": text_config,
            "vision_config": dict(TINY_VISION_CONFIG),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """The flat fields (`to_dict`'s form). A key that is not a field is an error (ValueError naming it):
        a misspelt field would otherwise be dropped and its default used without a word."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            names = ", ".join(repr(k) for k in unknown)
            raise ValueError(f"unknown model config key{'s' if len(unknown) > 1 else ''} {names}")
        return cls(**values)


# The text stack of the released google/diffusiongemma-26B-A4B-it (Gemma-4 26B-A4B: 25.25 B parameters), for
# the GPU benchmark and its correctness check, which run its shape with random weights.
RELEASED_26B_A4B: dict = dict(
    vocab_size=262_144,
    hidden_size=2816,
    intermediate_size=2112,
    num_hidden_layers=30,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=256,
    global_head_dim=512,
    num_global_key_value_heads=2,
    sliding_window=1024,
    num_experts=128,
    top_k_experts=8,
    moe_intermediate_size=704,
    canvas_length=256,
)

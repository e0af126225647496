"""Optional backend: a DiffusionGemma checkpoint run in-process by vLLM (`pip install vllm`, GPU, Linux).

vLLM runs the released checkpoint's own sampler (entropy bound, temperature schedule, early stop, all
read from its `generation_config.json`); dfim only builds the request. What vLLM needs for DiffusionGemma,
verified against its public source (docs/gpu.md, "vLLM backend"):

- Model runner V2. DiffusionGemma's per-request state lives in the V2 runner's `ModelState`
  (`vllm/v1/worker/gpu/`); vLLM releases before V2 became the default run the V1 runner unless
  `VLLM_USE_V2_MODEL_RUNNER=1`, which every release honours first. It must be in the environment before
  vLLM starts its engine process, so it is set before vLLM is imported.
- `diffusion_config={"canvas_length": 256}`: without it vLLM's DiffusionGemma state falls back to a
  32-token canvas, not the 256 the checkpoint was trained on.
- A small `max_num_seqs`: vLLM sizes DiffusionGemma's per-request state (a canvas, its history and the
  self-conditioning input; in early releases a canvas x 262,144-vocabulary probability buffer) and the
  sampler's full-vocabulary temporaries by it, so its default (hundreds of slots) runs out of memory;
  vLLM's recipe says at most 4. This process serves one editor, whose fills the server already runs one
  at a time: one slot.
- One BOS. The checkpoint's chat template writes `<bos>` itself; `LLM.generate` on a rendered string
  would let the tokenizer add a second. `LLM.chat` renders the checkpoint's own template (local folder
  or hub id alike) and tokenizes without special tokens, which is what vLLM's own server does.

vLLM is imported lazily: nothing here is needed, or loaded, on the default path. NOT RUN in this project:
vLLM cannot be installed in CI or on the accelerator machine here (see docs/gpu.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from dfim.engine.api import EngineError, FillRequest
from dfim.engine.inference.prompts import infill_message, rewrite_message

V2_RUNNER_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
CANVAS_LENGTH = 256  # the released checkpoints' `canvas_length`
# dfim's windows (prefix and suffix at most 8,192 tokens each) plus the instruction and a canvas. A smaller
# bound than the checkpoint's 262,144 keeps vLLM from sizing its KV cache for a context dfim never sends.
MAX_MODEL_LEN = 32_768
# Infill wants the answer, not a reasoning channel first: Gemma 4 templates think only when asked.
CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def use_v2_runner(environ: MutableMapping[str, str]) -> None:
    """Switch vLLM to model runner V2 in `environ` (os.environ for real). An explicit "0" is overridden:
    DiffusionGemma has no V1 implementation, so that setting could only fail later and less clearly."""
    environ.update(V2_RUNNER_ENV)


def engine_kwargs(
    model: str | Path,
    *,
    canvas_length: int = CANVAS_LENGTH,
    max_denoising_steps: int | None = None,
    max_num_seqs: int = 1,
    max_model_len: int = MAX_MODEL_LEN,
    **overrides: Any,
) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for DiffusionGemma serving one user. `max_denoising_steps` None
    keeps the checkpoint's own (48 for the released one); `overrides` go to vLLM as they are."""
    diffusion: dict[str, int] = {"canvas_length": canvas_length}
    if max_denoising_steps is not None:
        diffusion["max_denoising_steps"] = max_denoising_steps
    kwargs: dict[str, Any] = {
        "model": str(model),
        "diffusion_config": diffusion,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
    }
    kwargs.update(overrides)
    return kwargs


def chat_messages(request: FillRequest, language: str = "") -> list[dict[str, str]]:
    """The request as one user turn (a rewrite when it carries an instruction and the old text, as in
    `dfim.engine.inference.chat`); the checkpoint's chat template, applied by vLLM, adds the markup."""
    if request.warm_start is not None and request.instruction.strip() and not request.middle:
        message = rewrite_message(
            request.prefix, request.warm_start, request.suffix, request.instruction, language
        )
    else:
        message = infill_message(request, language)
    return [{"role": "user", "content": message}]


def check_single_bos(prompt_token_ids: list[int], bos_token_id: int | None) -> None:
    """Raise unless the prompt vLLM ran starts with exactly one BOS (a second one shifts every position the
    model was trained on). A tokenizer without a BOS token has nothing to check."""
    if bos_token_id is None:
        return
    leading = next(
        (i for i, token in enumerate(prompt_token_ids) if token != bos_token_id), len(prompt_token_ids)
    )
    if leading != 1:
        raise EngineError(f"the prompt starts with {leading} BOS tokens, not 1: check the chat template")


class VllmBackend:
    """Infill through an instruction-tuned DiffusionGemma in vLLM: request in, the middle's text out."""

    def __init__(
        self,
        model: str | Path,
        *,
        canvas_length: int = CANVAS_LENGTH,
        max_denoising_steps: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        use_v2_runner(os.environ)  # before vLLM reads its environment (it does so at import and engine start)
        try:
            import vllm
        except ImportError:
            raise EngineError("the vLLM backend needs vLLM: pip install vllm (GPU, Linux)") from None
        self._vllm = vllm
        self.model = str(model)
        kwargs = engine_kwargs(
            self.model, canvas_length=canvas_length, max_denoising_steps=max_denoising_steps, **llm_kwargs
        )
        self.llm = vllm.LLM(**kwargs)
        self.bos_token_id = getattr(self.llm.get_tokenizer(), "bos_token_id", None)

    def fill_text(self, request: FillRequest, language: str = "") -> tuple[str, float]:
        """-> (the middle's text, seconds). Stops at the model's end of turn / EOS. The checkpoint's sampler
        draws its own noise: `request.seed` is passed but the denoising is not reproducible by it."""
        params = self._vllm.SamplingParams(max_tokens=request.max_tokens, seed=request.seed)
        start = time.perf_counter()
        outputs = self.llm.chat(
            chat_messages(request, language),
            params,
            use_tqdm=False,
            chat_template_kwargs=CHAT_TEMPLATE_KWARGS,
        )
        check_single_bos(list(outputs[0].prompt_token_ids or []), self.bos_token_id)
        return strip_fences(outputs[0].outputs[0].text), time.perf_counter() - start


def strip_fences(text: str) -> str:
    """Instruction models sometimes wrap code in a fence despite being told not to."""
    lines = text.strip("\n").splitlines()
    if len(lines) >= 2 and lines[0].startswith("```") and lines[-1].strip() == "```":
        return "\n".join(lines[1:-1])
    return text

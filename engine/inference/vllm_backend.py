"""Optional backend: a DiffusionGemma checkpoint served in-process by vLLM (`pip install vllm`).

Written against vLLM's public API (>= 0.24: `vllm.LLM(..., diffusion_config=...)`, whose
`DiffusionConfig` takes `canvas_length` and `max_denoising_steps`); vLLM runs the released
checkpoint's own sampler (entropy bound, temperature schedule, early stop). vLLM is imported
lazily: nothing here is needed, or loaded, on the default path. NOT RUN in this project: vLLM
cannot be installed in CI or on the accelerator machine here (see docs/gpu.md).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dfim.engine.api import EngineError, FillRequest
from dfim.engine.inference.prompts import infill_message, load_chat_template, render


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VllmBackend:
    """Infill through an instruction-tuned checkpoint in vLLM: prompt in, the middle's text out."""

    def __init__(
        self,
        model: str | Path,
        *,
        canvas_length: int = 256,
        max_denoising_steps: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        try:
            import vllm
        except ImportError:
            raise EngineError("the vLLM backend needs vLLM: pip install vllm (GPU, Linux)") from None
        self._vllm = vllm
        self.model = str(model)
        diffusion = {"canvas_length": canvas_length}
        if max_denoising_steps is not None:
            diffusion["max_denoising_steps"] = max_denoising_steps
        self.llm = vllm.LLM(model=self.model, diffusion_config=diffusion, **llm_kwargs)
        folder = Path(self.model)
        self.template = load_chat_template(folder) if folder.is_dir() else None

    def prompt(self, request: FillRequest, language: str = "") -> str:
        return render(infill_message(request, language), self.template)

    def fill_text(self, request: FillRequest, language: str = "") -> tuple[str, float]:
        """-> (the middle's text, seconds). Stops at the model's end of turn / EOS."""
        params = self._vllm.SamplingParams(max_tokens=request.max_tokens, seed=request.seed)
        start = time.perf_counter()
        outputs = self.llm.generate([self.prompt(request, language)], params, use_tqdm=False)
        text = outputs[0].outputs[0].text
        return strip_fences(text), time.perf_counter() - start


def strip_fences(text: str) -> str:
    """Instruction models sometimes wrap code in a fence despite being told not to."""
    lines = text.strip("\n").splitlines()
    if len(lines) >= 2 and lines[0].startswith("```") and lines[-1].strip() == "```":
        return "\n".join(lines[1:-1])
    return text

"""Prompts for instruction-tuned checkpoints, which have no FIM tokens (e.g. diffusiongemma-26B-A4B-it).

An infill or rewrite request becomes one user turn that shows the code before and after the gap and
asks for the missing part only; the model's answer (one canvas, cut at its end-of-turn/EOS) is the
middle. The turn is rendered with the checkpoint's own chat template when it ships one
(`chat_template.jinja`, `tokenizer_config.json` or `chat_template.json`) and jinja2 is installed;
otherwise with Gemma's turn markup: Gemma 4's (the released DiffusionGemma's) where the vocabulary has
its `<|turn>` token, Gemma 3's where it has `<start_of_turn>`.
"""

from __future__ import annotations

import json
from pathlib import Path

from dfim.engine.api import CheckpointError, FillRequest

HOLE = "<|fill|>"  # where the answer goes, inside the shown code
# The turn markup used when a checkpoint ships no chat template (or jinja2 is missing), by vocabulary:
# Gemma 4's (DiffusionGemma's own) where the vocabulary has `<|turn>`, else Gemma 3's.
GEMMA4_TURNS = "<bos><|turn>user\n{user}<turn|>\n<|turn>model\n"
GEMMA_TURNS = "<bos><start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"

INFILL = (
    "Complete the code at {hole}. Reply with exactly the text that replaces {hole}: no explanation, "
    "no code fences, nothing that is already before or after it.{limit}\n\n{language}{code}"
)
REWRITE = (
    "Rewrite the code between <selection> and </selection> as asked: {instruction}\n"
    "Reply with exactly the new text of the selection: no explanation, no code fences.\n\n{language}{code}"
)


def skeleton_text(middle) -> str:
    """A pinned skeleton shown to the model: strings verbatim, each hole as the hole marker."""
    return "".join(part if isinstance(part, str) else HOLE for part in middle) if middle else HOLE


def infill_message(request: FillRequest, language: str = "") -> str:
    code = request.prefix + skeleton_text(request.middle) + request.suffix
    limit = f" At most about {request.max_tokens} tokens." if request.max_tokens else ""
    fence = f"Language: {language}\n" if language else ""
    return INFILL.format(hole=HOLE, limit=limit, language=fence, code=code)


def rewrite_message(prefix: str, selection: str, suffix: str, instruction: str, language: str = "") -> str:
    code = f"{prefix}<selection>{selection}</selection>{suffix}"
    fence = f"Language: {language}\n" if language else ""
    return REWRITE.format(instruction=instruction.strip() or "improve it", language=fence, code=code)


def load_chat_template(folder: str | Path) -> str | None:
    """The checkpoint's own chat template, where transformers puts one: `chat_template.jinja`, else
    `chat_template` in `tokenizer_config.json` (a string, or a list of named templates of which the
    "default" one is the chat template), else `chat_template.json` (multimodal processors)."""
    folder = Path(folder)
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    for name in ("tokenizer_config.json", "chat_template.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
            raise CheckpointError(f"{path}: not a readable JSON object ({err})") from None
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if isinstance(template, str):
            return template
    return None


def render(
    user: str, template: str | None = None, bos_token: str = "<bos>", fallback: str = GEMMA_TURNS
) -> str:
    """One user turn followed by the opening of the model's turn (add_generation_prompt), by `template`
    where there is one and jinja2 is installed, else by the `fallback` markup."""
    if template is not None:
        try:
            import jinja2
        except ImportError:
            template = None
        else:
            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            return env.from_string(template).render(
                messages=[{"role": "user", "content": user}], add_generation_prompt=True, bos_token=bos_token
            )
    return fallback.format(user=user)


def _raise(message: str) -> None:
    raise ValueError(message)

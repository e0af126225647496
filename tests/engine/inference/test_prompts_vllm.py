"""Instruction prompts for checkpoints without FIM tokens, and the optional vLLM backend."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dfim.engine.api import CheckpointError, EngineError, FillRequest, Hole
from dfim.engine.inference.prompts import HOLE, infill_message, load_chat_template, render, rewrite_message
from dfim.engine.inference.vllm_backend import (
    VllmBackend,
    chat_messages,
    check_single_bos,
    engine_kwargs,
    strip_fences,
    use_v2_runner,
    vllm_available,
)


def test_infill_prompt_shows_both_sides_and_the_hole_once():
    message = infill_message(
        FillRequest(prefix="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n")
    )
    assert message.count(HOLE) == 3  # twice in the instruction, once in the code
    assert "def add(a, b):\n    return " + HOLE + "\n\nprint(add(1, 2))" in message


def test_skeleton_pins_are_shown_verbatim():
    request = FillRequest(prefix="x = [", suffix="]\n", middle=["1, ", Hole(4), ", 3"])
    assert "x = [1, " + HOLE + ", 3]" in infill_message(request)


def test_rewrite_prompt_marks_the_selection():
    message = rewrite_message("a = 1\n", "b=2", "\nc = 3\n", "format it")
    assert "<selection>b=2</selection>" in message and "format it" in message


def test_gemma_turns_without_a_template():
    text = render("hello")
    assert text == "<bos><start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n"


def test_checkpoint_chat_template_is_used(tmp_path):
    pytest.importorskip("jinja2")
    template = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    template += "{% if add_generation_prompt %}[model]{% endif %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    loaded = load_chat_template(tmp_path)
    assert render("hi", loaded) == "<bos>[user]hi[model]"
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }}!")
    assert render("hi", load_chat_template(tmp_path)) == "hi!"


def test_chat_templates_in_every_place_transformers_writes_them(tmp_path):
    assert load_chat_template(tmp_path) is None
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "processor"}))
    assert load_chat_template(tmp_path) == "processor"
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "chat"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert load_chat_template(tmp_path) == "chat"  # tokenizer_config.json before chat_template.json
    (tmp_path / "tokenizer_config.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="tokenizer_config.json"):
        load_chat_template(tmp_path)


def test_strip_fences():
    assert strip_fences("```python\nx = 1\n```") == "x = 1"
    assert strip_fences("x = 1\n") == "x = 1\n"


@pytest.mark.skipif(vllm_available(), reason="vLLM is installed")
def test_vllm_backend_without_vllm_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with pytest.raises(EngineError, match="pip install vllm"):
        VllmBackend("some/model")
    # the runner switch is set before vLLM would be imported: its engine process reads it at start
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_the_v2_runner_switch_overrides_an_explicit_off():
    env = {"VLLM_USE_V2_MODEL_RUNNER": "0", "OTHER": "x"}
    use_v2_runner(env)
    assert env == {"VLLM_USE_V2_MODEL_RUNNER": "1", "OTHER": "x"}


def test_engine_arguments_for_one_user():
    kwargs = engine_kwargs("google/diffusiongemma-26B-A4B-it")
    assert kwargs == {
        "model": "google/diffusiongemma-26B-A4B-it",
        "diffusion_config": {"canvas_length": 256},  # vLLM's DiffusionGemma would fall back to 32
        "max_num_seqs": 1,  # vLLM's default (hundreds of request slots) runs out of memory
        "max_model_len": 32_768,
    }
    tuned = engine_kwargs(Path("/ckpt"), max_denoising_steps=16, max_num_seqs=2, gpu_memory_utilization=0.85)
    assert (
        tuned["model"] == "/ckpt" and tuned["max_num_seqs"] == 2 and tuned["gpu_memory_utilization"] == 0.85
    )
    assert tuned["diffusion_config"] == {"canvas_length": 256, "max_denoising_steps": 16}


def test_the_request_is_a_bare_user_turn_for_the_checkpoint_template():
    """No BOS and no turn markup of our own: vLLM renders the checkpoint's template (hub id or folder alike),
    whose `<bos>` is then the only one."""
    request = FillRequest(prefix="def add(a, b):\n    return ", suffix="\n")
    (message,) = chat_messages(request, "python")
    assert message["role"] == "user" and message["content"] == infill_message(request, "python")
    for markup in ("<bos>", "<start_of_turn>", "<end_of_turn>", "<|turn>", "<turn|>"):
        assert markup not in message["content"]
    rewrite = FillRequest(prefix="a = 1\n", suffix="\n", warm_start="b=2", instruction="format it")
    assert "<selection>b=2</selection>" in chat_messages(rewrite)[0]["content"]
    # an instruction without the old text (or with pins) stays an infill
    assert (
        "<selection>" not in chat_messages(FillRequest(prefix="x", suffix="", instruction="go"))[0]["content"]
    )


def test_exactly_one_bos_is_checked_on_the_prompt_vllm_ran():
    check_single_bos([2, 105, 2364], bos_token_id=2)
    check_single_bos([105, 2364], bos_token_id=None)  # no BOS token in this vocabulary: nothing to check
    with pytest.raises(EngineError, match="2 BOS"):
        check_single_bos([2, 2, 105], bos_token_id=2)
    with pytest.raises(EngineError, match="0 BOS"):
        check_single_bos([105, 2], bos_token_id=2)


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (cannot run in CI or here)")
def test_vllm_backend_fills_through_the_checkpoint_template():  # pragma: no cover - needs vLLM and a GPU
    backend = VllmBackend(os.environ.get("DFIM_VLLM_MODEL", "google/diffusiongemma-26B-A4B-it"))
    text, seconds = backend.fill_text(
        FillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=16)
    )
    assert text.strip() and seconds > 0

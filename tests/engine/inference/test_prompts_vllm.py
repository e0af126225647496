"""Instruction prompts for checkpoints without FIM tokens, and the optional vLLM backend."""

from __future__ import annotations

import json

import pytest

from dfim.engine.api import CheckpointError, EngineError, FillRequest, Hole
from dfim.engine.inference.prompts import HOLE, infill_message, load_chat_template, render, rewrite_message
from dfim.engine.inference.vllm_backend import VllmBackend, strip_fences, vllm_available


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
def test_vllm_backend_without_vllm_says_how_to_get_it():
    with pytest.raises(EngineError, match="pip install vllm"):
        VllmBackend("some/model")


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (cannot run in CI or here)")
def test_vllm_backend_builds_a_prompt(tmp_path):  # pragma: no cover - needs vLLM and a GPU
    backend = VllmBackend.__new__(VllmBackend)
    backend.template = None
    assert backend.prompt(FillRequest(prefix="a", suffix="b")).startswith("<bos><start_of_turn>user")

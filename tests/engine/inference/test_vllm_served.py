"""A model served by `vllm serve`, over HTTP: against a local stand-in server that speaks vLLM's JSON."""

from __future__ import annotations

import socket

import pytest

from dfim.engine.api import EngineError, FillCancelled, FillRequest
from dfim.engine.inference.vllm_served import API_KEY_ENV, ServedEngine, api_base, chat_body
from dfim.engine.model.shipped import is_served_url
from tests.fake_vllm import MODEL, FakeVllm

REQUEST = FillRequest(prefix="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n", max_tokens=16)


def test_model_paths_that_name_a_served_model():
    assert is_served_url("http://gpu-box:8000/v1") and is_served_url("https://gpu-box/v1")
    assert not is_served_url("") and not is_served_url(None) and not is_served_url("dfim-base")
    assert not is_served_url("/models/http-thing")
    assert api_base("http://gpu-box:8000") == api_base("http://gpu-box:8000/v1/") == "http://gpu-box:8000/v1"


def test_the_chat_request_leaves_bos_and_markup_to_the_checkpoint_template():
    body = chat_body(MODEL, FillRequest(prefix="x = ", suffix="\n", max_tokens=8, seed=3, stop=("\n",)))
    assert body["model"] == MODEL and body["max_tokens"] == 8 and body["seed"] == 3 and body["stop"] == ["\n"]
    assert body["add_special_tokens"] is False  # the template writes the one <bos>
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    (message,) = body["messages"]
    assert message["role"] == "user" and "<bos>" not in message["content"]
    assert "<start_of_turn>" not in message["content"]  # Gemma 3 markup: not DiffusionGemma's
    assert "seed" not in chat_body(MODEL, FillRequest(prefix="", suffix=""))


def test_connect_picks_the_served_model_and_a_fill_returns_its_answer():
    with FakeVllm(reply="```python\na + b\n```", finish_reason="stop") as fake:
        engine = ServedEngine.connect(fake.url)
        assert engine.model_name == MODEL and str(engine.device) == f"vLLM at {fake.url}"
        result = engine.fill(REQUEST)
        assert result.text == "a + b"  # a fence the instruction model added despite the prompt is dropped
        assert (result.tokens, result.context_tokens, result.stop_reason) == (4, 120, "stable")
        assert result.confidence is None  # no token scores over HTTP: the gate has nothing to judge
        (body,) = fake.chat_bodies()
        assert (
            body["model"] == MODEL and "def add(a, b):\n    return <|fill|>" in body["messages"][0]["content"]
        )
        fake.finish_reason = "length"
        assert engine.fill(REQUEST).stop_reason == "max_steps"


def test_the_api_key_is_sent_as_a_bearer_token(monkeypatch):
    with FakeVllm(api_key="team-secret") as fake:
        with pytest.raises(EngineError, match="HTTP 401"):
            ServedEngine.connect(fake.url)
        monkeypatch.setenv(API_KEY_ENV, "team-secret")
        assert ServedEngine.connect(fake.url).fill(REQUEST).text == "a + b"


def test_failures_are_one_line_engine_errors():
    with FakeVllm() as fake:
        with pytest.raises(EngineError, match="does not serve other/model"):
            ServedEngine.connect(fake.url, "other/model")
        engine = ServedEngine.connect(fake.url, MODEL)
        fake.fail_with = 503
        with pytest.raises(EngineError, match="HTTP 503"):
            engine.fill(REQUEST)
        with pytest.raises(FillCancelled):
            engine.fill(FillRequest(prefix="x", suffix="", cancel=lambda: True))
        assert len(fake.chat_bodies()) == 1  # the cancelled fill was never sent
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(EngineError, match="cannot reach the vLLM server"):
        ServedEngine.connect(f"http://127.0.0.1:{port}", timeout=2.0)

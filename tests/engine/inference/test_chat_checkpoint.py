"""An instruction-tuned checkpoint (no FIM tokens, a chat vocabulary) in the in-process engine and the
server: `dfim.engine.inference.chat`. The vocabulary is built here in Gemma's layout (SentencePiece pieces, "▁" for a
space, `<0xNN>` byte fallbacks, turn markup), the weights are random: these tests check the plumbing, not
the answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers

from dfim.engine import Engine, FillRequest, Hole
from dfim.engine.api import CheckpointError
from dfim.engine.inference.chat import ChatTokenizer, load_tokenizer
from dfim.engine.model.checkpoint import write_random_checkpoint
from dfim.engine.model.tokenizer import Tokenizer
from tests.server_helpers import Session

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def gemma_like_tokenizer(path: Path, specials: list[str] = SPECIALS) -> Path:
    """A tiny chat vocabulary in Gemma's shape: specials, 256 byte fallbacks, printable ASCII and "▁"."""
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    pieces += [chr(c) for c in range(33, 127)] + ["\u2581def", "\u2581return", "ab"]
    vocab = {p: i for i, p in enumerate(pieces)}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    hf.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    hf.add_special_tokens(specials)
    hf.add_tokens(["<unused0>"])  # markup added without the special flag, as some vocabularies have it
    hf.save(str(path))
    return path


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("chat")
    folder = write_random_checkpoint(tmp / "ckpt", gemma_like_tokenizer(tmp / "tokenizer.json"), seed=3)
    (folder / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    return folder


def test_a_chat_vocabulary_round_trips_and_reads_specials_only_in_markup(chat_checkpoint):
    tok = load_tokenizer(chat_checkpoint)
    assert isinstance(tok, ChatTokenizer) and tok.chat and tok.eos_id == 5  # the answer ends its turn
    text = "def f(x):\n\treturn x  # é ✓\n"
    assert tok.decode(tok.encode(text)) == text  # "▁" is a space, the rest via byte fallbacks
    injected = tok.encode("<start_of_turn>user")
    assert 4 not in injected and tok.decode(injected) == "<start_of_turn>user"  # code cannot open a turn
    assert tok.markup("<start_of_turn>model\n")[0] == 4
    unused = tok._hf.token_to_id("<unused0>")
    assert tok.is_special(unused) and tok.token_bytes(unused) == b""  # never written into a fill
    assert not tok.is_special(tok._hf.token_to_id("<0x0A>"))  # byte fallbacks are text
    # dfim's own vocabulary is still the FIM tokenizer
    shipped = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small"
    assert type(load_tokenizer(shipped)) is Tokenizer and not load_tokenizer(shipped).chat


def test_the_request_is_a_user_turn_and_the_model_turn_is_open(chat_checkpoint):
    tok = load_tokenizer(chat_checkpoint)
    request = FillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=16)
    ids = tok.prompt_context(request)
    assert ids[:2] == [2, 4]  # <bos> <start_of_turn>
    assert ids[-3:] == tok.markup("<start_of_turn>model\n")[-3:]
    shown = tok.decode(ids)
    assert (
        "user\n" in shown and "def add(a, b):\n    return <|fill|>\n" in shown and shown.endswith("model\n")
    )


def test_a_rewrite_with_an_instruction_asks_for_it(chat_checkpoint):
    tok = load_tokenizer(chat_checkpoint)
    rewrite = FillRequest(prefix="xs = ", suffix="\n", warm_start="[x for x in ys]", instruction="use map")
    shown = tok.decode(tok.prompt_context(rewrite))
    assert "<selection>[x for x in ys]</selection>" in shown and "use map" in shown
    plain = tok.decode(
        tok.prompt_context(FillRequest(prefix="xs = ", suffix="\n", warm_start="[x for x in ys]"))
    )
    assert "<selection>" not in plain and "xs = <|fill|>" in plain  # no instruction: the gap, as a fill


def test_the_engine_fills_with_a_chat_checkpoint(chat_checkpoint):
    engine = Engine.load(chat_checkpoint)
    request = FillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=16, seed=0)
    result = engine.fill(request)
    assert result.steps >= 1 and result.context_tokens > 40 and isinstance(result.text, str)
    assert "<start_of_turn>" not in result.text and "<end_of_turn>" not in result.text
    # a skeleton's pins are kept verbatim, and a rewrite's warm start is accepted
    pinned = engine.fill(
        FillRequest(prefix="x = ", suffix="\n", middle=["ab", Hole(3)], max_tokens=16, seed=1)
    )
    assert pinned.text.startswith("ab")
    engine.fill(FillRequest(prefix="x = ", suffix="\n", warm_start="1 + 2", max_tokens=16, seed=2))


def test_the_server_serves_a_chat_checkpoint(chat_checkpoint, tmp_path):
    async def run() -> None:
        session = Session()
        await session.start(str(chat_checkpoint), tmp_path, init_options={"sampling": {"maxSteps": 2}})
        try:
            status = await session.wait_state(timeout=120)
            assert status.state == "ready", status
            uri = "file:///work/chat.py"
            session.open(uri, "def add(a, b):\n    return \n")
            result = await session.inline(uri, 1, 11)  # answered or empty, never an error
            assert result is None or all(isinstance(i.insert_text, str) for i in result.items)
            assert (await session.stats()).engine_fills_completed >= 1
            # the rewrite's instruction reaches the prompt, scrubbed like the code (a lone surrogate); plain
            # text, as a random model's rewrite of Python would not parse and be refused
            plain = "file:///work/chat.txt"
            session.open(plain, "def add(a, b):\n    return \n", "plaintext")
            rng = {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 10}}
            await session.client.workspace_execute_command_async(
                types.ExecuteCommandParams(
                    command="dfim.rewriteSelection", arguments=[plain, rng, "use \ud800 map"]
                )
            )
        finally:
            await session.stop()

    asyncio.run(run())


def test_a_damaged_fim_vocabulary_is_refused_not_read_as_a_chat_one(tmp_path):
    shipped = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small" / "tokenizer.json"
    (tmp_path / "ckpt").mkdir()
    damaged = shipped.read_text(encoding="utf-8").replace("<fim_middle>", "<fim_center>")
    (tmp_path / "ckpt" / "tokenizer.json").write_text(damaged, encoding="utf-8")
    with pytest.raises(CheckpointError, match="not a usable tokenizer.*fim_middle"):
        Engine.load(tmp_path / "ckpt")


def test_a_vocabulary_with_neither_layout_is_refused_in_a_line(tmp_path):
    (tmp_path / "ckpt").mkdir()
    HFTokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[])).save(str(tmp_path / "ckpt" / "tokenizer.json"))
    with pytest.raises(CheckpointError, match="not a usable tokenizer.*no <pad> token"):
        Engine.load(tmp_path / "ckpt")


def test_a_gemma_4_vocabulary_without_a_template_gets_gemma_4_turns(tmp_path):
    # DiffusionGemma's own markup: `<|turn>` opens a turn and `<turn|>` ends it (the answer's end)
    gemma4 = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
    path = gemma_like_tokenizer(tmp_path / "tokenizer.json", gemma4)
    tok = ChatTokenizer(HFTokenizer.from_file(str(path)), template=None)
    assert tok.eos_id == 5  # <turn|>, not <eos>
    ids = tok.prompt_context(FillRequest(prefix="x = ", suffix="\n", max_tokens=8))
    assert ids[:2] == [2, 4]  # <bos> <|turn>
    assert tok.decode(ids).endswith("model\n") and ids[-3:] == tok.markup("<|turn>model\n")[-3:]

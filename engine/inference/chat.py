"""Instruction-tuned checkpoints in the in-process engine (e.g. diffusiongemma-26B-A4B-it).

Such a checkpoint has no FIM tokens: its tokenizer is a chat vocabulary (Gemma's: SentencePiece pieces with
"▁" for a space and `<0xNN>` byte fallbacks, turn markup: Gemma 4's `<|turn>` / `<turn|>`, Gemma 3's
`<start_of_turn>` / `<end_of_turn>`). `ChatTokenizer`
gives the engine the same interface as the FIM `Tokenizer` over such a vocabulary, and its
`prompt_context` replaces `fim_context`: the encoder reads the request as one user turn (`dfim.engine.inference.prompts`:
the code with a marker at the gap, "reply with exactly the missing text") rendered with the checkpoint's
chat template, followed by the opening of the model's turn; the canvas is the model's answer, which ends at
the end of its turn. A rewrite with an instruction (`FillRequest.instruction`) asks for the selection rewritten
as told instead. The markup's special tokens come from the template; the user's code is encoded with
special tokens read as plain text, so a file cannot inject a turn.

Not done for these checkpoints: token healing (the code is not at the end of the context), the encoder's
draft and the likelihood ranking (both read the FIM layout).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from dfim.engine.api import FillRequest
from dfim.engine.inference.prompts import (
    GEMMA4_TURNS,
    GEMMA_TURNS,
    infill_message,
    load_chat_template,
    render,
    rewrite_message,
)
from dfim.engine.model.tokenizer import Tokenizer, _byte_decoder

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_MARKUP = re.compile(r"<[^<>\s]+>")
_USER = "\x00dfim-user-turn\x00"  # stands for the user's text while the template is split around it


FIM_NAMES = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")


def is_fim_vocabulary(hf: HFTokenizer) -> bool:
    """Whether the tokenizer is meant for FIM: it has any of dfim's FIM tokens. (`Tokenizer` then insists
    on the exact layout, so a damaged FIM vocabulary is refused, not served as a chat one.)"""
    return any(hf.token_to_id(name) is not None for name in FIM_NAMES)


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """A checkpoint folder's `tokenizer.json`: dfim's FIM vocabulary, else a chat vocabulary with the folder's
    chat template (an instruction-tuned checkpoint)."""
    folder = Path(folder)
    hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    if is_fim_vocabulary(hf):
        return Tokenizer(hf)
    return ChatTokenizer(hf, load_chat_template(folder))


class ChatTokenizer(Tokenizer):
    """A chat vocabulary behind the engine's tokenizer interface; `chat` marks it for `build_canvas`."""

    chat = True

    def __init__(self, hf: HFTokenizer, template: str | None = None) -> None:
        # Not Tokenizer.__init__: that one insists on the FIM layout.
        self._hf = hf
        self._hf.encode_special_tokens = True  # the user's text never becomes control tokens
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
        # Control tokens: the added tokens flagged special, and added ones that look like markup (`<unused3>`,
        # `<start_of_image>`: not always flagged, never text a fill should write). Byte fallbacks are text.
        self._special = {
            i
            for i, t in hf.get_added_tokens_decoder().items()
            if t.special or (_MARKUP.fullmatch(t.content) and not _BYTE_PIECE.fullmatch(t.content))
        }

        def need(*names: str) -> int:
            for name in names:
                if (i := hf.token_to_id(name)) is not None:
                    return i
            raise ValueError(f"tokenizer: no {' or '.join(names)} token")

        self.pad_id = need("<pad>")
        self.bos_id = need("<bos>")
        self.unk_id = hf.token_to_id("<unk>") if hf.token_to_id("<unk>") is not None else self.pad_id
        # The answer is the model's turn: it ends at the end of that turn, Gemma 4's `<turn|>` or Gemma 3's
        # `<end_of_turn>` (or EOS where there is no markup).
        self.eos_id = need("<turn|>", "<end_of_turn>", "<eos>")
        self.fim_prefix_id = self.fim_suffix_id = self.fim_middle_id = self.file_sep_id = -1
        self.num_special = 0
        self._special |= {self.pad_id, self.bos_id, self.eos_id}
        decoder = json.dumps(json.loads(hf.to_str()).get("decoder") or {})
        byte_level = _byte_decoder() if "ByteLevel" in decoder else None
        self._bytes = [
            b"" if i in self._special else _piece_bytes(hf.id_to_token(i), byte_level)
            for i in range(self.vocab_size)
        ]
        # The turn around the user's text, rendered and encoded once (the template is the same every time).
        fallback = GEMMA4_TURNS if hf.token_to_id("<|turn>") is not None else GEMMA_TURNS
        head, _, tail = render(_USER, template, fallback=fallback).partition(_USER)
        self._turn = (self.markup(head), self.markup(tail))

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special

    def fim_context(self, prefix_ids: Sequence[int], suffix_ids: Sequence[int]) -> list[int]:
        raise NotImplementedError("a chat vocabulary has no FIM tokens: use prompt_context")

    def markup(self, text: str) -> list[int]:
        """Token ids of template markup, its special tokens read as such."""
        self._hf.encode_special_tokens = False
        try:
            return self._hf.encode(text, add_special_tokens=False).ids if text else []
        finally:
            self._hf.encode_special_tokens = True

    def prompt_context(self, request: FillRequest, language: str = "") -> list[int]:
        """The encoder input for `request`: its user turn and the opening of the model's turn."""
        if request.warm_start is not None and request.instruction.strip() and not request.middle:
            message = rewrite_message(
                request.prefix, request.warm_start, request.suffix, request.instruction, language
            )
        else:
            message = infill_message(request, language)
        head, tail = self._turn
        return head + self.encode(message) + tail


def _piece_bytes(piece: str | None, byte_level: dict[str, int] | None) -> bytes:
    """The bytes a token stands for: a `<0xNN>` byte fallback, a byte-level BPE piece (`byte_level`: its
    character-to-byte map) or a SentencePiece piece ("▁" is a space)."""
    if piece is None:
        return b""
    if m := _BYTE_PIECE.fullmatch(piece):
        return bytes([int(m.group(1), 16)])
    if byte_level is not None and all(c in byte_level for c in piece):
        return bytes(byte_level[c] for c in piece)
    return piece.replace("\u2581", " ").encode("utf-8")

"""Byte-level BPE tokenizer for code, with the FIM and canvas special tokens.

Wraps the `tokenizers` library. Byte-level means every string (emoji, CRLF, tabs, invalid
surrogates aside) round-trips exactly: `decode(encode(x)) == x`. No prefix space is added,
so a completion's tokens are the same whether or not it starts a line.

Special ids are fixed by docs/interfaces.md (0 pad, 1 eos, 2 bos, 3 unk, 4..6 FIM, 7 file
separator, 8..15 reserved) and are never produced by `encode`: text that happens to contain
"<fim_prefix>" is encoded as ordinary bytes, so a file cannot inject control tokens.

Build the shipped vocabulary with:
    dfim tokenizer --out engine/weights/dfim-base/tokenizer.json [--corpus SHARD ...] [DIR ...]
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<fim_prefix>",
    "<fim_suffix>",
    "<fim_middle>",
    "<file_sep>",
] + [f"<reserved_{k}>" for k in range(8)]
NUM_SPECIAL = len(SPECIAL_TOKENS)  # 16: ids below this are control tokens
VOCAB_SIZE = 8192

# GPT-4 style split, tuned for code: contractions; a word with at most one leading non-letter
# (" foo", "_bar", ".baz"); digits in groups of at most 3 (numbers stay cheap but arithmetic-like
# patterns are not memorised as whole tokens); punctuation runs; newline runs (with the trailing
# spaces of the blank lines before them); whitespace runs not followed by text (indentation becomes
# one token, the last space stays with the following word as in " return").
SPLIT_PATTERN = (
    r"'(?i:[sdmt]|ll|ve|re)"
    r"|[^\r\n\p{L}\p{N}]?+\p{L}+"
    r"|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]++[\r\n]*"
    r"|\s*[\r\n]"
    r"|\s+(?!\S)"
    r"|\s+"
)


FIM_SPECIALS = 4  # <bos> <fim_suffix> <fim_prefix> <fim_middle> around the two windows (fim_context)


def tail_within(text: str, budget: int, count: Callable[[str], int]) -> str:
    """The end of `text` that `count` (tokens) puts within `budget`, starting on a whole line where it can:
    shrink by the measured ratio, then on to the next line's start. Cutting tokens off the front instead
    could start a context inside a character's bytes."""
    while text and (n := count(text)) > budget:
        cut = len(text) - int(len(text) * budget / n * 0.95)
        keep = text[cut:]
        if text[cut - 1] != "\n" and "\n" in keep[:-1]:  # not already at a line's start
            keep = keep[keep.find("\n") + 1 :]
        text = keep
    return text


def head_within(text: str, budget: int, count: Callable[[str], int]) -> str:
    """The start of `text` within `budget`, ending after a whole line where it can (see `tail_within`)."""
    while text and (n := count(text)) > budget:
        keep = text[: int(len(text) * budget / n * 0.95)]
        text = keep[: keep.rfind("\n") + 1] if "\n" in keep else keep
    return text


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte->printable-unicode map used by ByteLevel."""
    return {ch: b for b, ch in enumerate_byte_alphabet().items()}


def enumerate_byte_alphabet() -> dict[int, str]:
    # Same construction as GPT-2: printable bytes map to themselves, the rest shift past 255.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


class Tokenizer:
    """The engine's tokenizer (see docs/interfaces.md)."""

    chat = False  # True for an instruction-tuned checkpoint's vocabulary (`dfim.engine.inference.chat.ChatTokenizer`)

    def __init__(self, hf: HFTokenizer) -> None:
        self._hf = hf
        # Encode special-token strings found in text as plain bytes (no control-token injection).
        self._hf.encode_special_tokens = True
        self.vocab_size: int = hf.get_vocab_size(with_added_tokens=True)
        ids = {name: hf.token_to_id(name) for name in SPECIAL_TOKENS}
        for expected, name in enumerate(SPECIAL_TOKENS):
            if ids[name] != expected:
                raise ValueError(f"tokenizer: special token {name} has id {ids[name]}, expected {expected}")
        self.pad_id = 0
        self.eos_id = 1
        self.bos_id = 2
        self.unk_id = 3
        self.fim_prefix_id = 4
        self.fim_suffix_id = 5
        self.fim_middle_id = 6
        self.file_sep_id = 7
        self.num_special = NUM_SPECIAL
        # Bytes of every token, precomputed: decode and token healing are then pure lookups.
        dec = _byte_decoder()
        self._bytes: list[bytes] = []
        for i in range(self.vocab_size):
            if i < NUM_SPECIAL:
                self._bytes.append(b"")
                continue
            piece = hf.id_to_token(i)
            self._bytes.append(bytes(dec[c] for c in piece))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Tokenizer:
        return cls(HFTokenizer.from_file(str(path)))

    def save(self, path: str | os.PathLike) -> None:
        self._hf.save(str(path))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no special tokens are added."""
        if not text:
            return []
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Exact inverse of `encode`. Special tokens (pad, eos, ...) decode to nothing; a cut inside a
        multi-byte character decodes to U+FFFD."""
        table = self._bytes
        return b"".join(table[int(i)] for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (empty for special tokens)."""
        return self._bytes[int(token_id)]

    @property
    def bytes_table(self) -> list[bytes]:
        """bytes of every token id (empty for special tokens), for fast decoding of many ids."""
        return self._bytes

    def is_special(self, token_id: int) -> bool:
        return int(token_id) < NUM_SPECIAL

    def fim_context(self, prefix_ids: Sequence[int], suffix_ids: Sequence[int]) -> list[int]:
        """Encoder input for infilling: `<bos> <fim_suffix> suffix <fim_prefix> prefix <fim_middle>`.

        Suffix first: while the user types, only the end of the prefix changes, so the cached
        keys/values of everything before it stay valid."""
        return [
            self.bos_id,
            self.fim_suffix_id,
            *suffix_ids,
            self.fim_prefix_id,
            *prefix_ids,
            self.fim_middle_id,
        ]


# ----------------------------------------------------------------------------------------------
# Building the vocabulary


def new_bpe() -> HFTokenizer:
    """An untrained byte-level BPE with the code split pattern and no prefix space."""
    tok = HFTokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


# Path parts that mark tests, vendored copies or tools we do not want to shape the vocabulary.
SKIP_PARTS = {
    "test",
    "tests",
    "idlelib",
    "__pycache__",
    "_vendor",
    "vendor",
    "vendored",
    "third_party",
    "site-packages",  # the stdlib walk must not descend into the interpreter's own site-packages
}


def iter_py_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        if "shared/data" in Path(dirpath).as_posix() + "/":
            continue  # evaluation sets are never training material
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_PARTS and not d.endswith(".dist-info"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def read_training_text(roots: Sequence[Path], max_bytes: int, seed: int = 0) -> list[str]:
    """A random sample of the `.py` files under `roots`, about `max_bytes` of them."""
    files = [p for root in roots for p in iter_py_files(root)]
    random.Random(seed).shuffle(files)
    texts: list[str] = []
    total = 0
    for path in files:
        if total >= max_bytes:
            break
        try:
            raw = path.read_bytes()
            if len(raw) > 500_000:
                continue
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(raw)
    return texts


# The languages of the corpus shards besides Python (whose sample comes from .py folders).
CORPUS_LANGUAGES = ("typescript", "javascript", "go", "rust", "java", "c", "cpp")


def read_corpus_text(
    shards: Sequence[Path], max_bytes: int, seed: int = 0, languages: Sequence[str] = CORPUS_LANGUAGES
) -> dict[str, list[str]]:
    """Language -> texts from corpus shards: up to `max_bytes / len(languages)` of each language.

    Only records the training data would keep shape the vocabulary: a permissive licence, no
    generated or minified text. Shards are read in random interleaving so that a shard ordered by
    language does not decide the sample; a language with less than its share leaves it unused."""
    from dfim.engine.training.data import MAX_FILE_BYTES, quality_problem
    from dfim.engine.training.sources import corpus_record, is_permissive, iter_corpus_lines

    readers = [iter_corpus_lines(Path(s)) for s in shards]
    rng = random.Random(seed)
    share = max_bytes / len(languages)
    by_lang: dict[str, list[str]] = {lang: [] for lang in languages}
    sizes = dict.fromkeys(languages, 0)
    while readers and any(n < share for n in sizes.values()):
        reader = readers[rng.randrange(len(readers))]
        line = next(reader, None)
        if line is None:
            readers.remove(reader)
            continue
        try:
            row = corpus_record(line)
        except ValueError:
            continue
        lang, text = row.get("lang"), row["text"]
        if lang not in sizes or sizes[lang] >= share:
            continue
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if size > MAX_FILE_BYTES or not is_permissive(row.get("license") or "") or quality_problem(text):
            continue
        by_lang[lang].append(text)
        sizes[lang] += size
    return {lang: texts for lang, texts in by_lang.items() if texts}


def train(texts: Sequence[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    hf = new_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return Tokenizer(hf)


def default_roots() -> list[Path]:
    import site
    import sysconfig

    roots = [Path(sysconfig.get_paths()["stdlib"])]
    roots += [Path(p) for p in site.getsitepackages() if Path(p).is_dir()]
    return roots

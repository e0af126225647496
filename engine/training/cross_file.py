"""Cross-file examples: a block of other files of the same project at the start of the prefix window.

The server can put the definitions of names a file imports, and chunks of other open files, in a comment
block before the file's own code (`dfim.engine.inference.extra_block`). A model trained on single files
learnt nothing from it (docs/decisions.md, 75), so some training examples carry such a block, built from
the other files of the example's project as the data build recorded them in its manifest:

- definitions, in other files of the project, of names the middle uses (what a completion would copy),
  and of names used next to the cut (what the server shows, by nearness of use, when it cannot know
  the middle);
- chunks of other files that may have nothing to do with the cut (the server's ring of recent chunks).

A block never holds only what is useful, so the model learns to copy when a definition fits and to read
past it otherwise. The block takes at most a share of the prefix budget, as the server's does.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dfim.engine.inference.extra_block import COMMENTS, render_block

# A definition line: keywords of the served languages before a name, or a C-like signature (a type
# before the name, then an open parenthesis), at an indent of at most one level.
DEFINITION = re.compile(
    r"^[ \t]*(?:(?:export|pub(?:\(\w+\))?|public|private|protected|internal|static|async|final|abstract|"
    r"extern|inline|unsafe|override|virtual|default|declare)\s+)*"
    r"(?:def|class|fn|func|function\*?|struct|enum|trait|interface|type|const|let|var|val|union)\s+"
    r"(?:\([^)\n]*\)\s*)?\*?([A-Za-z_]\w*)",
    re.M,
)
C_SIGNATURE = re.compile(
    r"^[ \t]{0,4}(?!(?:return|if|for|while|switch|else|case|do|throw|new|await|yield|sizeof|goto|delete)\b)"
    r"[A-Za-z_][\w<>\[\],:*& \t]*?[\s*&]([A-Za-z_]\w*)[ \t]*\([^;{}\n]*(?:\)|,)[^\n]*$",
    re.M,
)
IDENTIFIER = re.compile(r"[A-Za-z_]\w{2,}")
COMMON = frozenset(
    "def class return self None True False import from and not for while else elif with pass break continue "
    "func function const let var val struct enum trait impl interface type public private protected static "
    "void int char bool float double long short unsigned string String this new null nil true false "
    "package use mut pub async await yield case switch default include define ifdef endif".split()
)


@dataclass
class CrossFileSettings:
    max_share: float = 0.25  # of the prefix budget, as the server's `context.extra.share`
    useful_p: float = 0.7  # a definition of a name the middle uses goes in, when one is found
    max_files: int = 8  # other files read per example to look for definitions
    read_chars: int = 40_000  # of each file read


class ProjectFiles:
    """Which documents of a split belong to the same project, and the path each is shown under, from the data
    build's manifest (one line per kept file, in document order per split)."""

    def __init__(self, paths: list[str], langs: list[str], groups: np.ndarray) -> None:
        self.paths, self.langs, self.groups = paths, langs, groups
        members: dict[int, list[int]] = defaultdict(list)
        for i, g in enumerate(groups.tolist()):
            members[g].append(i)
        self.members = {g: np.array(m) for g, m in members.items() if len(m) > 1}

    @classmethod
    def load(cls, folder: str | Path, split: str, n_docs: int) -> ProjectFiles | None:
        """None when the folder has no manifest or it does not match the split's documents."""
        manifest = Path(folder) / "manifest.jsonl"
        if not manifest.is_file():
            return None
        paths: list[str] = []
        langs: list[str] = []
        keys: dict[str, int] = {}
        groups: list[int] = []
        with open(manifest, encoding="utf-8") as f:
            for line in f:
                entry = json.loads(line)
                if entry.get("split") != split:
                    continue
                project, shown = project_and_path(entry["path"])
                groups.append(keys.setdefault(project, len(keys)))
                paths.append(shown)
                langs.append(entry.get("lang", "?"))
        if len(paths) != n_docs:
            return None
        return cls(paths, langs, np.array(groups, dtype=np.int64))

    def others(self, doc: int) -> np.ndarray | None:
        """The other documents of `doc`'s project (None: it is alone)."""
        m = self.members.get(int(self.groups[doc]))
        return None if m is None else m[m != doc]


def project_and_path(manifest_path: str) -> tuple[str, str]:
    """("kind:project", the path shown) of a manifest path such as `corpus:PROJECT/src/a.ts` (the first folder
    is the project; shown as `src/a.ts`) or `site-packages:pkg/mod.py` (the package; shown whole, as the
    server shows paths from the workspace root)."""
    kind, _, rel = manifest_path.partition(":")
    top, sep, rest = rel.partition("/")
    if not sep:
        return f"{kind}:{rel}", rel
    if kind in ("corpus", "shard"):
        return f"{kind}:{top}", rest
    return f"{kind}:{top}", rel


def definitions(text: str) -> dict[str, int]:
    """Defined name -> the character offset of its definition line (the first one)."""
    found: dict[str, int] = {}
    for pattern in (DEFINITION, C_SIGNATURE):
        for m in pattern.finditer(text):
            found.setdefault(m.group(1), m.start())
    return found


def names_used(text: str) -> list[str]:
    """Identifiers of `text` worth looking up, in order of first use."""
    seen: dict[str, None] = {}
    for m in IDENTIFIER.finditer(text):
        if m.group(0) not in COMMON:
            seen.setdefault(m.group(0), None)
    return list(seen)


def lines_from(text: str, start: int, count: int) -> str:
    """`count` lines of `text` from the line at `start`, trailing blank lines dropped."""
    lines = text[start:].split("\n", count)[:count]
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def random_chunk(text: str, rng: random.Random) -> str:
    """6-32 lines of `text` from a random place: what the server's ring of recent chunks may hold."""
    lines = text.split("\n")
    size = rng.randint(6, 32)
    at = rng.randrange(max(1, len(lines) - size))
    return "\n".join(lines[at : at + size]).strip("\n")


class CrossFileBlocks:
    """Builds the block for one example; `read(doc)` gives a document's text."""

    def __init__(
        self,
        projects: ProjectFiles,
        settings: CrossFileSettings,
        rng: random.Random,
        read: Callable[[int], str],
    ) -> None:
        self.projects, self.s, self.rng, self.read = projects, settings, rng, read

    def block(self, doc: int, middle: str, near: str, budget: int, count_tokens: Callable[[str], int]) -> str:
        """The block for an example of `doc` whose middle is `middle` and whose text near the cut is `near`,
        within `budget` tokens ("" when there is none to write)."""
        rng, s = self.rng, self.s
        others = self.projects.others(doc)
        own = self.projects.paths[doc]
        comment = COMMENTS.get(self.projects.langs[doc])  # the manifest's languages are the server's names
        if others is None or comment is None or budget < 32:
            return ""
        picked = others if len(others) <= s.max_files else rng.sample(list(others), s.max_files)
        texts = {int(i): self.read(int(i))[: s.read_chars] for i in picked}
        defined = {i: definitions(t) for i, t in texts.items()}
        pieces: list[tuple[str, str]] = []

        def add_definitions(names: list[str], limit: int) -> None:
            for name in names:
                if limit <= 0:
                    return
                for i, found in defined.items():
                    if name in found:
                        piece = (
                            self.projects.paths[i],
                            lines_from(texts[i], found[name], rng.randint(1, 10)),
                        )
                        if piece not in pieces:
                            pieces.append(piece)
                            limit -= 1
                        break

        if rng.random() < s.useful_p:
            add_definitions(names_used(middle), rng.randint(1, 3))
        add_definitions(names_used(near), rng.randint(0, 3))
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            i = rng.choice(list(texts))
            pieces.append((self.projects.paths[i], random_chunk(texts[i], rng)))
        pieces = [(path, text) for path, text in pieces if text.strip()]
        if not pieces:
            return ""
        if rng.random() < 0.5:  # the server writes definitions first and chunks after; not always both
            rng.shuffle(pieces)
        return fit(pieces, own, comment, budget, count_tokens)


def fit(
    pieces: list[tuple[str, str]], own: str, comment: str, budget: int, count_tokens: Callable[[str], int]
) -> str:
    """The block of as many pieces as fit `budget` tokens, in order (the last one cut to whole lines)."""
    kept: list[tuple[str, str]] = []
    text = ""
    for path, piece in pieces:
        lines = piece.split("\n")
        while lines:
            trial = kept + [(path, "\n".join(lines))]
            rendered = render_block(trial, own, comment)
            if count_tokens(rendered) <= budget:
                kept, text = trial, rendered
                break
            lines = lines[: len(lines) // 2] if len(lines) > 1 else []
        if not lines:
            break
    return text

"""HumanEval decontamination: training data never defines a function of the evaluation set.

The signature list ships as a resource file (humaneval_signatures.txt) so the exclusion holds where
the evaluation set is absent (the GPU machine); where the set is present (a `shared/data` folder next
to the checkout, or $DFIM_EVAL_DATA), its prompts add their own signatures.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SIGNATURES_FILE = Path(__file__).with_name("humaneval_signatures.txt")


def builtin_signatures() -> frozenset[str]:
    """The shipped whitespace-normalised HumanEval `def` lines (comments and blank lines skipped)."""
    lines = SIGNATURES_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(_norm_ws(line) for line in lines if line.strip() and not line.startswith("#"))


def find_eval_dirs() -> list[Path]:
    """The HumanEval-infilling set, wherever this checkout sees it (shared/data next to the repo)."""
    repo = Path(__file__).resolve().parents[2]
    candidates = [Path(os.environ["DFIM_EVAL_DATA"])] if os.environ.get("DFIM_EVAL_DATA") else []
    candidates += [
        repo / "shared" / "data" / "humaneval-infilling",
        repo.parent / "shared" / "data" / "humaneval-infilling",
    ]
    return [c for c in candidates if c.is_dir()]


def _norm_ws(text: str) -> str:
    return " ".join(text.split())


def is_distinctive(name: str) -> bool:
    """A function name unlikely to be defined by unrelated code (`has_close_elements`, `minSubArraySum`),
    unlike `add` or `compare`."""
    return (len(name) >= 10 and "_" in name.strip("_")) or (len(name) >= 8 and name != name.lower())


@dataclass
class EvalFilter:
    """Drops files that contain a HumanEval prompt's function definition.

    `signatures`: whitespace-normalised `def name(args) -> ret:` lines from the prompts, matched
    verbatim. `names`: entry points distinctive enough that `def name(` alone identifies them
    (generic ones such as `add` or `compare` would drop unrelated code)."""

    signatures: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()

    @classmethod
    def load(cls, dirs: Sequence[Path], builtin: bool = True) -> EvalFilter:
        """Signatures from the prompts of every `*.jsonl[.gz]` in `dirs`, plus the built-in list."""
        signatures: set[str] = set(builtin_signatures()) if builtin else set()
        for d in dirs:
            for path in sorted(d.glob("*.jsonl.gz")) + sorted(d.glob("*.jsonl")):
                opener = gzip.open if path.suffix == ".gz" else open
                with opener(path, "rt", encoding="utf-8") as f:
                    for line in f:
                        row = json.loads(line)
                        name = row.get("entry_point")
                        if name:
                            pattern = rf"^\s*def {re.escape(name)}\(.*$"
                            for m in re.finditer(pattern, row.get("prompt", ""), re.M):
                                signatures.add(_norm_ws(m.group(0)))
        names = {s[4:].split("(", 1)[0].strip() for s in signatures}
        return cls(frozenset(signatures), frozenset(n for n in names if is_distinctive(n)))

    def __bool__(self) -> bool:
        return bool(self.signatures or self.names)

    def hit(self, text: str) -> str | None:
        for m in _DEF_LINE.finditer(text):
            if m.group(1) in self.names:
                return m.group(1)
            if self.signatures and _norm_ws(m.group(0)) in self.signatures:
                return m.group(1)
        return None


_DEF_LINE = re.compile(r"^[ \t]*def[ \t]+(\w+)[ \t]*\(.*$", re.M)

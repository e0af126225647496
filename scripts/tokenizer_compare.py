"""Chars per token of two tokenizers on held-out files, per language (how much text a context holds).

    python scripts/tokenizer_compare.py OLD.json NEW.json DIR [DIR ...]

Languages by file extension; every file under the folders counts once.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from dfim.engine.model.tokenizer import Tokenizer

LANGUAGES = {
    ".py": "python",
    ".ts": "typescript",
    ".tsx": "typescript",
    ".js": "javascript",
    ".mjs": "javascript",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "c/c++ header",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "c/c++ header",
}


def main(argv: list[str]) -> int:
    old, new = Tokenizer.from_file(argv[0]), Tokenizer.from_file(argv[1])
    texts: dict[str, list[str]] = defaultdict(list)
    for folder in argv[2:]:
        for path in sorted(Path(folder).rglob("*")):
            lang = LANGUAGES.get(path.suffix)
            if lang and path.is_file():
                texts[lang].append(path.read_text(encoding="utf-8", errors="replace"))
    print("| language | files | chars | old chars/token | new chars/token | old tokens / new tokens |")
    print("|---|---|---|---|---|---|")
    for lang, group in sorted(texts.items()):
        chars = sum(len(t) for t in group)
        n_old = sum(len(ids) for ids in old.encode_batch(group))
        n_new = sum(len(ids) for ids in new.encode_batch(group))
        print(
            f"| {lang} | {len(group)} | {chars:,} | {chars / n_old:.2f} | {chars / n_new:.2f} | {n_old / n_new:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

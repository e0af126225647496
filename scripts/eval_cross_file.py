"""Exact match of lines that call a name imported from another module of the project, through the real
server, with and without the extra context of other files (`context.extra`, server/extra_context.py).

For each Python package folder given, every line outside an import that calls a name the file imports from
another module of the same package (`helper(...)` after `from .util import helper`, `u.helper(...)` after
`from . import util as u`) is a candidate. The document is the file with that line cut at the call (the
cursor just before the name, the rest of the line gone); the server (workspace root: the package folder, so
it reads the package's other files from disk) completes it, and the completed line must equal the original
one (trailing whitespace aside). Candidates are found with Python's `ast`, independently of the server's
tree-sitter reading, and drawn with a fixed seed, `--per-project` from each package. One server, one model
load: every problem is asked with the extra context off, then on (the settings change clears the cache).

    python scripts/eval_cross_file.py .venv/lib/python3.11/site-packages/{pygls,cattrs} --per-project 50

The files of earlier problems stay in the server's chunk ring (closed documents keep their chunks), so
`on` also places chunks of other files of the package; a problem's own file is never among them. Results
of dfim-base: docs/decisions.md, decisions 75 and 90 (those were measured with the gate of their time on; the
script now turns the gate off unless --settings says otherwise).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import random
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfim.bench.lsp_client import Client, get_field, utf16_offset  # noqa: E402


@dataclass
class Problem:
    project: str
    path: str  # absolute
    line: int  # 0-based
    column: int  # character offset of the cursor in the line (the called name's start)
    name: str  # the called name as the line writes it (`helper`, `u.helper`)
    expected: str  # the whole original line


def _module_file(package: Path, pkg_name: str, current: Path, module: str | None, level: int) -> Path | None:
    """The package file an import names (None outside the package): relative imports from the current
    file's folder, absolute ones starting with the package's own name."""
    parts = (module or "").split(".") if module else []
    if level:
        base = current.parent
        for _ in range(level - 1):
            base = base.parent
    elif parts and parts[0] == pkg_name:
        base, parts = package, parts[1:]
    else:
        return None
    target = base.joinpath(*parts)
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if parts and candidate.is_file():
            return candidate
    return target / "__init__.py" if not parts and (target / "__init__.py").is_file() else None


def problems_of(package: Path) -> list[Problem]:
    pkg_name = package.name
    out: list[Problem] = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        names: set[str] = set()  # names called directly
        aliases: set[str] = set()  # modules called through
        import_lines: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                import_lines.update(range(node.lineno - 1, (node.end_lineno or node.lineno)))
            if isinstance(node, ast.ImportFrom):
                module_file = _module_file(package, pkg_name, path, node.module, node.level)
                if module_file is None or module_file.resolve() == path.resolve():
                    continue
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    local = alias.asname or alias.name
                    sub = module_file.parent / f"{alias.name}.py"
                    if module_file.name == "__init__.py" and sub.is_file():
                        aliases.add(local)  # a module of the package: called as `local.attr(...)`
                    else:
                        names.add(local)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and _module_file(package, pkg_name, path, alias.name, 0) is not None:
                        aliases.add(alias.asname)
        lines = text.split("\n")
        seen: set[int] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id in names:
                called = func.id
            elif (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id in aliases
            ):
                called = f"{func.value.id}.{func.attr}"
            else:
                continue
            row = func.lineno - 1
            if row in import_lines or row in seen or node.end_lineno != func.lineno:
                continue  # one problem per line, on one line
            line = lines[row]
            column = len(line.encode("utf-8")[: func.col_offset].decode("utf-8", "replace"))
            if not line[column:].startswith(called):
                continue
            seen.add(row)
            out.append(Problem(package.name, str(path), row, column, called, line))
    return out


def completed_line(doc: str, offset: int, item) -> str | None:
    """The cursor's line after applying the first inline item (None: no item)."""
    if item is None:
        return None
    rng = get_field(item, "range")
    insert = get_field(item, "insert_text")
    insert = insert if isinstance(insert, str) else get_field(insert, "value")
    start = utf16_offset(doc, rng.start.line, rng.start.character)
    end = utf16_offset(doc, rng.end.line, rng.end.character)
    new = doc[:start] + insert + doc[end:]
    line_start = doc.rfind("\n", 0, offset) + 1
    line_end = new.find("\n", line_start)
    return new[line_start : len(new) if line_end < 0 else line_end]


async def extra_block(client: Client) -> str:
    """The extra-context block the last fill read: its prefix up to the current file's `# file:` line."""
    trace = await client.lsp.protocol.send_request_async("dfim/lastTrace", {})
    prefix = get_field(trace, "prefix") or ""
    if not prefix.startswith("# file: "):
        return ""
    lines = prefix.split("\n")
    last = max(i for i, line in enumerate(lines) if line.startswith("# file: "))
    return "\n".join(lines[: last + 1])


async def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    problems: list[Problem] = []
    counts = {}
    for folder in args.projects:
        found = problems_of(Path(folder).resolve())
        counts[Path(folder).name] = len(found)
        rng.shuffle(found)
        per_file: dict[str, int] = {}
        taken = []
        for p in found:  # a few per file: one file's many like lines (a table of styles) would dominate
            if len(taken) < args.per_project and per_file.get(p.path, 0) < args.per_file:
                per_file[p.path] = per_file.get(p.path, 0) + 1
                taken.append(p)
        problems += taken
    # The confidence gate off: this measures the model with and without the block, not what a gate hides
    # (decision 91); --settings can turn it back on.
    base = {
        "telemetry": {"enabled": False},
        "inline": {"gate": {"enabled": False}},
        **json.loads(args.settings),
    }
    results = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as data_dir:
        by_project: dict[str, list[Problem]] = {}
        for p in problems:
            by_project.setdefault(p.project, []).append(p)
        for project, group in by_project.items():
            folder = Path(group[0].path)
            while folder.name != project:
                folder = folder.parent
            client = Client()
            try:
                status = await client.start(args.model, args.device, base, data_dir, root_uri=folder.as_uri())
                if get_field(status, "state") != "ready":
                    raise SystemExit(f"the server is not ready: {status}")
                for mode in ("off", "on"):
                    context = base.get("context", {})
                    extra = {**context.get("extra", {}), "enabled": mode == "on"}
                    client.configure({**base, "context": {**context, "extra": extra}})
                    await asyncio.sleep(0.2)
                    for p in group:
                        text = Path(p.path).read_text(encoding="utf-8", errors="replace")
                        lines = text.split("\n")
                        lines[p.line] = lines[p.line][: p.column]
                        doc = "\n".join(lines)
                        offset = sum(len(x) + 1 for x in lines[: p.line]) + p.column
                        uri = Path(p.path).as_uri()
                        client.open(uri, doc, "python")
                        answer = await client.inline(uri, doc, offset)
                        items = get_field(answer, "items") if answer is not None else None
                        got = completed_line(doc, offset, items[0] if items else None)
                        extra = await extra_block(client) if mode == "on" and answer is not None else ""
                        client.close(uri)
                        exact = got is not None and got.rstrip() == p.expected.rstrip()
                        results[mode].append({**asdict(p), "got": got, "exact": exact, "extra": extra})
            finally:
                await client.stop()
    summary = {"candidates": counts, "problems": len(problems)}
    for mode, rows in results.items():
        summary[mode] = {
            "exact": sum(r["exact"] for r in rows),
            "shown": sum(r["got"] is not None for r in rows),
            "em": round(100 * sum(r["exact"] for r in rows) / max(1, len(rows)), 1),
            "with_extra": sum(bool(r["extra"]) for r in rows),
            "extra_names_the_callee": sum(
                bool(r["extra"]) and r["name"].split(".")[-1] in r["extra"] for r in rows
            ),
        }
        for project in counts:
            sub = [r for r in rows if r["project"] == project]
            summary[mode][project] = f"{sum(r['exact'] for r in sub)}/{len(sub)}"
    both = list(zip(results["off"], results["on"], strict=True))
    summary["gained"] = sum(1 for a, b in both if b["exact"] and not a["exact"])
    summary["lost"] = sum(1 for a, b in both if a["exact"] and not b["exact"])
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("projects", nargs="+", help="Python package folders (held out from training)")
    parser.add_argument("--per-project", type=int, default=50)
    parser.add_argument("--per-file", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--settings", default="{}", help="more server settings, JSON")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()

"""The names a file imports from its own project, read with tree-sitter, and the files that define them.

`file_imports` lists a file's imports (Python `import x` / `from x import y`, TypeScript/JavaScript
`import {a} from './b'`, Go `import "mod/pkg"`, Rust `use crate::a::B`, Java `import com.x.Y`);
`resolve` maps one to the files of the project that define it. Only project files count: relative imports,
and absolute ones that land in a workspace folder or beside the importing file's package. A library outside
the workspace is the model's to know, and reading it would cost time on every new import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dfim.server.languages import Source

TS_EXTENSIONS = (".ts", ".tsx", ".d.ts", ".js", ".jsx", ".mjs", ".cjs")


@dataclass(frozen=True)
class Import:
    module: str  # as written: "pkg.mod", "./b", "example.com/m/util", "crate::a::b", "com.x.util"
    # (name in the module, name in the importing file) of each name taken; () = the module itself, used
    # through `alias` (`import x`, `import * as ns`, a Go package)
    names: tuple[tuple[str, str], ...] = ()
    alias: str = ""
    level: int = 0  # Python: the leading dots of a relative import


def _text(source: Source, node) -> str:
    start, end = source.span(node)
    return source.text[start:end]


# Python statements that hold statements: imports under `if TYPE_CHECKING:`, in a `try:` or in a function
# (a lazy import) are the file's imports too.
_PY_HOLDERS = {
    "block", "if_statement", "else_clause", "elif_clause", "try_statement", "except_clause",
    "finally_clause", "with_statement", "function_definition", "class_definition", "decorated_definition",
}  # fmt: skip


def _python_statements(node):
    """The statements under `node`, at any depth of statement nesting (never inside an expression)."""
    for child in node.children:
        yield child
        if child.type in _PY_HOLDERS:
            yield from _python_statements(child)


def file_imports(source: Source) -> list[Import]:
    """The imports of `source`, in file order: at its top level (Python: in nested statements too)."""
    tree = source.tree
    if tree is None:
        return []
    read = {
        "python": _python_imports,
        "javascript": _ts_imports,
        "typescript": _ts_imports,
        "tsx": _ts_imports,
        "go": _go_imports,
        "rust": _rust_imports,
        "java": _java_imports,
    }.get(source.lang or "")
    if read is None:
        return []
    nodes = _python_statements(tree.root_node) if source.lang == "python" else tree.root_node.children
    out: list[Import] = []
    for node in nodes:
        out.extend(read(source, node))
    return out


def _python_imports(source: Source, node) -> list[Import]:
    if node.type == "import_statement":
        out = []
        for child in node.children_by_field_name("name"):
            if child.type == "aliased_import":
                module = _text(source, child.child_by_field_name("name"))
                out.append(Import(module, alias=_text(source, child.child_by_field_name("alias"))))
            else:
                module = _text(source, child)
                out.append(Import(module, alias=module))
        return out
    if node.type != "import_from_statement":
        return []
    module_node = node.child_by_field_name("module_name")
    if module_node is None:
        return []
    module, level = _text(source, module_node), 0
    if module_node.type == "relative_import":
        level = len(module) - len(module.lstrip("."))
        module = module[level:]
    names = []
    for child in node.children_by_field_name("name"):
        if child.type == "aliased_import":
            name = _text(source, child.child_by_field_name("name"))
            names.append((name, _text(source, child.child_by_field_name("alias"))))
        else:
            name = _text(source, child)
            names.append((name, name))
    if not names:  # `from x import *`: the module's public names, whichever the file uses
        return [Import(module, level=level, alias="*")]
    return [Import(module, tuple(names), level=level)]


def _string_content(source: Source, node) -> str:
    return _text(source, node).strip("\"'`")


def _ts_imports(source: Source, node) -> list[Import]:
    if node.type != "import_statement":
        return []
    where = node.child_by_field_name("source")
    if where is None:
        return []
    module = _string_content(source, where)
    names: list[tuple[str, str]] = []
    alias = ""
    for clause in node.children:
        if clause.type != "import_clause":
            continue
        for part in clause.children:
            if part.type == "identifier":  # the default export
                names.append(("default", _text(source, part)))
            elif part.type == "namespace_import":
                ids = [c for c in part.children if c.type == "identifier"]
                alias = _text(source, ids[-1]) if ids else ""
            elif part.type == "named_imports":
                for spec in part.children:
                    if spec.type != "import_specifier":
                        continue
                    name = _text(source, spec.child_by_field_name("name"))
                    local = spec.child_by_field_name("alias")
                    names.append((name, _text(source, local) if local is not None else name))
    if not names and not alias:
        return []  # `import './side-effect'`
    out = [Import(module, tuple(names))] if names else []
    return out + ([Import(module, alias=alias)] if alias else [])


def _go_imports(source: Source, node) -> list[Import]:
    if node.type != "import_declaration":
        return []
    specs = [c for c in node.children if c.type == "import_spec"]
    for group in (c for c in node.children if c.type == "import_spec_list"):
        specs += [c for c in group.children if c.type == "import_spec"]
    out = []
    for spec in specs:
        path = _string_content(source, spec.child_by_field_name("path"))
        name = spec.child_by_field_name("name")
        alias = _text(source, name) if name is not None else path.rsplit("/", 1)[-1]
        if alias not in ("_", "."):
            out.append(Import(path, alias=alias))
    return out


def _rust_imports(source: Source, node) -> list[Import]:
    if node.type != "use_declaration":
        return []
    arg = node.child_by_field_name("argument")
    if arg is None:
        return []
    if arg.type == "scoped_use_list":
        path = arg.child_by_field_name("path")
        listed = arg.child_by_field_name("list")
        if path is None or listed is None:
            return []
        names = []
        for item in listed.children:
            if item.type == "identifier":
                names.append((_text(source, item), _text(source, item)))
            elif item.type == "use_as_clause":
                name = _text(source, item.child_by_field_name("path")).rsplit("::", 1)[-1]
                names.append((name, _text(source, item.child_by_field_name("alias"))))
        return [Import(_text(source, path), tuple(names))] if names else []
    if arg.type == "use_as_clause":
        full = _text(source, arg.child_by_field_name("path"))
        local = _text(source, arg.child_by_field_name("alias"))
    elif arg.type == "scoped_identifier":
        full = _text(source, arg)
        local = full.rsplit("::", 1)[-1]
    else:
        return []
    if "::" not in full:
        return []
    module, name = full.rsplit("::", 1)
    return [Import(module, ((name, local),))]


def _java_imports(source: Source, node) -> list[Import]:
    if node.type != "import_declaration" or any(c.type in ("static", "asterisk") for c in node.children):
        return []
    target = next((c for c in node.children if c.type == "scoped_identifier"), None)
    if target is None:
        return []
    module, name = _text(source, target).rsplit(".", 1)
    return [Import(module, ((name, name),))]


# ---- resolution -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A file that defines what an import takes, and the names to show from it (() = what the importing
    file uses through the import's alias, `uses`)."""

    path: Path
    names: tuple[str, ...]
    alias: str = ""


def _python_package_base(path: Path) -> Path:
    """The folder that holds the top package of `path` (walking up while `__init__.py` is there): where
    its absolute imports start."""
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        folder = folder.parent
    return folder


def _first_file(candidates: list[Path], exists) -> Path | None:
    return next((c for c in candidates if exists(c)), None)


def resolve(
    imp: Import, path: Path, lang: str | None, roots: list[Path], exists, text: str = ""
) -> list[Target]:
    """The project files that define what `imp` (in the file at `path`, whose text is `text`) takes;
    `exists(path)` says whether a file is there and may be read (an open document, or a file under a
    workspace folder)."""
    if lang == "python":
        return _resolve_python(imp, path, roots, exists)
    if lang in ("javascript", "typescript", "tsx"):
        return _resolve_ts(imp, path, exists)
    if lang == "go":
        return _resolve_go(imp, roots, exists)
    if lang == "rust":
        return _resolve_rust(imp, path, exists)
    if lang == "java":
        return _resolve_java(imp, path, roots, exists, text)
    return []


def _resolve_python(imp: Import, path: Path, roots: list[Path], exists) -> list[Target]:
    parts = [p for p in imp.module.split(".") if p]
    if imp.level:
        base = path.parent
        for _ in range(imp.level - 1):
            base = base.parent
        bases = [base]
    else:
        bases = [_python_package_base(path), path.parent]
        bases += [b for root in roots for b in (root, root / "src")]
    for base in dict.fromkeys(bases):
        folder = base.joinpath(*parts)
        module = _first_file([folder.with_suffix(".py"), folder / "__init__.py"] if parts else [], exists)
        if module is None and parts:
            continue
        if not imp.names:
            return [Target(module, (), imp.alias)] if module is not None else []
        out: list[Target] = []
        taken: list[str] = []
        for name, local in imp.names:
            sub = _first_file([folder / f"{name}.py", folder / name / "__init__.py"], exists)
            if sub is not None:  # `from pkg import module`: used as `module.name`
                out.append(Target(sub, (), local))
            else:
                taken.append(name)
        if taken and module is None:
            module = _first_file([folder / "__init__.py"], exists)
        if taken and module is not None:
            out.insert(0, Target(module, tuple(taken)))
        if out:
            return out
    return []


def _resolve_ts(imp: Import, path: Path, exists) -> list[Target]:
    if not imp.module.startswith(("./", "../")):
        return []  # a package: outside the project
    base = (path.parent / imp.module).resolve()
    stem = base.with_suffix("") if base.suffix in (".js", ".jsx", ".mjs", ".cjs") else base
    candidates = [base] if base.suffix else []
    candidates += [Path(str(stem) + ext) for ext in TS_EXTENSIONS]
    candidates += [base / f"index{ext}" for ext in TS_EXTENSIONS]
    found = _first_file(candidates, exists)
    if found is None:
        return []
    return [Target(found, tuple(name for name, _ in imp.names), imp.alias)]


def _go_module(root: Path, exists) -> str | None:
    mod = root / "go.mod"
    if not exists(mod):
        return None
    match = re.search(r"^module\s+(\S+)", mod.read_text(encoding="utf-8", errors="replace"), re.M)
    return match.group(1) if match else None


def _resolve_go(imp: Import, roots: list[Path], exists) -> list[Target]:
    for root in roots:
        module = _go_module(root, exists)
        if module is None or not imp.module.startswith(module + "/"):
            continue
        folder = root / imp.module[len(module) + 1 :]
        if not folder.is_dir():
            return []
        files = sorted(p for p in folder.glob("*.go") if not p.name.endswith("_test.go") and exists(p))
        return [Target(f, (), imp.alias) for f in files[:8]]
    return []


def _resolve_rust(imp: Import, path: Path, exists) -> list[Target]:
    parts = imp.module.split("::")
    if parts[0] == "crate":
        src = path.parent
        while not exists(src / "lib.rs") and not exists(src / "main.rs") and src.parent != src:
            src = src.parent
        folder, parts = src, parts[1:]
    elif parts[0] in ("super", "self"):
        folder = path.parent if path.name in ("mod.rs", "lib.rs", "main.rs") else path.parent / path.stem
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                folder = folder.parent
            parts = parts[1:]
    else:
        return []
    target = folder.joinpath(*parts)
    found = _first_file([target.with_suffix(".rs"), target / "mod.rs"] if parts else [], exists)
    if found is None:
        return []
    return [Target(found, tuple(name for name, _ in imp.names))]


def _resolve_java(imp: Import, path: Path, roots: list[Path], exists, text: str) -> list[Target]:
    parts = imp.module.split(".")
    bases = [root / sub for root in roots for sub in ("", "src/main/java", "src")]
    # the importing file's own source folder: its folder less its package's depth
    package = re.search(r"^\s*package\s+([\w.]+)\s*;", text, re.M)
    if package:
        base = path.parent
        for _ in package.group(1).split("."):
            base = base.parent
        bases.insert(0, base)
    for name, _ in imp.names:
        found = _first_file([b.joinpath(*parts, f"{name}.java") for b in dict.fromkeys(bases)], exists)
        if found is not None:
            return [Target(found, (name,))]
    return []

"""Unit tests of server/imports.py and server/signatures.py: what a file imports from its project, which
files define it, and the short definitions the model is shown."""

from __future__ import annotations

from pathlib import Path

from dfim.server.imports import Import, Target, file_imports, resolve
from dfim.server.languages import Source
from dfim.server.signatures import outline


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def on_disk(path: Path) -> bool:
    return path.is_file()


# ---- Python -----------------------------------------------------------------------------------------


PY_IMPORTS = """import os, pkg.util as u
from .util import slugify, Table as T
from . import models
from pkg.deep.mod import (f, g)
from anything import *

def local():
    from inside import hidden
"""


def test_python_imports_are_read_with_their_local_names():
    got = file_imports(Source(PY_IMPORTS, "python"))
    assert got == [
        Import("os", alias="os"),
        Import("pkg.util", alias="u"),
        Import("util", (("slugify", "slugify"), ("Table", "T")), level=1),
        Import("", (("models", "models"),), level=1),
        Import("pkg.deep.mod", (("f", "f"), ("g", "g"))),
        Import("anything", alias="*"),
        Import("inside", (("hidden", "hidden"),)),  # a lazy import in a function is the file's too
    ]


def test_python_imports_resolve_to_project_files(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/util.py": "def slugify(s): ...\nclass Table: ...\n",
            "pkg/models.py": "class User: ...\n",
            "pkg/deep/__init__.py": "",
            "pkg/deep/mod.py": "def f(): ...\n",
            "pkg/main.py": PY_IMPORTS,
        },
    )
    here = tmp_path / "pkg" / "main.py"
    imports = file_imports(Source(PY_IMPORTS, "python"))
    found = {imp.module: resolve(imp, here, "python", [tmp_path], on_disk) for imp in imports}
    assert found["os"] == []  # not in the project
    assert found["pkg.util"] == [Target(tmp_path / "pkg/util.py", (), "u")]
    assert found["util"] == [Target(tmp_path / "pkg/util.py", ("slugify", "Table"))]
    # `from . import models`: a module, used through its name
    assert found[""] == [Target(tmp_path / "pkg/models.py", (), "models")]
    assert found["pkg.deep.mod"] == [Target(tmp_path / "pkg/deep/mod.py", ("f", "g"))]
    # a file outside what may be read does not count
    assert resolve(imports[2], here, "python", [tmp_path], lambda p: False) == []


PY_MODULE = '''"""Helpers."""
import re

LIMIT = 10

def slugify(text: str,
            sep: str = "-") -> str:
    """Turn text into a slug.

    Long description."""
    return re.sub(r"\\W+", sep, text)

@dataclass
class Table(Base):
    """Rows and columns."""
    name: str = "t"
    _cache = None
    def __init__(self, rows: list[dict]):
        self.rows = rows
    def column(self, key: str) -> list:
        """Not shown: a method's docstring costs more than it says."""
        return [r[key] for r in self.rows]
    def _hidden(self):
        pass
'''


def test_python_outline_keeps_signatures_and_first_doc_lines_and_drops_bodies():
    got = outline(Source(PY_MODULE, "python"))
    assert list(got) == ["LIMIT", "slugify", "Table"]
    assert got["LIMIT"] == "LIMIT = 10"
    assert (
        got["slugify"] == 'def slugify(text: str, sep: str = "-") -> str:\n    """Turn text into a slug."""'
    )
    assert got["Table"] == (
        "@dataclass\n"
        "class Table(Base):\n"
        '    """Rows and columns."""\n'
        '    name: str = "t"\n'
        "    def __init__(self, rows: list[dict]):\n"
        "    def column(self, key: str) -> list:"
    )
    assert "re.sub" not in "".join(got.values()) and "_hidden" not in got["Table"]


# ---- TypeScript -------------------------------------------------------------------------------------


TS_IMPORTS = """import { parse, format as fmt } from './util';
import Store from "../store";
import * as api from './api/index.js';
import React from 'react';
import './side-effect';
"""


def test_typescript_imports_are_read_and_resolved_to_project_files(tmp_path):
    write(
        tmp_path,
        {
            "src/util.ts": "export function parse(s: string): number { return 1 }\n",
            "store.tsx": "export default class Store {}\n",
            "src/api/index.ts": "export const get = (url: string) => fetch(url);\n",
        },
    )
    here = tmp_path / "src" / "app.ts"
    imports = file_imports(Source(TS_IMPORTS, "typescript"))
    assert imports == [
        Import("./util", (("parse", "parse"), ("format", "fmt"))),
        Import("../store", (("default", "Store"),)),
        Import("./api/index.js", alias="api"),
        Import("react", (("default", "React"),)),
    ]  # a side-effect import takes no name
    found = [resolve(imp, here, "typescript", [tmp_path], on_disk) for imp in imports]
    assert found[0] == [Target(tmp_path / "src/util.ts", ("parse", "format"))]
    assert found[1] == [Target(tmp_path / "store.tsx", ("default",))]
    assert found[2] == [
        Target(tmp_path / "src/api/index.ts", (), "api")
    ]  # `.js` in an import names the `.ts`
    assert found[3] == []  # a package


TS_MODULE = """import { x } from './x';

/** Parse a number.
 * More. */
export function parse(s: string, radix = 10): number {
  return parseInt(s, radix);
}

export default class Store<T> extends Base implements Iface {
  items: T[] = [];
  static EMPTY = (() => {
    return new Store<never>("");
  })();
  private secret = 1;
  constructor(name: string) { super(); }
  add(item: T): void { this.items.push(item); }
}

export const format = (n: number, digits?: number): string => n.toFixed(digits);
export interface Point { x: number; y: number }
export type Id = string | number;
"""


def test_typescript_outline_keeps_signatures_members_and_short_types():
    got = outline(Source(TS_MODULE, "typescript"))
    assert got["parse"] == "/** Parse a number. */\nexport function parse(s: string, radix = 10): number"
    assert (
        got["Store"]
        == got["default"]
        == (
            "export default class Store<T> extends Base implements Iface {\n"
            "  items: T[] = [];\n"
            "  static EMPTY = ...;\n"  # a long initializer: the name only
            "  constructor(name: string);\n"
            "  add(item: T): void;\n"
            "}"
        )
    )
    assert got["format"] == "export const format = (n: number, digits?: number): string =>"
    assert got["Point"] == "export interface Point { x: number; y: number }"
    assert got["Id"] == "export type Id = string | number;"
    assert "parseInt" not in "".join(got.values()) and "secret" not in got["Store"]


# ---- Go, Rust, Java: the simple forms ------------------------------------------------------------------


def test_go_rust_and_java_imports_resolve_in_simple_projects(tmp_path):
    write(
        tmp_path,
        {
            "go.mod": "module example.com/m\n\ngo 1.21\n",
            "util/util.go": "package util\n\nfunc Slug(s string) string { return s }\n",
            "util/util_test.go": "package util\n",
            "src/lib.rs": "mod a;\n",
            "src/a/b.rs": "pub fn run(x: i32) -> i32 { x }\n",
            "src/main/java/com/x/util/Helper.java": "package com.x.util;\npublic class Helper { public static int f(int a) { return a; } }\n",
        },
    )
    go = 'package main\nimport (\n  "fmt"\n  u "example.com/m/util"\n)\n'
    (go_imp,) = [i for i in file_imports(Source(go, "go")) if i.alias == "u"]
    assert resolve(go_imp, tmp_path / "main.go", "go", [tmp_path], on_disk) == [
        Target(tmp_path / "util/util.go", (), "u")
    ]
    rust = "use crate::a::b::{run, Other};\n"
    (rust_imp,) = file_imports(Source(rust, "rust"))
    assert resolve(rust_imp, tmp_path / "src/main.rs", "rust", [tmp_path], on_disk) == [
        Target(tmp_path / "src/a/b.rs", ("run", "Other"))
    ]
    java = "package com.x.app;\nimport com.x.util.Helper;\nclass A {}\n"
    (java_imp,) = file_imports(Source(java, "java"))
    here = tmp_path / "src/main/java/com/x/app/A.java"
    assert resolve(java_imp, here, "java", [tmp_path], on_disk, java) == [
        Target(tmp_path / "src/main/java/com/x/util/Helper.java", ("Helper",))
    ]
    assert outline(Source((tmp_path / "util/util.go").read_text(), "go")) == {
        "Slug": "func Slug(s string) string"
    }

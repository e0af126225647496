"""Short definitions of a file's top-level names, for the model's extra context: what a caller needs.

`outline` maps each top-level name of a file to a few lines: a function's signature (and its docstring's
first line), a class's header with its public methods' signatures and its fields, a type or an interface
in full when short. Bodies are left out: the model's budget for another file's code is a few hundred tokens,
and a call site needs the names, parameters and types, not how they are computed.
"""

from __future__ import annotations

import re

from dfim.server.languages import Source

MAX_MEMBERS = 6  # methods and fields shown of one class
MAX_LINES = 10  # a type, interface or enum shown in full up to this many lines
MAX_LINE = 120  # characters of one shown line


def _text(source: Source, node) -> str:
    start, end = source.span(node)
    return source.text[start:end]


def _one_line(text: str) -> str:
    """A header on one line: runs of whitespace (line breaks in long parameter lists) become one space."""
    text = " ".join(text.split())
    text = re.sub(r"([(\[{<]) ", r"\1", text)
    text = re.sub(r",? ([)\]}>])", r"\1", text)
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."


def _head(source: Source, node, body_field: str = "body") -> str:
    """The node's text up to its body (`def f(a):`, `function f(a): T`), on one line."""
    body = node.child_by_field_name(body_field)
    start = source.span(node)[0]
    end = source.span(body)[0] if body is not None else source.span(node)[1]
    return _one_line(source.text[start:end])


def _short(text: str) -> str:
    """A definition shown in full when short; else its first lines and an ellipsis."""
    lines = [line[:MAX_LINE] for line in text.splitlines()]
    if len(lines) > MAX_LINES:
        lines = lines[: MAX_LINES - 1] + ["..."]
    return "\n".join(lines)


def outline(source: Source) -> dict[str, str]:
    """Top-level name -> its short definition, in file order (empty for languages without a reader)."""
    tree = source.tree
    read = {
        "python": _python,
        "javascript": _ts,
        "typescript": _ts,
        "tsx": _ts,
        "go": _go,
        "rust": _rust,
        "java": _java,
    }.get(source.lang or "")
    if tree is None or read is None:
        return {}
    out: dict[str, str] = {}
    previous = None
    for node in tree.root_node.children:
        for name, text in read(source, node, previous):
            if name in out and source.lang == "rust":  # an `impl` after its type: one entry
                out[name] += "\n" + text
            elif name not in out:
                out[name] = text
        previous = node
    return out


# ---- Python ---------------------------------------------------------------------------------------------


def _docline(source: Source, body) -> str:
    """The first line of a Python body's docstring, as a one-line docstring ("" when there is none)."""
    if body is None or not body.named_children:
        return ""
    first = body.named_children[0]
    if first.type != "expression_statement" or not first.named_children:
        return ""
    string = first.named_children[0]
    if string.type != "string":
        return ""
    content = _text(source, string).lstrip("rRbBuUfF").strip("\"'")
    line = next((s.strip() for s in content.splitlines() if s.strip()), "")
    return f'"""{line[:MAX_LINE]}"""' if line else ""


def _python_function(source: Source, node, indent: str = "") -> str:
    lines = [indent + _head(source, node)]
    doc = _docline(source, node.child_by_field_name("body"))
    return "\n".join(lines + ([indent + "    " + doc] if doc else []))


def _python_definition(source: Source, node) -> tuple[str, str, object] | None:
    """(name, decorators, definition node) of a def or class, decorated or not."""
    decorators = ""
    if node.type == "decorated_definition":
        decorators = "".join(
            _one_line(_text(source, d)) + "\n" for d in node.children if d.type == "decorator"
        )
        node = node.child_by_field_name("definition")
    if node is None or node.type not in ("function_definition", "class_definition"):
        return None
    return _text(source, node.child_by_field_name("name")), decorators, node


def _python_class(source: Source, node) -> str:
    body = node.child_by_field_name("body")
    lines = [_head(source, node)]
    doc = _docline(source, body)
    if doc:
        lines.append("    " + doc)
    members = 0
    for child in body.named_children if body is not None else []:
        if members >= MAX_MEMBERS:
            lines.append("    ...")
            break
        found = _python_definition(source, child)
        if found is not None:
            name, decorators, definition = found
            if name.startswith("_") and name not in ("__init__", "__call__"):
                continue
            head = _head(source, definition)
            lines += [
                "    " + d for d in decorators.splitlines() if d.strip() in ("@property", "@staticmethod")
            ]
            lines.append("    " + head)
            members += 1
        elif child.type == "expression_statement" and child.named_children:
            assignment = child.named_children[0]
            left = assignment.child_by_field_name("left") if assignment.type == "assignment" else None
            if left is not None and left.type == "identifier" and not _text(source, left).startswith("_"):
                lines.append("    " + _one_line(_text(source, assignment).split("\n")[0]))
                members += 1
    return "\n".join(lines)


def _python(source: Source, node, previous) -> list[tuple[str, str]]:
    found = _python_definition(source, node)
    if found is not None:
        name, decorators, definition = found
        if definition.type == "class_definition":
            return [(name, decorators + _python_class(source, definition))]
        return [(name, decorators + _python_function(source, definition))]
    if node.type == "expression_statement" and node.named_children:
        assignment = node.named_children[0]
        left = assignment.child_by_field_name("left") if assignment.type == "assignment" else None
        if left is not None and left.type == "identifier":
            return [(_text(source, left), _one_line(_text(source, assignment).split("\n")[0]))]
    return []


# ---- TypeScript / JavaScript ----------------------------------------------------------------------------

_TS_SHORT = ("interface_declaration", "type_alias_declaration", "enum_declaration")


def _jsdoc(source: Source, previous) -> str:
    """The first line of a `/** ... */` comment right before a declaration, as a one-line comment."""
    if previous is None or previous.type != "comment":
        return ""
    text = _text(source, previous)
    if not text.startswith("/**"):
        return ""
    body = text[3:-2] if text.endswith("*/") else text[3:]
    line = next((s.strip(" *") for s in body.splitlines() if s.strip(" *")), "")
    return f"/** {line[:MAX_LINE]} */\n" if line else ""


def _ts_class(source: Source, node) -> str:
    lines = [_head(source, node) + " {"]
    body = node.child_by_field_name("body")
    members = 0
    for member in body.named_children if body is not None else []:
        if members >= MAX_MEMBERS:
            lines.append("  ...")
            break
        text = _text(source, member)
        if text.startswith(("private", "#")) or member.type == "comment":
            continue
        if member.type in ("method_definition", "abstract_method_signature", "method_signature"):
            lines.append("  " + _head(source, member) + ";")
        elif member.type in ("public_field_definition", "field_definition"):
            # a field set to something long (a function, an object) shows its name and type only
            shown = text if "\n" not in text else text.split("=", 1)[0].rstrip() + " = ..."
            lines.append("  " + _one_line(shown).rstrip(";") + ";")
        else:
            continue
        members += 1
    return "\n".join(lines + ["}"])


def _ts_declaration(source: Source, node) -> list[tuple[str, str]]:
    kind = node.type
    name_node = node.child_by_field_name("name")
    name = _text(source, name_node) if name_node is not None else ""
    if kind in ("function_declaration", "generator_function_declaration", "function_signature"):
        return [(name, _head(source, node))]
    if kind in ("class_declaration", "abstract_class_declaration", "class"):
        return [(name, _ts_class(source, node))]
    if kind in _TS_SHORT:
        return [(name, _short(_text(source, node)))]
    if kind in ("lexical_declaration", "variable_declaration"):
        keyword = _text(source, node).split(None, 1)[0]
        out = []
        for declarator in (c for c in node.named_children if c.type == "variable_declarator"):
            var = _text(source, declarator.child_by_field_name("name"))
            value = declarator.child_by_field_name("value")
            if value is not None and value.type in ("arrow_function", "function_expression", "function"):
                head = _one_line(
                    source.text[
                        source.span(declarator)[0] : source.span(value.child_by_field_name("body"))[0]
                    ]
                )
                out.append((var, f"{keyword} {head}"))
            else:
                out.append((var, _one_line(f"{keyword} " + _text(source, declarator).split("\n")[0])))
        return out
    return []


def _ts(source: Source, node, previous) -> list[tuple[str, str]]:
    doc = _jsdoc(source, previous)
    if node.type != "export_statement":
        return [(name, doc + text) for name, text in _ts_declaration(source, node)]
    declaration = node.child_by_field_name("declaration") or next(
        (c for c in node.named_children if c.type != "comment"), None
    )
    if declaration is None:
        return []
    default = any(c.type == "default" for c in node.children)
    found = [
        (name, doc + "export " + ("default " if default else "") + text)
        for name, text in _ts_declaration(source, declaration)
    ]
    if default and found:
        found.append(("default", found[0][1]))
    return found


# ---- Go, Rust, Java -------------------------------------------------------------------------------------


def _go(source: Source, node, previous) -> list[tuple[str, str]]:
    if node.type == "function_declaration":
        return [(_text(source, node.child_by_field_name("name")), _head(source, node))]
    if node.type == "type_declaration":
        return [
            (_text(source, spec.child_by_field_name("name")), "type " + _short(_text(source, spec)))
            for spec in node.named_children
            if spec.type == "type_spec"
        ]
    return []


def _rust(source: Source, node, previous) -> list[tuple[str, str]]:
    name_node = node.child_by_field_name("name")
    if node.type == "function_item" and name_node is not None:
        return [(_text(source, name_node), _head(source, node))]
    if node.type in ("struct_item", "enum_item", "type_item", "const_item", "trait_item") and name_node:
        return [(_text(source, name_node), _short(_text(source, node)))]
    if node.type == "impl_item":
        kind = node.child_by_field_name("type")
        body = node.child_by_field_name("body")
        if kind is None or body is None:
            return []
        methods = [
            "    " + _head(source, f) + ";"
            for f in body.named_children
            if f.type == "function_item" and _text(source, f).startswith("pub")
        ][:MAX_MEMBERS]
        name = _text(source, kind).split("<", 1)[0]
        return [(name, "\n".join([_head(source, node) + " {", *methods, "}"]))] if methods else []
    return []


def _java(source: Source, node, previous) -> list[tuple[str, str]]:
    if node.type not in (
        "class_declaration",
        "interface_declaration",
        "enum_declaration",
        "record_declaration",
    ):
        return []
    lines = [_head(source, node) + " {"]
    body = node.child_by_field_name("body")
    for member in (body.named_children if body is not None else [])[: MAX_MEMBERS * 2]:
        text = _text(source, member)
        if text.lstrip().startswith("private") or member.type not in (
            "method_declaration",
            "constructor_declaration",
            "field_declaration",
        ):
            continue
        shown = _head(source, member) if member.type != "field_declaration" else _one_line(text)
        lines.append("    " + shown.rstrip(";") + ";")
    return [(_text(source, node.child_by_field_name("name")), "\n".join(lines[: MAX_MEMBERS + 1] + ["}"]))]

"""Changing the text in place: a changed value is spliced into its scalar's span, a new key goes after
the last line of its parent mapping, and values are spelled so that every reader reads them back as
the same value. Every other byte of the file stays as it was."""
from __future__ import annotations

import json
import re
import warnings
from decimal import Decimal

from ruamel.yaml import YAML
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness.apply._document import _Document, _set
from harness.errors import UserError


# ---------------------------------------------------------------------------------------------
# Text edits: (start, end, replacement) splices on the original text


def _child(node: Node, name: str) -> tuple[ScalarNode, Node] | None:
    """The (key node, value node) written under `name` in a mapping node; None if not written there."""
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and key_node.value == name:
                return key_node, value_node
    return None


def written_at(doc: _Document, key: str) -> tuple[ScalarNode, Node]:
    """The (key node, value node) of a key the file holds, or one UserError where its text cannot be edited
    there: a merge (<<) or alias supplies it, or an anchor other places share is on its way."""
    node = doc.root
    for part in key.split("."):
        pair = _child(node, part)
        if pair is None:
            raise UserError(f"{doc.path}: {key} comes from a YAML merge (<<) or alias, not from a line bench can "
                            "edit; write the key out in the file")
        key_node, node = pair
        _refuse_shared(doc, key, node)
    return key_node, node


def _replace_value(doc: _Document, key: str, value: object) -> tuple[int, int, str]:
    key_node, node = written_at(doc, key)
    start, end = _scalar_span(doc.text, key_node, node)
    old_token = doc.text[start:end]
    rendered = _render(value, doc.format, old_token, node.style)
    if start == end:  # `key:` with no value: the null's mark sits after the line break
        return start, end, " " + rendered
    line_breaks = old_token[len(old_token.rstrip("\r\n")):]
    if line_breaks:  # a block scalar (|, >) ends with its line break(s)
        return start, end, rendered + line_breaks
    gap = re.compile(r"[ ]+(?=#)").match(doc.text, end)
    if gap:  # keep an aligned end-of-line comment in its column where the new value leaves room
        end = gap.end()
        rendered += " " * max(1, len(gap.group()) - (len(rendered) - len(old_token)))
    return start, end, rendered


def _refuse_shared(doc: _Document, key: str, node: Node) -> None:
    """An anchored value (&x) is also every *x: changing it here would change those places too (an anchor
    no alias or merge refers to is one place, edited as any)."""
    if node.anchor and _uses(doc.root, node) > 1:
        raise UserError(f"{doc.path}: {key} goes through the YAML anchor &{node.anchor}, so changing it would "
                        "change every *alias too; write the value out at this key")


def _uses(root: Node, node: Node) -> int:
    """How many places of the document hold `node`: an alias (*x, <<: *x) is the anchored node itself."""
    count, seen, stack = 0, set(), [root]
    while stack:
        here = stack.pop()
        count += here is node
        if id(here) in seen:  # an alias: counted, not walked again
            continue
        seen.add(id(here))
        if isinstance(here, MappingNode):
            stack += [part for pair in here.value for part in pair]
        elif isinstance(here, SequenceNode):
            stack += here.value
    return count


_PROPERTY = re.compile(r"\S+\s*")


def _scalar_span(text: str, key_node: ScalarNode, node: ScalarNode) -> tuple[int, int]:
    start, end = node.start_mark.index, node.end_mark.index
    if start == end:
        colon = text.index(":", key_node.end_mark.index)
        return colon + 1, colon + 1
    while start < end and text[start] in "!&":  # keep the node's tag (!!float) and anchor (&lr) in front of the value
        start = _PROPERTY.match(text, start, end).end()
    return (end, end) if start >= end else (start, end)  # `key: &x` holds a null: the value goes after its anchor


def _insert_keys(doc: _Document, new_keys: list[tuple[str, object]]) -> list[tuple[int, int, str]]:
    """Splices adding the missing keys: all keys under one existing mapping go in one place."""
    groups: dict[int, tuple[Node, ScalarNode | None, MappingNode, dict]] = {}
    for key, value in new_keys:
        node, rest, empty_key, parent = _deepest_mapping(doc, key)
        *_, tree = groups.setdefault(id(node), (node, empty_key, parent, {}))
        _set(tree, ".".join(rest), value)
    # deepest mapping first: insertions at one offset (the end of a section that ends the file, or of a
    # mapping that ends its parent) keep this order in the text (harness.apply._plan._apply_edits)
    deepest_first = sorted(groups.values(), key=lambda group: -_column(group[0], group[1]))
    return [_filling(doc, node, key_node, parent, tree) if key_node is not None
            else _flow_insertion(doc, node, tree) if node.flow_style else _block_insertion(doc, node, tree)
            for node, key_node, parent, tree in deepest_first]


def _column(node: Node, empty_key: ScalarNode | None) -> int:
    """How deep a mapping sits: the column of its keys (the root's is 0); an empty section's keys go
    deeper than its own key."""
    if empty_key is not None:
        return empty_key.start_mark.column + 1
    return node.value[0][0].start_mark.column if node.value else 0


def _deepest_mapping(doc: _Document, key: str) -> tuple[Node, list[str], ScalarNode | None, MappingNode]:
    """The deepest mapping on the key's path that exists, the parts of the key below it, and, where the
    path reaches an empty section (`trainer:` or `trainer: null`), that section's key and its parent:
    the new keys fill the section."""
    node, parts = doc.root, key.split(".")
    for i, part in enumerate(parts):
        pair = _child(node, part)
        if pair is None:
            return node, parts[i:], None, node
        child = pair[1]
        _refuse_shared(doc, key, child)
        if isinstance(child, ScalarNode) and child.tag.endswith(":null"):
            return child, parts[i + 1:], pair[0], node
        if not isinstance(child, MappingNode):
            raise UserError(f"{doc.path}: cannot create {key}: {'.'.join(parts[:i + 1])} is not a mapping")
        node = child
    raise AssertionError(f"{key} exists; it is replaced, not created")


def _filling(doc: _Document, empty: ScalarNode, key_node: ScalarNode, parent: MappingNode,
             tree: dict) -> tuple[int, int, str]:
    """The empty section's null (`~`, `null` or nothing) replaced by the new keys, in the parent's style."""
    start, end = _scalar_span(doc.text, key_node, empty)
    if parent.flow_style:
        return start, end, (" " if start == end else "") + "{" + ", ".join(_flow_entries(tree, doc.format)) + "}"
    text, newline = doc.text, "\r\n" if "\r\n" in doc.text else "\n"
    while start > 0 and text[start - 1] == " ":  # `key: ~` becomes `key:`
        start -= 1
    line_end = _end_of_line(text, end)
    comment = text[end:line_end] if text[end:line_end].endswith("\n") else text[end:line_end] + newline
    indent = key_node.start_mark.column + _indent_step(doc.root)
    lines = _block_lines(tree, indent, _indent_step(doc.root), doc.format)
    return start, line_end, comment + "".join(line + newline for line in lines)


def _block_insertion(doc: _Document, node: MappingNode, tree: dict) -> tuple[int, int, str]:
    """New `key: value` lines after the mapping's last line, at the indentation of its keys."""
    text, newline = doc.text, "\r\n" if "\r\n" in doc.text else "\n"
    at = _end_of_line(text, _last_end(text, node))
    indent = node.value[0][0].start_mark.column
    lines = _block_lines(tree, indent, _indent_step(doc.root), doc.format)
    lead = newline if at == len(text) and text and not text.endswith("\n") else ""
    return at, at, lead + "".join(line + newline for line in lines)


def _block_lines(tree: dict, indent: int, step: int, fmt: str) -> list[str]:
    lines = []
    for key, value in tree.items():
        if isinstance(value, dict):
            lines.append(f"{' ' * indent}{_render(key, fmt)}:")
            lines += _block_lines(value, indent + step, step, fmt)
        else:
            lines.append(f"{' ' * indent}{_render(key, fmt)}: {_render(value, fmt)}")
    return lines


def _flow_insertion(doc: _Document, node: MappingNode, tree: dict) -> tuple[int, int, str]:
    """New entries after the last entry of a `{...}` mapping (every JSON object is one)."""
    entries = _flow_entries(tree, doc.format)
    if not node.value:
        at = node.start_mark.index + 1
        return at, at, ", ".join(entries)
    last_key, last_value = node.value[-1]
    if last_key.start_mark.line > node.start_mark.line:  # one entry per line: follow that layout
        line_start = doc.text.rfind("\n", 0, last_key.start_mark.index) + 1
        newline = "\r\n" if "\r\n" in doc.text else "\n"
        separator = "," + newline + re.match(r"[ \t]*", doc.text[line_start:]).group()
    else:
        separator = ", "
    at = _last_end(doc.text, last_value, last_key.end_mark.index)
    comment = re.compile(r"([ \t]*)(#[^\r\n]*)").match(doc.text, at) if separator != ", " else None
    if comment:  # the last entry's own comment stays on its line: the comma goes before it, the new entries below
        gap = comment.group(1)[1:] or " "  # the comma takes a space, where there is one to spare
        line_break = separator[1:]
        return at, comment.end(), "," + gap + comment.group(2) + line_break + separator.join(entries)
    return at, at, "".join(separator + entry for entry in entries)


def _flow_entries(tree: dict, fmt: str) -> list[str]:
    return [f"{_render(k, fmt)}: " + ("{" + ", ".join(_flow_entries(v, fmt)) + "}" if isinstance(v, dict)
                                       else _render(v, fmt))
            for k, v in tree.items()]


def _last_end(text: str, node: Node, floor: int = 0) -> int:
    """Where the node's text ends; for a block collection, where its last value ends. `floor`: where the
    node's own text starts at the earliest (after its key, or after the item before it). An alias (`*x`)
    is the node it names, whose marks are its anchor's, up the file: it ends where its `*x` does. A key
    with nothing after it (`plugins:`) ends on its key's line: its null's mark lies past the blank and
    comment lines below it."""
    if node.start_mark.index < floor:
        return _alias_end(text, node, floor)
    if isinstance(node, (MappingNode, SequenceNode)) and not node.flow_style and node.value:
        if isinstance(node, SequenceNode):
            end = node.start_mark.index
            for item in node.value:  # each item starts after the one before it
                end = _last_end(text, item, end)
            return end
        key, value = node.value[-1]
        if isinstance(value, ScalarNode) and value.start_mark.index == value.end_mark.index:
            return key.end_mark.index
        return _last_end(text, value, key.end_mark.index)
    return node.end_mark.index


def _alias_end(text: str, node: Node, floor: int) -> int:
    """Where the first `*anchor` of the node after `floor` ends (`floor` where none is found)."""
    if not node.anchor:
        return floor
    found = re.compile(rf"\*{re.escape(node.anchor)}(?=[\s,\]}}]|$)").search(text, floor)
    return found.end() if found else floor


def _end_of_line(text: str, index: int) -> int:
    """The start of the next line (a trailing comment stays with its key)."""
    if index == 0 or text[index - 1] == "\n":
        return index
    newline = text.find("\n", index)
    return len(text) if newline < 0 else newline + 1


def _indent_step(root: MappingNode) -> int:
    """How far the file indents a nested block mapping (2 when it has none)."""
    for key, value in root.value:
        if isinstance(value, MappingNode) and not value.flow_style and value.value:
            return value.value[0][0].start_mark.column - key.start_mark.column
    return 2


# ---------------------------------------------------------------------------------------------
# Spelling values


def _render(value: object, fmt: str, old_token: str = "", old_style: str | None = None) -> str:
    """The value as text, readable as the same value by YAML 1.1 (PyYAML), YAML 1.2 and JSON,
    in the old token's style where it had one (quotes, True vs true, 3.0e-4 vs 0.0003); a plain yes/no
    word in place of another is left to the file's reader, to read as it read the old one."""
    if isinstance(value, bool):
        word = "true" if value else "false"
        if fmt == "yaml" and old_token[:1].isupper():
            word = word.upper() if old_token.isupper() else word.capitalize()
        return word
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_text(value, scientific="e" in old_token.lower())
    if not isinstance(value, str):
        raise UserError(f"cannot write {type(value).__name__} value {value!r} into a config; only single values")
    if fmt == "yaml" and old_style is None and _YAML11_BOOL.fullmatch(old_token) and _YAML11_BOOL.fullmatch(value):
        return value  # yes for no, as the file spelt it: each YAML reads the new word as it read the old one
    if fmt == "yaml" and old_style == "'":
        return "'" + value.replace("'", "''") + "'"
    if fmt == "yaml" and old_style != '"' and _plain_is_safe(value):
        return value
    return json.dumps(value, ensure_ascii=False)  # a JSON string is also a YAML double-quoted scalar


def _float_text(value: float, scientific: bool) -> str:
    """The shortest exact spelling; an exponent gets a dot in the mantissa and a sign, without
    which PyYAML (YAML 1.1) reads `1e-05` as a string."""
    text = repr(value)
    if not scientific and "e" not in text:
        return text
    mantissa, exponent = format(Decimal(text).normalize(), "e").split("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{int(exponent):+d}"


_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+/-]*")
_YAML11_BOOL = re.compile(r"yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF")
"""Booleans to YAML 1.1 (PyYAML), strings to YAML 1.2: a word for which the file's reader decides."""


def _plain_is_safe(text: str) -> bool:
    """A string can go unquoted when YAML 1.1 and 1.2 both read it back as that string
    ("32-true" can, "off", "1e3" and "null" cannot)."""
    if not _PLAIN.fullmatch(text):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for version in ((1, 1), (1, 2)):
            reader = YAML(typ="safe", pure=True)
            reader.version = version
            if reader.load(text) != text:
                return False
    return True

"""The sweep spec's YAML loader: safe (no object construction) with YAML 1.2 booleans, shared by the
spec (harness.spec) and the own-model forms that read the apply target (harness.spec_own)."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from harness.errors import UserError


class SpecLoader(yaml.SafeLoader):
    """Safe YAML with 1.2 booleans: `compile: [off, default]` means the string "off", not False; a key
    written twice in one mapping is an error (PyYAML keeps the last, silently dropping a search list)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key_node.value!r} appears twice",
                                                            key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
SpecLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))

MAX_NODES = 100_000
"""The most values a spec may hold once its aliases are expanded; a real one holds hundreds. Ten nested
lists of ten `*aliases` each are a kilobyte of YAML and 10^10 values in the journal the study writes."""


def read_yaml(path: Path, what: str) -> dict:
    """Safe-load a YAML mapping (no object construction), or one clear UserError."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: {what} not found; check the path")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a {what} YAML file")
    if not path.is_file():  # reading a FIFO waits for a writer forever
        raise UserError(f"{path}: is not a regular file (a FIFO or device), expected a {what} YAML file")
    try:
        text = path.read_text()
        data = _load_bounded(text, path, what)
    except yaml.YAMLError as exc:
        problem = str(getattr(exc, "problem", None) or exc).splitlines()[0]  # the rest repeats the position
        raise UserError(f"{path}{where_yaml_failed(exc, text)}: invalid YAML ({problem}); fix the syntax") from None
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise UserError(f"{path} at line {line}: not UTF-8 text (byte {exc.object[exc.start]:#04x}); save the "
                        f"{what} as UTF-8") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read {what} ({exc})") from None
    except RecursionError:
        raise UserError(f"{path}: the {what} nests thousands of levels deep; no {what} does, check the file") from None
    if data is None:
        example = "bench's sweeps/emberformer.yaml is an example" if what == "sweep spec" else \
            "write your config's keys in it, or point apply.file at your config"
        raise UserError(f"{path}: the {what} holds no keys (it is empty, or only comments); {example}")
    if not isinstance(data, dict):
        raise UserError(f"{path}: the {what} must be a mapping of keys (key: value lines), not {top_level(data)}; "
                        "YAML or JSON only")
    return data


def where_yaml_failed(exc: yaml.YAMLError, text: str) -> str:
    """Where the parser gave up, in the file's own lines: a file cut inside a [, { or quote fails past its
    last line ("at line 3" of a 2-line file), so there the words say its end, and what was left open."""
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return ""
    if mark.index < len(text.rstrip()):
        return f" at line {mark.line + 1}"
    lines = len(text.splitlines())
    opened = getattr(exc, "context_mark", None)
    if "quoted scalar" in (getattr(exc, "context", None) or "") and opened is not None:
        return f" at its end (line {lines}: the quote of line {opened.line + 1} is never closed)"
    bracket = open_bracket(text)
    unclosed = f": the {bracket.id} of line {bracket.start_mark.line + 1} is never closed" if bracket else ""
    return f" at its end (line {lines}{unclosed})"


def open_bracket(text: str):
    """The innermost [ or { that `text` opens and never closes (its scanner token), or None."""
    opened = []
    try:
        for token in yaml.scan(text):
            if isinstance(token, (yaml.FlowSequenceStartToken, yaml.FlowMappingStartToken)):
                opened.append(token)
            elif isinstance(token, (yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken)) and opened:
                opened.pop()
    except yaml.YAMLError:
        pass  # what it scanned up to there still tells
    return opened[-1] if opened else None


def top_level(data) -> str:
    """What a file holds instead of a mapping, in words (not a Python type name)."""
    return {list: "a list", str: "a single string"}.get(type(data), "a single value")


def _load_bounded(text: str, path: Path, what: str):
    """yaml.load, refusing a document whose aliases add over MAX_NODES values to what is written (counted on
    the node graph, where an alias is its anchor's node again, before anything is expanded)."""
    loader = SpecLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes = {}
        if _expanded_size(node, sizes) - len(sizes) > MAX_NODES:  # what aliases add: a long file written out is no bomb
            raise UserError(f"{path}: the {what}'s aliases (*name) expand to over {MAX_NODES:,} values; no {what} "
                            "needs that many, write the values out or check the file")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node, sizes: dict) -> int:
    """How many values the node holds with every alias expanded (memoised per node: a shared one counts
    once per use, at the cost of one visit)."""
    if id(node) not in sizes:
        sizes[id(node)] = 0  # a node that holds itself (`&a [*a]`) is refused by the constructor
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        sizes[id(node)] = 1 + sum(_expanded_size(child, sizes) for child in children)
    return sizes[id(node)]

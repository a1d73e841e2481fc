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
        data = yaml.load(path.read_text(), Loader=SpecLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = str(getattr(exc, "problem", None) or exc).splitlines()[0]  # the rest repeats the position
        raise UserError(f"{path}{where}: invalid YAML ({problem}); fix the syntax") from None
    except (OSError, UnicodeDecodeError) as exc:
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


def top_level(data) -> str:
    """What a file holds instead of a mapping, in words (not a Python type name)."""
    return {list: "a list", str: "a single string"}.get(type(data), "a single value")

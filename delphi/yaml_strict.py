"""YAML whose mappings may not repeat a key.

YAML 1.2 requires a mapping's keys to be unique, but PyYAML's SafeLoader keeps the last value of a
repeated key without a word: `optim: {lr: 0.01}` and, twenty lines on, `optim: {lr: 0.1}` trained
with the second (issue 41). `StrictSafeLoader` refuses it, naming the key and both lines.

delphi.io.load_yaml_text, the one loader for what a user hands Delphi, uses it.

A merge key (`<<: *defaults`) is not a duplicate: keys given beside it override the merged ones,
as YAML's merge rule says. Only the keys written in one mapping are compared.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError

MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(ConstructorError):
    """A mapping repeats a key. Its message is one line: the key and both line numbers."""

    def __init__(self, key: Any, first_line: int, again_line: int) -> None:
        from delphi.errors import quoted

        super().__init__()
        self.key, self.first_line, self.again_line = key, first_line, again_line
        self.text = f"duplicate key {quoted(key, 100)} at line {again_line} (first at line {first_line}); a key may appear once per mapping"

    def __str__(self) -> str:
        return self.text


class StrictSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises DuplicateKeyError on a key repeated in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader's own error says so
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise DuplicateKeyError(key, first, line)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


StrictSafeLoader.add_constructor("tag:yaml.org,2002:map", StrictSafeLoader.construct_yaml_map)

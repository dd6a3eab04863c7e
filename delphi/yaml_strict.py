"""Strict YAML for what a user hands Delphi: `load_yaml_text` refuses a repeated key, an alias bomb,
a recursive alias and a document nested too deeply, each a DelphiError naming the file.

YAML 1.2 requires a mapping's keys to be unique, but PyYAML's SafeLoader keeps the last value of a
repeated key without a word: `optim: {lr: 0.01}` and, twenty lines on, `optim: {lr: 0.1}` would
train with the second. `StrictSafeLoader` refuses it, naming the key and both lines.

A merge key (`<<: *defaults`) is not a duplicate: keys given beside it override the merged ones,
as YAML's merge rule says. Only the keys written in one mapping are compared.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from delphi.errors import DelphiError, quoted

MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(ConstructorError):
    """A mapping repeats a key. Its message is one line: the key and both line numbers."""

    def __init__(self, key: Any, first_line: int, again_line: int) -> None:
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


# A YAML document may expand to at most this many characters plus YAML_MAX_EXPANSION times its own
# length once its aliases are followed. Without aliases a document expands to its own length; a
# 675-byte "billion laughs" document expands to 39 MB, and each further level multiplies that.
YAML_MAX_EXPANDED_CHARS = 1_000_000


YAML_MAX_EXPANSION = 10


def load_yaml_text(text: str, where: str | os.PathLike = "YAML") -> Any:
    """The one YAML loader for what a user hands Delphi (train, flops, study, ladder specs, run
    configs, preregistrations): yaml.safe_load, but a document whose aliases expand it beyond
    YAML_MAX_EXPANDED_CHARS + YAML_MAX_EXPANSION x its length (an alias bomb), that refers to
    itself, that nests too deeply or that repeats a key in one mapping (`yaml_strict`) is a
    DelphiError naming `where`, before anything is built."""
    loader = StrictSafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        limit = YAML_MAX_EXPANDED_CHARS + YAML_MAX_EXPANSION * len(text)
        size = _expanded_chars(node, limit)
        if size is None:
            raise DelphiError(f"{where}: the YAML document refers to itself (a recursive alias); expected plain data")
        if size > limit:
            raise DelphiError(
                f"{where}: the YAML document's aliases expand its {len(text):,} characters to more than {limit:,} "
                "(an alias bomb?); expected plain data"
            )
        return loader.construct_document(node)
    except DuplicateKeyError as e:
        raise DelphiError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        raise DelphiError(f"{where}: not valid YAML ({_one_line(e)[:QUOTED_ERROR_MAX_CHARS]})") from None
    except RecursionError:
        raise DelphiError(f"{where}: the YAML document nests too deeply") from None
    finally:
        loader.dispose()


QUOTED_ERROR_MAX_CHARS = 300  # of a parser's message, which quotes the offending text


def _expanded_chars(root: yaml.Node, limit: int) -> int | None:
    """Characters of `root` with every alias followed (each node counts 1 plus its scalar's length),
    counted without expanding anything; stops once past `limit`; None for a recursive document."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = (
            [c for pair in node.value for c in pair]
            if isinstance(node, yaml.MappingNode)
            else (node.value if isinstance(node, yaml.SequenceNode) else [])
        )
        if not children_done:
            if key in in_progress:
                return None
            in_progress.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in in_progress and id(child) not in sizes:
                    return None
                if id(child) not in sizes:
                    stack.append((child, False))
            continue
        total = 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else sum(sizes[id(c)] for c in children))
        sizes[key] = min(total, limit + 1)
        in_progress.discard(key)
    return sizes[id(root)]


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())

"""Where each key of a YAML file is: errors name the file, the line and the key.

PyYAML's composer keeps the position of every node; :func:`key_lines` maps each key path
(mapping keys and sequence indices, as pydantic reports an error's location) to its line.
"""

from __future__ import annotations

from typing import Any

import yaml

Path = tuple[str | int, ...]


def key_lines(text: str) -> dict[Path, int]:
    """The 1-based line of every key path of the YAML document ``text`` (``{}`` when it does
    not compose: the parse error says where instead).

    Example:
        >>> lines = key_lines("pipelines:\\n  - name: a\\n    schema:\\n      - {name: id}\\n")
        >>> lines[("pipelines", 0, "schema", 0, "name")], lines[("pipelines", 0)]
        (4, 2)
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    lines: dict[Path, int] = {}

    def walk(node: Any, path: Path) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                child = (*path, key.value)
                lines[child] = key.start_mark.line + 1
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = (*path, index)
                lines[child] = item.start_mark.line + 1
                walk(item, child)

    if root is not None:
        walk(root, ())
    return lines


def line_of(lines: dict[Path, int], path: Path) -> int | None:
    """The line of ``path``, or of its nearest ancestor in the file (a missing key is
    reported at the mapping that lacks it).

    Example:
        >>> line_of({("a",): 1, ("a", "b"): 2}, ("a", "b", "c"))
        2
    """
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def yaml_error_line(error: yaml.YAMLError) -> int | None:
    """The 1-based line a YAML syntax error points at, if it says."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    return None if mark is None else int(mark.line) + 1

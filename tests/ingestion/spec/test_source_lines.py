"""Key paths of a YAML file to their lines, as pydantic reports an error's location."""

from __future__ import annotations

import pytest
import yaml

from ingestion.spec.source_lines import key_lines, line_of, yaml_error_line

TEXT = """\
pipelines:
  - name: a
    schema:
      - name: id
        type: long
      - {name: b, type: string}
  - name: c
"""


def test_every_key_and_item_has_its_line() -> None:
    lines = key_lines(TEXT)
    assert lines[("pipelines",)] == 1
    assert lines[("pipelines", 0, "schema", 0, "type")] == 5
    assert lines[("pipelines", 0, "schema", 1, "name")] == 6
    assert lines[("pipelines", 1)] == 7


def test_a_missing_key_is_placed_at_the_nearest_ancestor() -> None:
    lines = key_lines(TEXT)
    assert line_of(lines, ("pipelines", 1, "topic")) == 7
    assert line_of(lines, ("elsewhere",)) is None


def test_a_document_that_does_not_parse_has_no_lines_but_its_error_has_one() -> None:
    broken = "a:\n  b: [1\n"
    assert key_lines(broken) == {}
    with pytest.raises(yaml.YAMLError) as caught:
        yaml.safe_load(broken)
    assert yaml_error_line(caught.value) == 3

"""The one YAML loader: a missing file and a syntax error name the file, in the caller's error type."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.yamlfile import load_yaml, parse_yaml


class MyError(Exception):
    pass


def test_a_document_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("a: 1\nb: [x, y]\n")
    assert load_yaml(path, "config file", MyError) == {"a": 1, "b": ["x", "y"]}


def test_an_empty_file_is_none(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_yaml(path, "config file", MyError) is None


def test_a_missing_file_names_what_and_where(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(MyError, match=rf"cannot read snapshot {path}: No such file"):
        load_yaml(path, "snapshot", MyError)


def test_a_syntax_error_names_the_source() -> None:
    with pytest.raises(MyError, match="scenario default is not valid YAML") as info:
        parse_yaml("a: [1, 2\n", "scenario default", MyError)
    assert info.value.__cause__ is not None  # the parser's own message and position are kept


def test_python_objects_are_never_constructed() -> None:
    with pytest.raises(MyError, match="not valid YAML"):
        parse_yaml("!!python/object/apply:os.system ['true']\n", "x", MyError)

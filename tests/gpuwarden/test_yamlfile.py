"""The one YAML loader: a missing file and a syntax error name the file, in the caller's error type."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.yamlfile import load_yaml, parse_yaml, unknown_keys, yaml_number


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


def test_a_file_that_is_not_utf8_names_the_file_and_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(MyError, match=rf"snapshot {path} is not UTF-8 text: byte 0xe9 at offset 9") as info:
        load_yaml(path, "snapshot", MyError)
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


def test_an_unknown_key_is_named_with_the_closest_known_one() -> None:
    known = ("quota", "limit", "overQuotaWeight")
    assert unknown_keys({"quota": 1, "limt": 2, "overquotaweight": 3}, known) == [
        ("limt", "unknown key 'limt' (did you mean 'limit'?)"),
        ("overquotaweight", "unknown key 'overquotaweight' (did you mean 'overQuotaWeight'?)"),
    ]
    assert unknown_keys({"zzz": 1}, known) == [("zzz", "unknown key 'zzz' (known: limit, overQuotaWeight, quota)")]
    assert unknown_keys({"quota": 1}, known) == []


def test_numbers_yaml_reads_as_strings_are_numbers() -> None:
    # YAML 1.1 reads an exponent without a dot (1e300) as a string.
    assert yaml_number("1e300") == 1e300
    assert yaml_number(" 2.5 ") == 2.5
    assert yaml_number(3) == 3.0
    assert yaml_number(float("inf")) == float("inf")  # finiteness is the caller's to judge, with its key
    assert yaml_number("lots") is None
    assert yaml_number(True) is None
    assert yaml_number(None) is None


def test_a_key_given_twice_is_refused_with_both_lines() -> None:
    text = "queues:\n  - name: a\n    quota: {gpu: 4}\n    limit: {gpu: 8}\n    quota: {gpu: 40}\n"
    with pytest.raises(MyError, match=r"found key 'quota' a second time \(first at line 3\)") as info:
        parse_yaml(text, "fair-share file f.yaml", MyError)
    assert "line 5" in str(info.value)


def test_the_same_key_in_different_mappings_and_merge_overrides_are_fine() -> None:
    text = "a: {x: 1}\nb: {x: 2}\nbase: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n"
    assert parse_yaml(text, "x", MyError) == {
        "a": {"x": 1},
        "b": {"x": 2},
        "base": {"x": 1, "y": 2},
        "c": {"x": 3, "y": 2},
    }

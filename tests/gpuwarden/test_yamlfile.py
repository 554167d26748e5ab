"""The one YAML loader: a missing file and a syntax error name the file, in the caller's error type."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from gpuwarden.yamlfile import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_MESSAGE,
    load_yaml,
    parse_yaml,
    unknown_keys,
    yaml_number,
)


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


def _billion_laughs(levels: int = 9) -> str:
    """The classic alias bomb: about 350 bytes that expand to 9**9 strings."""
    doc = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n"
    previous = "a"
    for name in "bcdefghijk"[: levels - 1]:
        doc += f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]\n"
        previous = name
    return doc


def test_an_alias_bomb_is_refused_with_a_short_message(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_billion_laughs())
    assert path.stat().st_size < 1024
    with pytest.raises(MyError, match=rf"config file {path} is refused: its aliases expand to more than") as info:
        load_yaml(path, "config file", MyError)
    assert len(str(info.value)) <= MAX_MESSAGE


def test_too_many_aliases_and_too_deep_a_nesting_are_refused() -> None:
    many = "d: &d 1\nl: [" + ", ".join(["*d"] * (MAX_ALIASES + 1)) + "]\n"
    with pytest.raises(MyError, match=f"more than {MAX_ALIASES} aliases"):
        parse_yaml(many, "x", MyError)
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    with pytest.raises(MyError, match=f"nested more than {MAX_DEPTH} levels deep"):
        parse_yaml(deep, "x", MyError)
    # Far deeper than Python's recursion limit: still our error, not a RecursionError.
    with pytest.raises(MyError, match="levels deep"):
        parse_yaml("[" * 5000 + "]" * 5000, "x", MyError)
    # Within the limits, aliases and merge keys work as YAML intends.
    assert parse_yaml("d: &d {x: 1, y: 2}\na: {<<: *d, y: 3}\nb: *d\n", "x", MyError) == {
        "d": {"x": 1, "y": 2},
        "a": {"x": 1, "y": 3},
        "b": {"x": 1, "y": 2},
    }
    nested: list[object] = []
    for _ in range(MAX_DEPTH - 1):
        nested = [nested]
    assert parse_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x", MyError) == nested


def test_a_file_that_never_ends_is_read_only_to_its_cap(tmp_path: Path) -> None:
    with pytest.raises(MyError, match=r"config file /dev/zero is larger than 1024 bytes"):
        load_yaml("/dev/zero", "config file", MyError, max_bytes=1024)
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)

    def write_forever() -> None:
        with contextlib.suppress(BrokenPipeError), fifo.open("wb") as out:
            while True:
                out.write(b"a: 1\n" * 1024)

    writer = threading.Thread(target=write_forever, daemon=True)
    writer.start()
    try:
        with pytest.raises(MyError, match=rf"config file {fifo} is larger than 1024 bytes"):
            load_yaml(fifo, "config file", MyError, max_bytes=1024)
    finally:
        writer.join(timeout=10)
    assert not writer.is_alive()


def test_a_file_at_the_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_bytes(b"a: 1\n" + b"#" * (1024 - 6) + b"\n")
    assert path.stat().st_size == 1024
    assert load_yaml(path, "config file", MyError, max_bytes=1024) == {"a": 1}


def test_errors_stay_short_whatever_the_file_holds() -> None:
    with pytest.raises(MyError) as info:
        parse_yaml("a: [" + "x" * 1_000_000 + "\n", "config file x", MyError)
    assert len(str(info.value)) <= MAX_MESSAGE
    # An integer of thousands of digits: Python's int() refuses it, and that is a YAML error here.
    with pytest.raises(MyError, match="config file x is not valid YAML") as info:
        parse_yaml("a: " + "9" * 5000 + "\n", "config file x", MyError)
    assert len(str(info.value)) <= MAX_MESSAGE

"""cel.bind rewritten before compiling: cel-go's scoping, and its value read only where the body reads the name."""

from __future__ import annotations

import cel
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.cluster.celbind import MAX_EXPANDED, BindError, expand_bindings


@pytest.mark.parametrize(
    ("expression", "expanded"),
    [
        ("cel.bind(x, 2, x == 2)", "((2) == 2)"),
        # A field or a function of the name's spelling is not the variable; a map key is.
        ("cel.bind(size, [1], size(size) == 1)", "(size(([1])) == 1)"),
        ("cel.bind(a, 1, {a: a}.a)", "({(1): (1)}.a)"),
        # A number's suffix is no name.
        ("cel.bind(u, 2, u + 10u)", "((2) + 10u)"),
        # A comprehension that binds the name again shadows it in its arguments, not in its range.
        ("cel.bind(x, [1], x.map(x, x + 1))", "(([1]).map(x, x + 1))"),
        # Inserting the value under a macro that binds one of its names would capture it: bound eagerly.
        ("cel.bind(x, y, [1].map(y, x + y))", "([(y)].map(x, ([1].map(y, x + y)))[0])"),
        # map and filter bind one variable, whatever their count of arguments; all and exists two with three.
        ("cel.bind(x, true, [1, 2].map(y, x, y))", "([1, 2].map(y, (true), y))"),
        ("cel.bind(x, 1, {1: 2}.all(k, v, k == x))", "({1: 2}.all(k, v, k == (1)))"),
        ("cel.bind(v, 1, {1: 2}.all(k, v, k == v))", "({1: 2}.all(k, v, k == v))"),
        # A namespaced function is resolved before a variable of the namespace's name.
        ("cel.bind(sets, [1], sets.contains(sets, [1]))", "(sets.contains(([1]), [1]))"),
        # A comment that ends the body or the value does not swallow what the rewrite adds.
        ("cel.bind(a, 1 // one\n, a == 1 // small ones only\n)", "((1 // one\n) == 1 // small ones only\n)"),
        # A member named cel is no macro, spaces or not; a comment after the name is no part of it.
        ("[1].map(y, y . cel.bind(a, 1, a))", "[1].map(y, y . cel.bind(a, 1, a))"),
        ("x.cel.bind(a, 1, a)", "x.cel.bind(a, 1, a)"),
        ("cel.bind(x // the name\n, 1, x)", "((1))"),
        # Strings are left alone.
        ("cel.bind(s, 'a,b)\\'c', s + 's')", "(('a,b)\\'c') + 's')"),
    ],
)
def test_the_name_becomes_its_value_where_the_body_reads_it(expression: str, expanded: str) -> None:
    assert expand_bindings(expression) == expanded


@pytest.mark.parametrize(
    ("expression", "said"),
    [
        ("cel.bind(x.y, 2, true)", "simple identifiers"),
        ("cel.bind(x, 2)", "3 arguments"),
        ("cel.bind(x, 2, x == 2", "not closed"),
    ],
)
def test_a_malformed_bind_is_an_error(expression: str, said: str) -> None:
    with pytest.raises(BindError, match=said):
        expand_bindings(expression)


# Bodies over one name ``v``, and the value each gives with v bound to an int (None: an error).
_BODIES = [
    ("v + 1", lambda v: v + 1),
    ("v * v - v", lambda v: v * v - v),
    ("[v, v].size()", lambda v: 2),
    ("7", lambda v: 7),
    ("v > 3 ? v : 0", lambda v: v if v > 3 else 0),
    ("[1, 2].map(w, w + v)[1]", lambda v: 2 + v),
    ("[5].map(v, v)[0] + v", lambda v: 5 + v),
]


@given(
    value=st.integers(-30, 30),  # three squarings stay within 64 bits
    bodies=st.lists(st.integers(0, len(_BODIES) - 1), min_size=1, max_size=3),
)
def test_nested_binds_evaluate_as_their_meaning(value: int, bodies: list[int]) -> None:
    """``cel.bind(v, cel.bind(v, cel.bind(v, value, b1), b2), b3)``: each body reads the one inside it."""
    expression = str(value)
    expected = value
    for k in bodies:
        text, meaning = _BODIES[k]
        expression = f"cel.bind(v, {expression}, {text})"
        expected = meaning(expected)
    assert cel.evaluate(expand_bindings(expression), {}) == expected


def test_a_bind_that_would_grow_too_large_is_bound_once() -> None:
    expression = "0"
    for _ in range(12):
        expression = f"cel.bind(v, {expression}, v + v + v)"
    expanded = expand_bindings(expression)
    assert len(expanded) <= MAX_EXPANDED + 1000
    assert cel.evaluate(expanded, {}) == 0


def test_a_comment_at_the_end_of_a_body_keeps_the_expression_whole() -> None:
    selector = 'cel.bind(a, {"type": "mig"},\n  a.type == "mig" // small ones only\n)'
    assert cel.evaluate(expand_bindings(selector), {}) is True


@given(body=st.sampled_from(["true", "1 == 1", "[2].map(v, v)[0] == 2", "{'v': 1}.v == 1"]))
def test_a_value_the_body_never_reads_is_never_evaluated(body: str) -> None:
    assert cel.evaluate(expand_bindings(f"cel.bind(v, 1 / 0, {body})"), {}) is True

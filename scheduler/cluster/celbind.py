"""CEL's ``cel.bind`` macro, rewritten before compiling: the CEL library does not expand it.

``cel.bind(name, value, body)`` (CEL's bindings extension, which Kubernetes
adds to the environment of DRA selectors) is ``body`` with ``name`` bound to
``value``. In cel-go, which kube-scheduler runs, ``value`` is evaluated only
when ``body`` reads ``name``: a selector such as
``cel.bind(p, attrs.profile, attrs.type == "mig" && p == "1g.5gb")`` is
false on a whole GPU, which has no ``profile``, not an error. The rewrite
keeps that: each free ``name`` in ``body`` becomes ``(value)``. CEL has no
side effects, so evaluating ``value`` at each read changes only the cost
(and each device's verdict is kept, :mod:`.drasel`).

Scoping, as the macro's:

- ``name`` is seen in ``body`` alone and shadows an outer variable of that
  name; ``value`` is read in the outer scope.
- A comprehension macro in ``body`` (``all``, ``exists``, ``exists_one``,
  ``map``, ``filter``) that binds ``name`` again shadows it within its
  arguments (``map`` and ``filter`` bind their first argument, the others
  their first two when they have three); an inner ``cel.bind`` is
  rewritten first, so its own ``name`` is gone before the outer one is
  looked for.
- ``x.name`` is a field, ``name(...)`` a function, ``sets.contains(...)`` a
  function of a namespace: none is the variable.

Where inserting ``value`` would put one of its names under a macro that
binds that name (capture), or would make the expression grow past
:data:`MAX_EXPANDED` characters, that bind is rewritten eagerly instead:
``([value].map(name, body)[0])``, which binds once and evaluates ``value``
first, so there a ``value`` that fails is an error even where ``body`` does
not read it. A ``)`` the rewrite adds after text that may end in a ``//``
comment goes on a line of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BIND_RE = re.compile(r"cel\s*\.\s*bind\s*\(")
_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Numbers, consumed whole so that a suffix or exponent (``10u``, ``1e5``) is never read as a name.
_NUMBER_RE = re.compile(r"0[xX][0-9a-fA-F]+[uU]?|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[uU]?")
_OPENING = {"(": ")", "[": "]", "{": "}"}
# The comprehension macros: ``range.macro(var, ...)`` binds ``var`` in its other arguments; those
# that take two variables do so with three arguments (``all(k, v, p)``), while ``map(x, p, t)``
# and ``filter`` bind one whatever their count.
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_TWO_VARIABLES = frozenset({"all", "exists", "exists_one"})
# Functions of a namespace, which cel-go resolves before a variable of the namespace's name.
_NAMESPACED = frozenset({"sets.contains", "sets.equivalent", "sets.intersects"})
MAX_EXPANDED = 50_000


class BindError(ValueError):
    """A malformed ``cel.bind``: its text says why, in the words cel-go uses."""


@dataclass(frozen=True, slots=True)
class _Token:
    text: str
    start: int
    name: bool  # an identifier


def skip_literal(text: str, start: int) -> int:
    """The index after the string literal or comment that starts at ``start``, or ``start`` if none does.

    CEL's literals: single, double and triple quotes, with an ``r`` (raw) or
    ``b`` (bytes) prefix; a backslash escapes the next character except in
    raw strings. A ``//`` comment runs to the end of the line.
    """
    if text.startswith("//", start):
        end = text.find("\n", start)
        return len(text) if end < 0 else end
    prefix = start
    raw = False
    while prefix < len(text) and text[prefix] in "rRbB" and prefix - start < 2:
        raw = raw or text[prefix] in "rR"
        prefix += 1
    if prefix >= len(text) or text[prefix] not in "'\"":
        return start
    if prefix > start and start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        return start  # the prefix letters end an identifier (``attr"``): not a literal
    quote = text[prefix] * 3 if text.startswith(text[prefix] * 3, prefix) else text[prefix]
    index = prefix + len(quote)
    while index < len(text):
        if text[index] == "\\" and not raw:
            index += 2
            continue
        if text.startswith(quote, index):
            return index + len(quote)
        index += 1
    return len(text)  # unterminated: the compiler says so


def _tokens(text: str) -> list[_Token]:
    """Identifiers, literals and punctuation, in order; spaces and comments left out."""
    out: list[_Token] = []
    index = 0
    while index < len(text):
        after = skip_literal(text, index)
        if after != index:
            if not text.startswith("//", index):
                out.append(_Token(text[index:after], index, name=False))
            index = after
            continue
        if text[index].isspace():
            index += 1
            continue
        match = _IDENTIFIER_RE.match(text, index) or _NUMBER_RE.match(text, index)
        if match is not None:
            out.append(_Token(match.group(), index, name=match.group()[0].isalpha() or match.group()[0] == "_"))
            index = match.end()
            continue
        out.append(_Token(text[index], index, name=False))
        index += 1
    return out


def _arguments(text: str, start: int) -> tuple[list[str], int]:
    """The top-level, comma-separated arguments of the call whose ``(`` ends at ``start``, and the index after ``)``."""
    arguments: list[str] = []
    closing: list[str] = []
    begin = index = start
    while index < len(text):
        after = skip_literal(text, index)
        if after != index:
            index = after
            continue
        char = text[index]
        if char in _OPENING:
            closing.append(_OPENING[char])
        elif closing and char == closing[-1]:
            closing.pop()
        elif not closing and char in ",)":
            arguments.append(text[begin:index])
            if char == ")":
                return arguments, index + 1
            begin = index + 1
        index += 1
    raise BindError("cel.bind( is not closed")


def _member(expression: str, index: int) -> bool:
    """Whether ``cel`` at ``index`` ends an identifier or follows a ``.`` (``x.cel.bind(``): no macro then."""
    if index > 0 and (expression[index - 1].isalnum() or expression[index - 1] == "_"):
        return True
    return expression[:index].rstrip().endswith(".")


def _macro_variables(tokens: list[_Token], k: int) -> list[str]:
    """The variables a comprehension macro at token ``k`` (``.map``) binds; none where ``k`` is no such macro."""
    if k == 0 or tokens[k - 1].text != "." or tokens[k].text not in _MACROS:
        return []
    if k + 3 >= len(tokens) or tokens[k + 1].text != "(" or not tokens[k + 2].name or tokens[k + 3].text != ",":
        return []
    variables = [tokens[k + 2].text]
    if tokens[k].text in _TWO_VARIABLES and _argument_count(tokens, k + 1) == 3 and tokens[k + 4].name:
        variables.append(tokens[k + 4].text)
    return variables


def _argument_count(tokens: list[_Token], opening: int) -> int:
    """How many arguments the call whose ``(`` is token ``opening`` has."""
    depth = 0
    count = 1
    for token in tokens[opening:]:
        if token.text in _OPENING:
            depth += 1
        elif token.text in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return count
        elif token.text == "," and depth == 1:
            count += 1
    return count


def _substitute(body: str, name: str, value: str) -> str | None:
    """``body`` with each free ``name`` as ``(value)``; None where that would capture one of ``value``'s names."""
    tokens = _tokens(body)
    value_names = {t.text for t in _tokens(value) if t.name}
    depth = 0
    size = len(body)  # what the result would hold so far, to stop before it grows past the bound
    binders: list[tuple[int, str]] = []  # (the depth inside the macro's parentheses, a variable it binds)
    bound_here: set[int] = set()  # tokens that are a macro's variable, not a use
    out: list[str] = []
    last = 0
    for k, token in enumerate(tokens):
        if token.text in _OPENING:
            depth += 1
            continue
        if token.text in (")", "]", "}"):
            depth -= 1
            while binders and binders[-1][0] > depth:
                binders.pop()
            continue
        if not token.name:
            continue
        variables = _macro_variables(tokens, k)
        if variables:
            binders.extend((depth + 1, v) for v in variables)
            bound_here.update((k + 2, k + 4) if len(variables) > 1 else (k + 2,))
            continue
        if token.text != name or k in bound_here:
            continue
        if (k and tokens[k - 1].text == ".") or (k + 1 < len(tokens) and tokens[k + 1].text == "("):
            continue  # a field, or a function
        if k + 3 < len(tokens) and tokens[k + 1].text == "." and f"{name}.{tokens[k + 2].text}" in _NAMESPACED:
            continue  # a namespaced function (sets.contains), resolved before the variable
        shadowing = {v for _, v in binders}
        if name in shadowing:
            continue
        if value_names & shadowing:
            return None
        inserted = _parenthesized(value)
        size += len(inserted) - len(token.text)
        if size > MAX_EXPANDED:
            return None
        out.append(body[last : token.start])
        out.append(inserted)
        last = token.start + len(token.text)
    out.append(body[last:])
    return "".join(out)


def _parenthesized(text: str) -> str:
    """``(text)``, the ``)`` on a line of its own where a ``//`` comment could end ``text``."""
    return f"({text}\n)" if "//" in text else f"({text})"


def expand_bindings(expression: str) -> str:
    """``expression`` with each ``cel.bind(name, value, body)`` rewritten (module docstring).

    Raises BindError when a ``cel.bind`` is malformed (not three arguments,
    a name that is no simple identifier).
    """
    if "bind" not in expression:
        return expression
    out: list[str] = []
    index = 0
    while index < len(expression):
        after = skip_literal(expression, index)
        if after != index:
            out.append(expression[index:after])
            index = after
            continue
        match = _BIND_RE.match(expression, index)
        if match is None or _member(expression, index):
            out.append(expression[index])
            index += 1
            continue
        arguments, index = _arguments(expression, match.end())
        if len(arguments) != 3:
            raise BindError(f"cel.bind takes 3 arguments, not {len(arguments)}")
        name = re.sub(r"//[^\n]*", "", arguments[0]).strip()
        if _IDENTIFIER_RE.fullmatch(name) is None:
            raise BindError(f"cel.bind() variable names must be simple identifiers, not {name!r}")
        value, body = (expand_bindings(argument).strip() for argument in arguments[1:])
        lazy = _substitute(body, name, value)
        if lazy is None:
            out.append(f"([{_parenthesized(value)}].map({name}, {_parenthesized(body)})[0])")
        else:
            out.append(_parenthesized(lazy))
    return "".join(out)

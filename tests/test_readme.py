"""The README's references cannot drift from the code: flags, config keys, alert runbooks, condition runbooks.

The configuration reference is a table per command whose rows are what the
argparse parsers say (flag, environment variable, default, help); a flag
added, renamed or given a new default fails here with the row to paste. The
same for the two config files: a table each, one row per key of the config
dataclasses with its default, described by the key's comment in the
module docstring's example (which must list every key, at its default), so a
key added without documentation fails here too.
Every alert's ``runbook_url`` must lead to a runbook section that exists,
and every condition type and reason the agent writes has its runbook.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

import agent.config
import scheduler.remediation.policy
from gpuwarden.cli import build_parser
from gpuwarden.contract import ConditionType, Reason
from scheduler.cluster import grouping
from scheduler.cluster.owners import FOLLOWED_KINDS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RULES = ROOT / "manifests" / "monitoring" / "gpuwarden-rules.yaml"
RUNBOOK_PREFIX = "README.md#"
# How the README writes the agent's --node-name default, which is this machine's.
NODE_NAME_DEFAULT = "`$NODE_NAME`, else the host name"


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    ends = [m.start() for m in re.finditer(rf"\n(#{{1,{level}}}) ", text[start:])]
    return text[start : start + ends[0]] if ends else text[start:]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def _default(action: argparse.Action) -> str:
    if action.dest == "node_name":
        return NODE_NAME_DEFAULT
    value: Any = action.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value is None:
        return "-"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def _help(action: argparse.Action) -> str:
    text = re.sub(r" \[env [A-Z_]+\]$", "", action.help or "")
    return re.sub(r" \(default: [^()]*\)$", "", text)


def _rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| flag | environment variable | default | what it does |", "| --- | --- | --- | --- |"]
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        env = re.search(r"\[env ([A-Z_]+)\]$", action.help or "")
        assert env is not None, f"{action.option_strings[0]} has no environment variable"
        choices = f" (one of {', '.join(f'`{c}`' for c in action.choices)})" if action.choices else ""
        flag = action.option_strings[0]
        rows.append(f"| `{flag}` | `{env.group(1)}` | {_default(action)} | {_help(action)}{choices} |")
    return rows


@pytest.fixture
def parsers(monkeypatch: pytest.MonkeyPatch) -> dict[str, argparse.ArgumentParser]:
    """The parsers as a fresh shell builds them: no GPUWARDEN_ variable set, no NODE_NAME."""
    for name in list(os.environ):
        if name.startswith("GPUWARDEN_") or name == "NODE_NAME":
            monkeypatch.delenv(name)
    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return {"gpuwarden": root, "agent": sub.choices["agent"], "scheduler": sub.choices["scheduler"]}


@pytest.mark.parametrize(
    ("command", "heading"),
    [
        ("gpuwarden", "### Every command"),
        ("agent", "### `gpuwarden agent`"),
        ("scheduler", "### `gpuwarden scheduler`"),
    ],
)
def test_the_configuration_reference_is_what_the_parsers_say(
    parsers: dict[str, argparse.ArgumentParser], command: str, heading: str
) -> None:
    reference = _section(README.read_text(), "## Configuration reference")
    documented = [line for line in _section(reference, heading).splitlines() if line.startswith("|")]
    expected = _rows(parsers[command])
    assert documented == expected, "README table should read:\n" + "\n".join(expected)


def _example(doc: str) -> tuple[str, dict[str, str]]:
    """A docstring's example "with every key at its default": its YAML, and each key's comment.

    The block is the indented text after the line that announces it (ending
    in ``::``). Keys nest by indentation; a line that is only a comment
    continues the comment of the key above it; a key with nothing after its
    colon is a section, and only the keys under sections are rows.
    """
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if "with every key at its default" in line and line.endswith("::"))
    block: list[str] = []
    for line in lines[start + 1 :]:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line[4:])
    comments: dict[str, str] = {}
    sections: list[tuple[int, str]] = []
    last = ""
    for line in block:
        body, _, comment = line.partition("#")
        if not body.strip():
            if comment.strip():
                assert last, f"a comment that belongs to no key: {line!r}"
                comments[last] += " " + comment.strip()
            continue
        indent = len(body) - len(body.lstrip())
        key, _, value = body.strip().partition(":")
        while sections and sections[-1][0] >= indent:
            sections.pop()
        path = ".".join([*(name for _, name in sections), key])
        if value.strip():
            comments[path], last = comment.strip(), path
        else:
            sections.append((indent, key))
            last = ""
    return "\n".join(block), comments


def _leaves(obj: Any, prefix: str = "", skip: Collection[str] = ()) -> list[tuple[str, Any]]:
    """Every key of a config dataclass instance, dotted, with its value: nested dataclasses are sections."""
    out: list[tuple[str, Any]] = []
    for f in dataclasses.fields(obj):
        if f.name in skip:
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += _leaves(value, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", value))
    return out


def _yaml_value(value: Any) -> str:
    """A default as the config file spells it."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, Mapping | list | tuple):
        assert not value, f"a non-empty default needs a spelling here: {value!r}"
        return "`{}`" if isinstance(value, Mapping) else "`[]`"
    return f"`{value}`"


def _key_rows(defaults: Any, comments: Mapping[str, str], skip: Collection[str] = ()) -> list[str]:
    rows = ["| key | default | what it sets |", "| --- | --- | --- |"]
    for key, value in _leaves(defaults, skip=skip):
        what = comments.get(key, "NOT DOCUMENTED").replace("|", "\\|")
        rows.append(f"| `{key}` | {_yaml_value(value)} | {what} |")
    return rows


def _agent_config(text: str) -> object:
    return agent.config.config_from_dict(yaml.safe_load(text))


def _remediation_config(text: str) -> object:
    return scheduler.remediation.policy.Settings.from_mapping(yaml.safe_load(text))


CONFIG_FILES: list[tuple[str, ModuleType, object, Collection[str], Callable[[str], object]]] = [
    ("### Agent config file", agent.config, agent.config.AgentConfig(), (), _agent_config),
    (
        "### Remediation config file",
        scheduler.remediation.policy,
        scheduler.remediation.policy.Settings(),
        scheduler.remediation.policy.NOT_IN_FILE,
        _remediation_config,
    ),
]


@pytest.mark.parametrize(("heading", "module", "defaults", "skip", "parse"), CONFIG_FILES, ids=["agent", "remediation"])
def test_every_config_file_key_is_documented_with_its_default(
    heading: str, module: ModuleType, defaults: object, skip: Collection[str], parse: Callable[[str], object]
) -> None:
    example, comments = _example(module.__doc__ or "")
    keys = {key for key, _ in _leaves(defaults, skip=skip)}
    assert set(comments) == keys, (
        f"{module.__name__}'s docstring example should document exactly the file's keys: "
        f"missing {sorted(keys - set(comments))}, unknown {sorted(set(comments) - keys)}"
    )
    assert all(comments.values()), [k for k, c in comments.items() if not c]
    assert parse(example) == defaults, f"{module.__name__}'s docstring example is not the defaults"
    reference = _section(README.read_text(), "## Configuration reference")
    documented = [line for line in _section(reference, heading).splitlines() if line.startswith("|")]
    expected = _key_rows(defaults, comments, skip)
    assert documented == expected, "README table should read:\n" + "\n".join(expected)


def test_the_agents_node_name_defaults_to_the_host_name(parsers: dict[str, argparse.ArgumentParser]) -> None:
    """The one default the table cannot print: it is the machine's."""
    (action,) = [a for a in parsers["agent"]._actions if a.dest == "node_name"]
    assert action.default == socket.gethostname()


def test_every_alert_links_to_its_runbook_section() -> None:
    text = README.read_text()
    runbooks = _section(text, "## Runbooks")
    anchors = _anchors(_section(runbooks, "### Alert runbooks"))
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    assert rules
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        assert url == f"{RUNBOOK_PREFIX}{slug(rule['alert'])}", rule["alert"]
        assert url.removeprefix(RUNBOOK_PREFIX) in anchors, f"{rule['alert']}: no README section {url}"
    # Each anchor is unique in the whole README, so the link cannot land on another heading.
    headings = [slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)]
    assert all(headings.count(slug(r["alert"])) == 1 for r in rules)


def test_every_condition_type_and_reason_has_a_runbook() -> None:
    runbooks = _section(_section(README.read_text(), "## Runbooks"), "### Condition runbooks")
    assert {c.value.lower() for c in ConditionType} <= _anchors(runbooks)
    for ctype in ConditionType:
        body = _section(runbooks, f"#### {ctype.value}")
        assert "What it means" in body and "What to do" in body, ctype.value
    missing = [r.value for r in Reason if f"`{r.value}`" not in runbooks]
    assert missing == []


# Policies that stage an operator's start-up: each must say how its gang is formed.
STAGED_POLICIES = ("dependsOn", "InOrder", "exclusive-topology", "WaitForWorkersReady", "LeaderReady")


def test_every_followed_owner_kind_and_staged_policy_is_in_both_grouping_tables() -> None:
    section = _section(README.read_text(), "### Pod groups derived from workloads")
    readme_table = "\n".join(line for line in section.splitlines() if line.startswith("| "))
    doc = grouping.__doc__ or ""
    doc_table = doc[doc.index("=====") : doc.rindex("=====")]
    # A CronJob's runs are grouped by their Job; a Pod is an owner only on the way up (LeaderWorkerSet).
    kinds = sorted(kind for _, kind in FOLLOWED_KINDS if kind not in ("Pod", "CronJob"))
    assert [k for k in kinds if k not in readme_table] == []
    assert [k for k in kinds if k not in doc_table] == []
    assert [p for p in STAGED_POLICIES if p not in readme_table] == []
    assert [p for p in STAGED_POLICIES if p not in doc_table] == []

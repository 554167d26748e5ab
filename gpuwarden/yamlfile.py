"""Reading a YAML document that a person wrote: one loader for every file gpuwarden reads.

The agent's config, the simulator's scenarios and the scheduler's snapshots
are all hand-edited, so a missing file and a syntax error must both name the
file and what kind of file it is, and must surface as the caller's own error
type (the CLI turns those into one clear line, not a traceback). Only
``yaml.safe_load``: these files never carry Python objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def parse_yaml(text: str, source: str, error: type[Exception]) -> Any:
    """The document in ``text``; a syntax error raises ``error`` naming ``source``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{source} is not valid YAML: {exc}") from exc


def load_yaml(path: str | Path, what: str, error: type[Exception]) -> Any:
    """The document in the file ``path``, a ``what`` ("config file", "snapshot", ...).

    An unreadable file or a syntax error raises ``error`` with the path and
    the reason, so every caller reports both the same way.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from exc
    return parse_yaml(text, f"{what} {p}", error)

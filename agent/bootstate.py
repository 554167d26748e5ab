"""Small state files that hold for one boot of the node.

Some of what the agent learns is true only until the node reboots: the most
GPUs seen since boot (a GPU that vanished must not become the new normal when
the agent restarts), or how far into the kernel log its previous run read (so
a restart does not announce the XIDs of last week again). Such state lives in
a JSON file under ``/run/gpuwarden`` (a host directory on tmpfs, emptied at
reboot) and carries the kernel's boot id as well, so a file that survived a
reboot anyway (another mount, a copied directory) is recognised as stale.

Reads and writes never raise: a missing, unreadable or foreign file means "no
state", and a failed write is logged. Losing this state costs accuracy after
a restart, never detection.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def current_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The running kernel's boot id ("" when it cannot be read).

    ``/proc/sys/kernel/random/boot_id`` is not namespaced: in a container it
    is the host's, which is what per-boot state needs.
    """
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


class BootState:
    """One JSON object in ``path``, valid while ``boot_id`` is the boot that wrote it."""

    def __init__(self, path: str | Path, boot_id: str) -> None:
        self.path = Path(path)
        self.boot_id = boot_id

    def load(self) -> dict[str, Any]:
        """What this boot saved; empty for another boot, no file or a bad one."""
        if not self.boot_id:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("state_file_unreadable", path=str(self.path), error=str(exc))
            return {}
        if not isinstance(data, dict) or data.get("boot_id") != self.boot_id:
            return {}  # another boot: the node may have been repaired since
        return data

    def save(self, values: dict[str, Any]) -> bool:
        """Replace the file atomically (write, then rename); False if that failed."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({**values, "boot_id": self.boot_id}))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("state_file_unwritable", path=str(self.path), error=exc.strerror or str(exc))
            return False
        return True

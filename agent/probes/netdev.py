"""Netdev probe: link operational state and ethtool speed through netlink.

Behind each HCA port sits a netdev (RoCE on Ethernet, IPoIB on InfiniBand).
Its operational state (``UP``, ``DOWN``, ``LOWERLAYERDOWN``, ...) and the
speed the driver reports through ethtool say whether traffic can actually
flow, which sysfs port state alone does not for RoCE. Both are read with
pyroute2: one ``RTM_GETLINK`` dump per poll and one ethtool link-mode query
per netdev.

Sockets are opened once and reused: a netlink socket per poll would cost more
than the whole poll budget. With ``netns`` the sockets are created inside that
network namespace (from a short-lived thread that enters it; namespaces are
per thread), and stay bound to it for their lifetime.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any

from agent.logconfig import get_logger

log = get_logger(__name__)

_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True, slots=True)
class NetdevState:
    oper_state: str | None
    speed_mbps: int | None


def _enter_netns(name: str) -> None:
    """Move the calling thread into network namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    path = name if name.startswith("/") else f"/run/netns/{name}"
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


class NetdevReader:
    """Reads operational state and ethtool speed of named netdevs."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self._ipr: Any = None
        self._ethtool: Any = None
        self._lock = threading.Lock()

    def _open(self) -> None:
        from pyroute2 import IPRoute  # noqa: PLC0415 - imported only when IB netdevs are read
        from pyroute2.ethtool import Ethtool  # noqa: PLC0415

        if self.netns is None:
            self._ipr = IPRoute()
            self._ethtool = Ethtool()
            return
        made: dict[str, Any] = {}
        failure: list[BaseException] = []

        def create() -> None:
            try:
                _enter_netns(self.netns or "")
                made["ipr"] = IPRoute()
                made["ethtool"] = Ethtool()
            except BaseException as exc:  # handed to the caller's thread
                failure.append(exc)

        t = threading.Thread(target=create, name="gpuwarden-netns-open")
        t.start()
        t.join()
        if failure:
            raise failure[0]
        self._ipr, self._ethtool = made["ipr"], made["ethtool"]

    def read(self, names: set[str]) -> dict[str, NetdevState]:
        """State of each netdev in ``names`` that exists; others are absent."""
        if not names:
            return {}
        with self._lock:
            if self._ipr is None:
                self._open()
            try:
                links = self._ipr.get_links()
            except Exception:
                self._close_locked()
                raise
            out: dict[str, NetdevState] = {}
            for link in links:
                name = link.get_attr("IFLA_IFNAME")
                if name not in names:
                    continue
                oper = link.get_attr("IFLA_OPERSTATE")
                out[name] = NetdevState(oper_state=oper, speed_mbps=self._speed(name))
            return out

    def _speed(self, name: str) -> int | None:
        try:
            mode = self._ethtool.get_link_mode(name)
        except Exception as exc:  # pyroute2 raises netlink, OS and its own errors alike
            log.debug("ethtool_speed_unavailable", netdev=name, error=str(exc))
            return None
        speed = mode.speed
        return int(speed) if isinstance(speed, int) and 0 < speed < 0xFFFF_FFFF else None

    def _close_locked(self) -> None:
        for sock in (self._ipr, self._ethtool):
            if sock is not None:
                try:
                    sock.close()
                except Exception as exc:
                    log.debug("netlink_close_failed", error=str(exc))
        self._ipr = self._ethtool = None

    def close(self) -> None:
        with self._lock:
            self._close_locked()

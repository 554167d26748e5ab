"""InfiniBand source: HCA ports from sysfs, their netdevs through netlink.

For every ``<sysfs_root>/class/infiniband/<dev>/ports/<n>/`` it reads
``state``, ``phys_state``, ``rate`` and ``link_layer`` and the error counters
``link_downed``, ``symbol_error``, ``link_error_recovery`` and
``port_rcv_errors``. The netdev behind a port is found under
``<dev>/device/net/`` (matched to the port by its ``dev_port``), and its
operational state and speed come from :mod:`agent.sources.netdev`.

A file that is missing means the HCA does not expose it (RoCE ports lack some
counters): the field is ``None``, not an error. A rate that is no rate (text
we cannot read, or ``inf``/``nan``, which ``float()`` happily accepts) is
``None`` too, and logged once per port: a non-finite rate would be exported
as a metric and compared with as if it were a speed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from agent.samples import IbCounters, IbPortSample
from agent.sources.base import IbSource
from agent.sources.netdev import NetdevReader
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

_COUNTERS = ("link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors")


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        log.warning("sysfs_read_failed", path=str(path), error=exc.strerror or str(exc))
        return None


def _named(text: str | None) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; unknown when absent."""
    if not text:
        return "UNKNOWN"
    _, sep, name = text.partition(":")
    return name.strip() if sep else text.strip()


def parse_rate_gbps(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0; ``"2.5 Gb/sec (1X SDR)"`` -> 2.5.

    ``None`` for anything that is not a finite, non-negative number.
    """
    if not text:
        return None
    head = text.split(None, 1)[0]
    try:
        rate = float(head)
    except ValueError:
        return None
    return rate if math.isfinite(rate) and rate >= 0 else None


def _counter(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        log.warning("sysfs_counter_unparsable", path=str(path), value=text[:50])
        return None


class SysfsIbSource(IbSource):
    """Reads every HCA port under ``<sysfs_root>/class/infiniband``."""

    def __init__(self, sysfs_root: str, netdevs: NetdevReader | None = None) -> None:
        self.root = Path(sysfs_root) / "class" / "infiniband"
        self._netdevs = netdevs
        self._netdev_map: dict[tuple[str, int], str] | None = None
        self._mapped_devices: list[str] = []
        # Ports whose unreadable rate was logged: once each, not every poll.
        self._bad_rate_logged: set[tuple[str, int]] = set()

    def _map_netdevs(self, devices: list[str]) -> dict[tuple[str, int], str]:
        """(device, port) -> netdev name, from ``device/net/*/dev_port``."""
        out: dict[tuple[str, int], str] = {}
        for dev in devices:
            net_dir = self.root / dev / "device" / "net"
            try:
                names = sorted(os.listdir(net_dir))
            except OSError:
                continue
            for name in names:
                dev_port = _counter(net_dir / name / "dev_port")
                port = (dev_port or 0) + 1
                out.setdefault((dev, port), name)
        return out

    def _rate(self, dev: str, port: int, pdir: Path) -> float | None:
        text = _read(pdir / "rate")
        rate = parse_rate_gbps(text)
        if rate is None and text and (dev, port) not in self._bad_rate_logged:
            self._bad_rate_logged.add((dev, port))
            log.warning(
                "ib_rate_unparsable", device=dev, port=port, value=text[:50], effect="rate unknown for this port"
            )
        return rate

    def read_ports(self) -> tuple[IbPortSample, ...]:
        try:
            devices = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return ()
        if self._netdev_map is None or devices != self._mapped_devices:
            # HCAs appear and go with driver reloads; remap their netdevs then.
            self._netdev_map = self._map_netdevs(devices)
            self._mapped_devices = devices
        raw: list[tuple[str, int, Path]] = []
        for dev in devices:
            ports_dir = self.root / dev / "ports"
            try:
                ports = sorted(int(p) for p in os.listdir(ports_dir) if p.isdigit())
            except OSError as exc:
                log.warning("ib_ports_unreadable", device=dev, error=exc.strerror or str(exc))
                continue
            raw.extend((dev, p, ports_dir / str(p)) for p in ports)

        netdev_state = {}
        if self._netdevs is not None:
            wanted = {n for (d, p), n in self._netdev_map.items()}
            try:
                netdev_state = self._netdevs.read(wanted)
            except Exception as exc:  # pyroute2 raises OSError, NetlinkError and its own errors
                log.warning("netdev_read_failed", error=str(exc), effect="ports reported without netdev state")

        samples: list[IbPortSample] = []
        for dev, port, pdir in raw:
            counters = IbCounters(**{c: _counter(pdir / "counters" / c) for c in _COUNTERS})
            netdev = self._netdev_map.get((dev, port))
            nd = netdev_state.get(netdev) if netdev else None
            samples.append(
                IbPortSample(
                    device=dev,
                    port=port,
                    state=_named(_read(pdir / "state")),
                    phys_state=_named(_read(pdir / "phys_state")),
                    rate_gbps=self._rate(dev, port, pdir),
                    link_layer=_read(pdir / "link_layer") or "InfiniBand",
                    counters=counters,
                    netdev=netdev,
                    netdev_oper_state=nd.oper_state if nd else None,
                    netdev_speed_mbps=nd.speed_mbps if nd else None,
                    netdev_admin_up=nd.admin_up if nd else None,
                )
            )
        return tuple(samples)

    def close(self) -> None:
        if self._netdevs is not None:
            self._netdevs.close()

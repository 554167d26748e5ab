"""CPU per poll and resident memory of the agent, printed side by side with baselines.

What it measures (8 GPUs and 8 InfiniBand ports throughout):

1. CPU time of one full poll (probes + rules + report) with the ``sim``
   backend, next to the baseline of a poll of an empty node (the loop's fixed
   cost), in this process.
2. The same with the NVML backend on the pynvml stand-in, the InfiniBand probe
   reading a sysfs tree of 8 HCAs, and netlink for their netdevs. The netdevs
   are real: run as root, the benchmark creates a network namespace holding 8
   veth pairs named as the tree names them, and polls from inside it, so each
   poll pays for the link dump and one ethtool query per netdev as on a node.
   Without root it says that netdev queries were not measured.
3. Resident memory of a full agent process (the kubernetes client and
   prometheus_client imported, as the published agent has them) after 100 and
   after 1,000 polls, next to the baseline of the same process before the
   agent was built. Polls advance a simulated clock by the default 10 s
   interval so rate windows hold what they would in production.

Targets: under 20 ms CPU per poll; under 100 MB resident; no growth between
poll 100 and poll 1,000.

Run: ``.venv/bin/python benchmarks/agent_poll.py`` (``make bench``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config import AgentConfig, config_from_dict  # noqa: E402
from agent.monitor import Monitor  # noqa: E402
from agent.sim.node import SimNode  # noqa: E402
from agent.sim.scenario import Scenario, SimGpus, SimInfiniband, load_scenario  # noqa: E402
from agent.sources.base import NodeHardware  # noqa: E402
from agent.sources.infiniband import SysfsIbSource  # noqa: E402
from agent.sources.netdev import NetdevReader  # noqa: E402
from agent.sources.nvml import NvmlBackend  # noqa: E402
from agent.sources.storage import StatvfsMountSource  # noqa: E402
from gpuwarden.logconfig import configure_logging  # noqa: E402

POLLS = 300
HCAS = 8
_CLONE_NEWNET = 0x40000000


class SteppingClock:
    """Wall clock for the monitor that advances one poll interval per call."""

    def __init__(self, step_s: float = 10.0) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        self.step = timedelta(seconds=step_s)

    def __call__(self) -> datetime:
        self.now += self.step
        return self.now


def cpu_per_poll(monitor: Monitor, polls: int = POLLS) -> tuple[float, float]:
    """(median, p95) CPU milliseconds of one poll."""
    monitor.step()  # first poll opens NVML, reads the kernel-log backlog
    times = []
    for _ in range(polls):
        t0 = time.process_time()
        monitor.step()
        times.append((time.process_time() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1]


def sim_monitor(scenario: Scenario) -> Monitor:
    return Monitor(AgentConfig(), SimNode(scenario).hardware(), "bench", clock=SteppingClock())


def sysfs_tree(root: Path, hcas: int) -> None:
    for h in range(hcas):
        dev = root / "class" / "infiniband" / f"mlx5_{h}"
        port = dev / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
        (port / "link_layer").write_text("InfiniBand\n")
        for c in ("link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors"):
            (port / "counters" / c).write_text("0\n")
        net = dev / "device" / "net" / f"ibbench{h}"
        net.mkdir(parents=True)
        (net / "dev_port").write_text("0\n")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def veth_namespace(pairs: int) -> Iterator[tuple[str | None, str]]:
    """A network namespace holding ``pairs`` veth pairs ``ibbench<i>`` <->
    ``ibbenchp<i>``, all up, removed on the way out (also on error); yields
    its name, or ``None`` and why there is none."""
    if os.geteuid() != 0:
        yield None, "not run as root"
        return
    if shutil.which("ip") is None:
        yield None, "the ip command is missing"
        return
    name = f"gwbench-{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.SubprocessError) as exc:
        yield None, f"creating a network namespace failed: {exc}"
        return
    try:
        try:
            for i in range(pairs):
                _ip("-n", name, "link", "add", f"ibbench{i}", "type", "veth", "peer", "name", f"ibbenchp{i}")
                _ip("-n", name, "link", "set", f"ibbench{i}", "up")
                _ip("-n", name, "link", "set", f"ibbenchp{i}", "up")
        except (OSError, subprocess.SubprocessError) as exc:
            yield None, f"creating veth pairs failed: {exc}"
        else:
            yield name, ""
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=30)


@contextlib.contextmanager
def inside_netns(name: str | None) -> Iterator[None]:
    """Run the calling thread in network namespace ``name`` (nothing when
    ``None``), and back in its own afterwards. The probe then opens its
    netlink sockets there itself, as the agent does in the host's namespace,
    with no hop through a namespace thread that a node would not pay for."""
    if name is None:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(target, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
        try:
            yield
        finally:
            if libc.setns(own, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back to the own namespace: {os.strerror(err)}")
    finally:
        os.close(target)
        os.close(own)


def nvml_monitor(sysfs_root: Path) -> Monitor:
    from tests.agent.fake_pynvml import h100_node

    hardware = NodeHardware(
        gpu=NvmlBackend(h100_node(8)),
        kmsg=None,
        ib=SysfsIbSource(str(sysfs_root), NetdevReader()),
        mounts=StatvfsMountSource([], interval_s=10),
    )
    return Monitor(AgentConfig(), hardware, "bench", clock=SteppingClock())


def measure(name: str, build: Callable[[], Monitor], check: Callable[[Monitor], None] | None = None) -> float:
    """Median CPU ms of a poll of the monitor ``build`` makes, printed with
    the p95; ``check`` looks at the last sample before the monitor closes."""
    monitor = build()
    try:
        median, p95 = cpu_per_poll(monitor)
        if check is not None:
            check(monitor)
    finally:
        monitor.close()
    print(f"  {name:<66} {median:7.2f} ms median  {p95:7.2f} ms p95")
    return median


def netdevs_read(monitor: Monitor) -> str:
    """What the last poll read of the ports' netdevs, for the printout."""
    sample = monitor.last_sample
    ports = sample.ib_ports if sample is not None else ()
    speeds_by_port = [p.netdev_speed_mbps for p in ports if p.netdev_oper_state == "UP"]
    up = [speed for speed in speeds_by_port if speed is not None]
    speeds = sorted(set(up))
    speed = ", ".join(map(str, speeds)) or "-"
    return f"{len(up)} of {len(ports)} netdevs read: UP (netlink link dump), {speed} Mb/s (ethtool)"


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def rss_child() -> None:
    """Runs in a fresh process: a full agent's imports, then 1,000 polls."""
    import kubernetes.client  # noqa: F401  - the published agent imports it
    import prometheus_client  # noqa: F401

    configure_logging("json", "error")
    baseline = rss_kib()
    node = SimNode(load_scenario("default"))
    monitor = Monitor(config_from_dict(None), node.hardware(), "bench", clock=SteppingClock())
    marks: dict[int, int] = {}
    for i in range(1, 1001):
        if i % 50 == 0:
            node.inject("xid", gpu=i % 8, xid=13)  # events flow the whole time
            node.inject("nvlink_errors", gpu=i % 8, link=i % 18, count=3)
        monitor.step()
        if i in (100, 1000):
            marks[i] = rss_kib()
    monitor.close()
    print(json.dumps({"baseline": baseline, "poll_100": marks[100], "poll_1000": marks[1000]}))


def main() -> int:
    if "--rss-child" in sys.argv:
        rss_child()
        return 0
    configure_logging("json", "error")
    print("gpuwarden agent poll benchmark (8 GPUs, 8 InfiniBand ports)")
    print("CPU per poll:")
    empty = Scenario(name="empty", gpus=SimGpus(count=0), infiniband=SimInfiniband(hcas=0))
    measure("baseline: sim, empty node (fixed cost of a poll)", lambda: sim_monitor(empty))
    sim_median = measure("sim backend, default scenario", lambda: sim_monitor(load_scenario("default")))
    read: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, veth_namespace(HCAS) as (netns, why_not):
        sysfs_tree(Path(tmp), HCAS)
        label = f"nvml on the pynvml stand-in + sysfs + netlink ({HCAS if netns else 0} veth netdevs)"
        with inside_netns(netns):
            nvml_median = measure(label, lambda: nvml_monitor(Path(tmp)), lambda m: read.append(netdevs_read(m)))
    if netns is not None:
        print(f"    {read[0]}")
    else:
        print(
            f"    netdev queries were NOT measured ({why_not}): the tree's netdevs do not exist here, so each "
            "poll made the netlink link dump but no ethtool query; run as root to create them in a namespace"
        )
    verdict = {True: "met", False: "MISSED"}
    print(f"  target < 20 ms: sim {verdict[sim_median < 20]}, nvml {verdict[nvml_median < 20]}")

    proc = subprocess.run(
        [sys.executable, __file__, "--rss-child"], capture_output=True, text=True, timeout=600, cwd=ROOT, check=False
    )
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    rss = json.loads(proc.stdout.strip().splitlines()[-1])
    mib = {k: v / 1024 for k, v in rss.items()}
    growth = mib["poll_1000"] - mib["poll_100"]
    print("Resident memory of a full agent process (sim backend, kubernetes + prometheus_client imported):")
    print(f"  baseline: imports only, before the agent is built      {mib['baseline']:7.1f} MiB")
    print(f"  after 100 polls                                        {mib['poll_100']:7.1f} MiB")
    print(f"  after 1,000 polls                                      {mib['poll_1000']:7.1f} MiB")
    print(f"  growth from poll 100 to poll 1,000                     {growth:+7.1f} MiB")
    print(
        f"  target < 100 MB resident: {'met' if rss['poll_1000'] * 1024 < 100_000_000 else 'MISSED'}; "
        f"no growth: {'met' if growth < 0.5 else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

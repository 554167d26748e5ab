"""Finding the control-plane binaries and running them as processes that never outlive their owner.

The owner is a test session, a benchmark or ``gpuwarden demo``. Each server
runs in its own process group, logs to a file and is listed in its run
folder's ``pids`` file, so a later run can stop what a killed run left behind
without touching anything else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# The folder that holds the gpuwarden package: the repository root in a
# checkout, where kubectl runs so that paths such as ``manifests/`` resolve.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
# The releases `make controlplane` (tests/controlplane/build.sh) builds; that
# script reads this same file, so the builder and the finder never disagree.
VERSIONS_FILE = Path(__file__).resolve().parent / "versions.env"
# How long `make controlplane` takes the first time (it compiles Kubernetes
# from its Go modules); said wherever the binaries are found missing.
FIRST_BUILD_HINT = "about 11 minutes the first time on two cores, then cached"

# Temporary folders are named after the process that owns them (pytest, a
# benchmark, the demo), so a later run can tell a crashed run's leftovers
# from a live run's files.
RUN_DIR_PREFIX = "gpuwarden-controlplane-"

STOP_TIMEOUT_S = 10.0


class ControlPlaneError(RuntimeError):
    """The control plane could not be found, started or stopped."""


# ---------------------------------------------------------------------------
# Binaries
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Binaries:
    """Paths of the control-plane executables."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path


def _read_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    for raw in VERSIONS_FILE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip()
    return versions


def cache_dir() -> Path:
    """Where ``make controlplane`` puts the binaries (the Makefile's default)."""
    configured = os.environ.get("GPUWARDEN_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "gpuwarden"


def find_binaries() -> Binaries:
    """Locate the binaries: environment overrides first, then the build cache.

    Raises :class:`ControlPlaneError` naming every missing binary and the fix,
    because a run without them can neither test nor show anything that matters.
    """
    versions = _read_versions()
    k8s = os.environ.get("GPUWARDEN_K8S_VERSION") or versions["K8S_VERSION"]
    etcd = os.environ.get("GPUWARDEN_ETCD_VERSION") or versions["ETCD_VERSION"]
    cache = cache_dir()
    wanted = {
        "etcd": ("ETCD", cache / f"etcd-{etcd}" / "etcd"),
        "kube_apiserver": ("KUBE_APISERVER", cache / f"kubernetes-{k8s}" / "kube-apiserver"),
        "kube_controller_manager": (
            "KUBE_CONTROLLER_MANAGER",
            cache / f"kubernetes-{k8s}" / "kube-controller-manager",
        ),
        "kubectl": ("KUBECTL", cache / f"kubernetes-{k8s}" / "kubectl"),
    }
    found: dict[str, Path] = {}
    missing: list[str] = []
    for attr, (env, default) in wanted.items():
        override = os.environ.get(env)
        path = Path(override) if override else default
        if path.is_file() and os.access(path, os.X_OK):
            found[attr] = path
        elif override:
            missing.append(f"{env}={override} is not an executable file")
        else:
            missing.append(f"{path} is missing")
    if missing:
        raise ControlPlaneError(
            "the local control plane binaries are not built: "
            + "; ".join(missing)
            + f". Run `make controlplane` ({FIRST_BUILD_HINT}), or point ETCD, KUBE_APISERVER,"
            " KUBE_CONTROLLER_MANAGER and KUBECTL at existing binaries."
        )
    return Binaries(**found)


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """Make the child die with its owner process, via util-linux's ``setpriv``.

    atexit handlers and fixture finalizers do not run when the owner is killed
    (SIGKILL, an OOM kill, a CI timeout); the kernel's parent-death signal
    still stops etcd and the API server then, instead of leaving them to hold
    ports and CPU. ``setpriv`` sets it and execs the server, so no Python runs
    between fork and exec (a ``preexec_fn`` is unsafe once threads exist).
    Without ``setpriv``, :func:`reap_leftovers` cleans up on the next run.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, which usually say why a server failed."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ManagedProcess:
    """One control-plane process in its own process group, logging to a file."""

    name: str
    argv: list[str]
    log_path: Path
    pid_file: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                _with_parent_death_signal(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with self.pid_file.open("a") as pids:
            pids.write(f"{self.popen.pid}\n")

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it if it does not exit in time."""
        proc = self.popen
        if proc is None:
            return
        if proc.poll() is None:
            signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)
        # Anything it started is in the same group and goes with it.
        signal_group(proc.pid, signal.SIGKILL)
        self.popen = None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_leftovers(tmp_root: Path | None = None) -> list[Path]:
    """Stop the processes and remove the folders of control planes whose owner died.

    A run folder is named ``gpuwarden-controlplane-<owner pid>-...`` and lists
    its children's pids; a child is only killed when its command line still
    names that folder, so a recycled pid is never touched.
    """
    root = tmp_root or Path(tempfile.gettempdir())
    reaped: list[Path] = []
    for run_dir in root.glob(f"{RUN_DIR_PREFIX}*"):
        owner = run_dir.name.removeprefix(RUN_DIR_PREFIX).split("-", 1)[0]
        if not owner.isdigit() or _pid_alive(int(owner)):
            continue
        pid_file = run_dir / "pids"
        pids = pid_file.read_text().split() if pid_file.exists() else []
        for pid in (int(p) for p in pids if p.isdigit()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(run_dir).encode() in cmdline:
                signal_group(pid, signal.SIGKILL)
        shutil.rmtree(run_dir, ignore_errors=True)
        reaped.append(run_dir)
    return reaped


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that are free right now.

    All sockets stay bound until every port is chosen, so the ports differ;
    the window before the servers bind them is covered by a retry in
    :meth:`ControlPlane.start`.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()

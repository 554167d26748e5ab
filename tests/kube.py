"""A real Kubernetes control plane for gpuwarden's tests, and helpers to use it.

gpuwarden talks to Kubernetes through status patches, subresources (binding,
eviction), RBAC, ownerReferences and admission-defaulted fields; a fake API
would agree with whatever the code assumes. So tests run against real etcd,
kube-apiserver and kube-controller-manager (garbage collector and namespace
controllers only) started on loopback ports, built by ``make controlplane``.

Nodes here have no kubelet: :func:`create_gpu_node` writes the status a
kubelet would, :func:`mark_pod_running` and :func:`complete_pod_deletion` do
the kubelet's part of a pod's life.

Environment: ``GPUWARDEN_CACHE`` (where ``make controlplane`` put the
binaries), ``ETCD``, ``KUBE_APISERVER``, ``KUBE_CONTROLLER_MANAGER`` and
``KUBECTL`` (existing binaries instead), ``GPUWARDEN_KEEP_CONTROLPLANE=1``
(keep the run folder with the servers' logs after the session, until the
next run reaps it).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime as dt
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client
from kubernetes.client import rest
from urllib3 import HTTPHeaderDict

from gpuwarden import contract

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parent.parent
VERSIONS_FILE = REPO_ROOT / "tests" / "controlplane" / "versions.env"

# Temporary folders are named after the pytest process that owns them, so a
# later run can tell a crashed run's leftovers from a live run's files.
RUN_DIR_PREFIX = "gpuwarden-controlplane-"

# The API server is usually ready in a few seconds; the generous limit is for
# a 2-core machine that is also compiling or running other tests.
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
KUBECTL_TIMEOUT_S = 60.0

# Kubernetes' own names, used the way a kubelet and the API server use them.
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
ADMIN_GROUP = "system:masters"
SA_GROUP = "system:serviceaccounts"
AUTHENTICATED_GROUP = "system:authenticated"


class ControlPlaneError(RuntimeError):
    """The control plane could not be found, started or stopped."""


class KubectlError(subprocess.CalledProcessError):
    """A kubectl command failed; its message carries kubectl's stderr."""

    def __str__(self) -> str:
        stderr = (self.stderr or "").strip()
        return f"{super().__str__()}\nstderr:\n{stderr}" if stderr else super().__str__()


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
    because a test run without them cannot test anything that matters.
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
            "the test control plane binaries are not built: "
            + "; ".join(missing)
            + ". Run `make controlplane` (or point ETCD, KUBE_APISERVER, KUBE_CONTROLLER_MANAGER"
            " and KUBECTL at existing binaries)."
        )
    return Binaries(**found)


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """Make the child die with the test process, via util-linux's ``setpriv``.

    atexit handlers and fixture finalizers do not run when pytest is killed
    (SIGKILL, an OOM kill, a CI timeout); the kernel's parent-death signal
    still stops etcd and the API server then, instead of leaving them to hold
    ports and CPU. ``setpriv`` sets it and execs the server, so no Python runs
    between fork and exec (a ``preexec_fn`` is unsafe once threads exist).
    Without ``setpriv``, :func:`reap_leftovers` cleans up on the next run.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


@dataclass
class _Process:
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
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)
        # Anything it started is in the same group and goes with it.
        _signal_group(proc.pid, signal.SIGKILL)
        self.popen = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _signal_group(pgid: int, sig: signal.Signals) -> None:
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
    """Stop the processes and remove the folders of control planes whose pytest died.

    A run folder is named ``gpuwarden-controlplane-<pytest pid>-...`` and lists
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
                _signal_group(pid, signal.SIGKILL)
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


# ---------------------------------------------------------------------------
# Certificates and credentials
# ---------------------------------------------------------------------------


def _write_pem(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def generate_pki(directory: Path) -> dict[str, Path]:
    """A CA, an API-server serving certificate it signs, and a service-account key pair.

    EC P-256 keys: generated in microseconds, which keeps fixture start-up
    fast, and accepted by kube-apiserver for both purposes.
    """
    now = dt.datetime.now(dt.UTC)
    not_before = now - dt.timedelta(hours=1)
    not_after = now + dt.timedelta(days=7)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuwarden-test-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes"),
                    x509.DNSName("kubernetes.default"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = ec.generate_private_key(ec.SECP256R1())
    paths = {
        "ca_cert": directory / "ca.crt",
        "serving_cert": directory / "apiserver.crt",
        "serving_key": directory / "apiserver.key",
        "sa_key": directory / "sa.key",
        "sa_pub": directory / "sa.pub",
    }
    _write_pem(paths["ca_cert"], ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_pem(paths["serving_cert"], serving_cert.public_bytes(serialization.Encoding.PEM))
    _write_pem(paths["serving_key"], _key_pem(serving_key))
    _write_pem(paths["sa_key"], _key_pem(sa_key))
    _write_pem(
        paths["sa_pub"],
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    )
    return paths


# ---------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------


class _ImpersonatingRESTClient(rest.RESTClientObject):
    """Adds Kubernetes impersonation headers to every request.

    The generated client keeps headers in a plain dict, which cannot hold the
    repeated ``Impersonate-Group`` header the API server expects (one header
    per group; a comma-joined value would be a single group name). urllib3's
    HTTPHeaderDict can, and urllib3 sends each value as its own header line.
    """

    def __init__(self, configuration: client.Configuration, user: str, groups: Sequence[str]) -> None:
        super().__init__(configuration)
        self._user = user
        self._groups = list(groups)

    def request(self, method: str, url: str, headers: Mapping[str, str] | None = None, *args: Any, **kw: Any) -> Any:
        merged = HTTPHeaderDict(dict(headers or {}))
        merged["Impersonate-User"] = self._user
        for group in self._groups:
            merged.add("Impersonate-Group", group)
        return super().request(method, url, merged, *args, **kw)  # type: ignore[no-untyped-call]


def service_account_identity(service_account: str, namespace: str) -> tuple[str, list[str]]:
    """The user name and groups the API server gives a ServiceAccount's token."""
    user = f"system:serviceaccount:{namespace}:{service_account}"
    return user, [SA_GROUP, f"{SA_GROUP}:{namespace}", AUTHENTICATED_GROUP]


# ---------------------------------------------------------------------------
# The control plane
# ---------------------------------------------------------------------------


@dataclass
class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager on loopback ports.

    One instance serves a whole pytest session; tests keep out of each other's
    way with :func:`unique_name`. :meth:`stop_apiserver` and
    :meth:`start_apiserver` simulate an API-server outage: the server comes
    back on the same port with the same etcd data, as after a restart.
    """

    binaries: Binaries
    run_dir: Path
    server: str = ""
    kubeconfig: Path = field(init=False)
    admin_token: str = field(default_factory=lambda: secrets.token_hex(24))
    ca_file: Path = field(init=False)
    etcd_url: str = ""
    startup_seconds: float = 0.0
    _etcd: _Process | None = None
    _apiserver: _Process | None = None
    _controller_manager: _Process | None = None
    _paths: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.ca_file = self.run_dir / "pki" / "ca.crt"

    # -- life cycle -------------------------------------------------------

    @classmethod
    def start(cls, binaries: Binaries | None = None, *, attempts: int = 3) -> ControlPlane:
        """Start a control plane and wait until the API server is ready.

        Ports are chosen free but may be taken by someone else before the
        servers bind them; a start that fails that way is retried on new ports.
        """
        binaries = binaries or find_binaries()
        reap_leftovers()
        last_error: ControlPlaneError | None = None
        for _ in range(attempts):
            run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-"))
            plane = cls(binaries=binaries, run_dir=run_dir)
            try:
                plane._start()
            except ControlPlaneError as err:
                plane.stop()
                last_error = err
                if "address already in use" not in str(err):
                    raise
                continue
            except BaseException:
                plane.stop()
                raise
            return plane
        assert last_error is not None
        raise last_error

    def _start(self) -> None:
        began = time.monotonic()
        atexit.register(self.stop)
        (self.run_dir / "pki").mkdir()
        (self.run_dir / "logs").mkdir()
        self._paths = generate_pki(self.run_dir / "pki")
        etcd_port, etcd_peer_port, api_port = free_ports(3)
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        self.server = f"https://127.0.0.1:{api_port}"
        token_file = self.run_dir / "tokens.csv"
        token_file.write_text(f'{self.admin_token},admin,admin-uid,"{ADMIN_GROUP}"\n')
        token_file.chmod(0o600)
        self._write_kubeconfig()

        peer_url = f"http://127.0.0.1:{etcd_peer_port}"
        self._etcd = self._process(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=gpuwarden-test",
                f"--data-dir={self.run_dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=gpuwarden-test={peer_url}",
                # Test data need not survive a power cut; fsync would make
                # every write wait on a disk shared with other test runs.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._etcd.start()
        # kube-apiserver retries etcd itself, so both start at once.
        self._apiserver = self._process("kube-apiserver", self._apiserver_args(api_port, token_file))
        self._apiserver.start()
        self._wait_ready()
        self._controller_manager = self._process(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                # Only what makes ownerReferences and namespace deletion behave
                # as in a cluster. No node-lifecycle controller: fake nodes
                # have no kubelet and would be tainted and evicted.
                "--controllers=garbagecollector,namespace",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )
        self._controller_manager.start()
        self.startup_seconds = time.monotonic() - began

    def _apiserver_args(self, port: int, token_file: Path) -> list[str]:
        p = self._paths
        return [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.run_dir / 'pki'}",
            f"--tls-cert-file={p['serving_cert']}",
            f"--tls-private-key-file={p['serving_key']}",
            f"--client-ca-file={p['ca_cert']}",
            f"--token-auth-file={token_file}",
            "--authorization-mode=RBAC",
            # No ServiceAccount admission: it would reject pods until a token
            # controller creates each namespace's default ServiceAccount.
            "--disable-admission-plugins=ServiceAccount",
            # No kubelets and no real Service network: nothing should write
            # the kubernetes Service's endpoints.
            "--endpoint-reconciler-type=none",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p['sa_pub']}",
            f"--service-account-signing-key-file={p['sa_key']}",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ]

    def _process(self, name: str, argv: list[str]) -> _Process:
        return _Process(
            name=name, argv=argv, log_path=self.run_dir / "logs" / f"{name}.log", pid_file=self.run_dir / "pids"
        )

    def _write_kubeconfig(self) -> None:
        ca_data = base64.b64encode(self._paths["ca_cert"].read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "gpuwarden-test", "cluster": {"server": self.server, "certificate-authority-data": ca_data}}
            ],
            "users": [{"name": "admin", "user": {"token": self.admin_token}}],
            "contexts": [{"name": "admin", "context": {"cluster": "gpuwarden-test", "user": "admin"}}],
            "current-context": "admin",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _wait_ready(self) -> None:
        """Poll ``/readyz`` until it answers ok; fail early if a process exits."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = "no answer yet"
        while time.monotonic() < deadline:
            for proc in (self._etcd, self._apiserver):
                if proc is not None and not proc.running():
                    raise ControlPlaneError(f"{proc.name} exited during start-up; its log ends:\n{proc.log_tail()}")
            try:
                with urllib.request.urlopen(request, context=ctx, timeout=2) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}: {err.read(500).decode(errors='replace')}"
            except (OSError, ssl.SSLError) as err:
                last = str(err)
            time.sleep(0.1)
        assert self._apiserver is not None
        raise ControlPlaneError(
            f"kube-apiserver not ready within {READY_TIMEOUT_S:.0f}s (last: {last}); its log ends:\n"
            f"{self._apiserver.log_tail()}"
        )

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only; etcd and its data stay."""
        if self._apiserver is not None:
            self._apiserver.stop()

    def start_apiserver(self) -> None:
        """Start kube-apiserver again on the same port and etcd data; wait until ready.

        Call it from the test's own thread: the parent-death signal ties the
        server to the thread that started it.
        """
        if self._apiserver is None:
            raise ControlPlaneError("the control plane was never started")
        if not self._apiserver.running():
            self._apiserver.start()
        self._wait_ready()

    def apiserver_running(self) -> bool:
        return self._apiserver is not None and self._apiserver.running()

    def stop(self) -> None:
        """Stop every process (controller manager first) and remove the run folder.

        Safe to call twice, from a finalizer and from atexit.
        """
        for proc in (self._controller_manager, self._apiserver, self._etcd):
            if proc is not None:
                proc.stop()
        atexit.unregister(self.stop)
        if os.environ.get("GPUWARDEN_KEEP_CONTROLPLANE"):
            return
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def logs(self, component: str, lines: int = 40) -> str:
        """The end of one component's log (``etcd``, ``kube-apiserver``, ``kube-controller-manager``)."""
        return _Process(
            name=component,
            argv=[],
            log_path=self.run_dir / "logs" / f"{component}.log",
            pid_file=self.run_dir / "pids",
        ).log_tail(lines)

    # -- clients ----------------------------------------------------------

    def configuration(self) -> client.Configuration:
        """A client configuration for the admin user (group system:masters)."""
        config = client.Configuration()
        config.host = self.server
        config.ssl_ca_cert = str(self.ca_file)
        config.verify_ssl = True
        config.api_key = {"authorization": self.admin_token}
        config.api_key_prefix = {"authorization": "Bearer"}
        return config

    def api_client(self) -> client.ApiClient:
        """A new admin client; the caller closes it."""
        return client.ApiClient(self.configuration())

    def impersonate(self, service_account: str, namespace: str) -> client.ApiClient:
        """A client that acts as ``namespace/service_account``, as its token would.

        The admin impersonates the ServiceAccount's user name with its groups,
        so RBAC decides exactly as it would for the pod's own credentials;
        the ServiceAccount object need not exist.
        """
        user, groups = service_account_identity(service_account, namespace)
        api = client.ApiClient(self.configuration())
        api.rest_client = _ImpersonatingRESTClient(api.configuration, user, groups)
        return api

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = KUBECTL_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl with the admin kubeconfig; raise :class:`KubectlError` on failure when ``check``.

        Runs in the repository root, so ``kubectl("apply", "-k", "manifests/")``
        means the same wherever pytest was started.
        """
        argv = [
            str(self.binaries.kubectl),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.run_dir / 'kubectl-cache'}",
            *args,
        ]
        result = subprocess.run(  # noqa: PLW1510 - checked below, with stderr in the error
            argv, input=input, text=True, capture_output=True, timeout=timeout, cwd=REPO_ROOT
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result


# ---------------------------------------------------------------------------
# Test helpers
# ---------------------------------------------------------------------------


def unique_name(prefix: str) -> str:
    """A DNS-1123 name that no other test uses, e.g. ``gpu-node-3f9a1c``."""
    base = "".join(c if c.isalnum() else "-" for c in prefix.lower()).strip("-")[:50] or "x"
    return f"{base}-{secrets.token_hex(3)}"


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    *,
    description: str | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Exceptions of the types in ``ignore`` (e.g. ``ApiException`` while an
    object does not exist yet) count as a falsy answer; others propagate.
    On timeout, raises ``TimeoutError`` naming the condition and the last
    value or exception seen, which is usually the whole diagnosis.
    """
    what = description or getattr(predicate, "__qualname__", repr(predicate))
    deadline = time.monotonic() + timeout
    last: str = "never evaluated"
    while True:
        try:
            value = predicate()
        except ignore as err:
            last = f"raised {type(err).__name__}: {err}"
        else:
            if value:
                return value
            last = f"returned {value!r}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not true within {timeout}s; last call {last}")
        time.sleep(interval)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _kubelet_conditions() -> list[dict[str, str]]:
    """The conditions a healthy kubelet reports, with its reasons and messages."""
    now = _now()
    rows = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    return [
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for kind, status, reason, message in rows
    ]


def create_gpu_node(
    api: client.ApiClient,
    name: str,
    *,
    gpus: int = 8,
    gpu_memory_mib: int | None = None,
    labels: dict[str, str] | None = None,
) -> client.V1Node:
    """Create a Ready GPU Node the way a kubelet and NVIDIA's device plugin would.

    ``gpu_memory_mib`` is the node's total ``gpuwarden.io/gpu-memory``
    (capacity and allocatable), written only when given, as the agent would.
    The API server's admission taints every new node ``not-ready``; a kubelet
    reporting Ready makes the node-lifecycle controller lift it, and that
    controller does not run here, so the helper lifts it.
    """
    core = client.CoreV1Api(api)
    all_labels = {LABEL_HOSTNAME: name, LABEL_OS: "linux", LABEL_ARCH: "amd64", **(labels or {})}
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=all_labels)))

    resources = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        contract.RESOURCE_NVIDIA_GPU: str(gpus),
    }
    if gpu_memory_mib is not None:
        resources[contract.RESOURCE_GPU_MEMORY] = str(gpu_memory_mib)
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": _kubelet_conditions(),
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "gpuwarden test node",
                "kernelVersion": "6.1.0",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "containerd://2.0.0",
                "machineID": secrets.token_hex(16),
                "systemUUID": secrets.token_hex(16),
                "bootID": secrets.token_hex(16),
            },
        }
    }
    core.patch_node_status(name, status)

    node = core.read_node(name)
    current = node.spec.taints if node.spec is not None and node.spec.taints else []
    taints = [
        {k: v for k, v in api.sanitize_for_serialization(t).items() if v is not None}  # type: ignore[no-untyped-call]
        for t in current
        if t.key != TAINT_NOT_READY
    ]
    if len(taints) != len(current):
        core.patch_node(name, {"spec": {"taints": taints or None}})
    return core.read_node(name)


def mark_pod_running(api: client.ApiClient, name: str, namespace: str, *, ready: bool = True) -> client.V1Pod:
    """Write a pod's status as the kubelet does once its containers run."""
    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    now = _now()
    ready_s = "True" if ready else "False"
    conditions = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": ready_s, "lastTransitionTime": now},
        {"type": "Ready", "status": ready_s, "lastTransitionTime": now},
    ]
    containers = [
        {
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "ready": ready,
            "restartCount": 0,
            "started": True,
            "state": {"running": {"startedAt": now}},
        }
        for c in (pod.spec.containers if pod.spec is not None else [])
    ]
    body = {
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "containerStatuses": containers,
            "startTime": now,
            "podIP": "10.1.0.1",
            "hostIP": "10.0.0.1",
        }
    }
    return core.patch_namespaced_pod_status(name, namespace, body)


def complete_pod_deletion(api: client.ApiClient, name: str, namespace: str) -> None:
    """Finish a graceful pod deletion as the kubelet does after stopping the containers.

    A pod bound to a node only gets a deletionTimestamp when deleted or
    evicted; the kubelet removes it for good with grace period 0. Fake nodes
    have no kubelet, so tests that need the pod gone call this.
    """
    core = client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def simple_pod(name: str, *, labels: dict[str, str] | None = None, node_name: str | None = None) -> client.V1Pod:
    """A one-container pod object (not created) for tests that need any pod."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            node_name=node_name,
            containers=[client.V1Container(name="main", image="registry.invalid/gpuwarden-test:1")],
        ),
    )


@contextlib.contextmanager
def temporary_namespace(api: client.ApiClient, prefix: str = "test") -> Iterator[str]:
    """Create a uniquely named namespace and delete it afterwards (not waiting)."""
    core = client.CoreV1Api(api)
    name = unique_name(prefix)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)

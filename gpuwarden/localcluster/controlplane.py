"""etcd, kube-apiserver and kube-controller-manager started together on loopback ports.

gpuwarden talks to Kubernetes through status patches, subresources (binding,
eviction), RBAC, ownerReferences and admission-defaulted fields; a fake API
would agree with whatever the code assumes. So tests, benchmarks and
``gpuwarden demo`` run against the real servers, with only the controllers
whose behaviour the code relies on (garbage collector and namespace
controllers by default; the demo adds the Job controller, so its batch Jobs
get their pods as in a cluster).

It lives in the product, not in ``tests/``, because the demo needs it too;
``tests.harness`` re-exports it for the tests.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client

from gpuwarden.localcluster.certificates import generate_pki
from gpuwarden.localcluster.impersonation import impersonating_client
from gpuwarden.localcluster.processes import (
    RUN_DIR_PREFIX,
    SOURCE_ROOT,
    Binaries,
    ControlPlaneError,
    ManagedProcess,
    find_binaries,
    free_ports,
    log_tail,
    reap_leftovers,
)

# The API server is usually ready in a few seconds; the generous limit is for
# a 2-core machine that is also compiling or running other tests.
READY_TIMEOUT_S = 60.0
KUBECTL_TIMEOUT_S = 60.0

ADMIN_GROUP = "system:masters"
# Only what makes ownerReferences and namespace deletion behave as in a
# cluster. No node-lifecycle controller: fake nodes have no kubelet and would
# be tainted and evicted.
DEFAULT_CONTROLLERS = ("garbagecollector", "namespace")


class KubectlError(subprocess.CalledProcessError):
    """A kubectl command failed; its message carries kubectl's stderr."""

    def __str__(self) -> str:
        stderr = (self.stderr or "").strip()
        return f"{super().__str__()}\nstderr:\n{stderr}" if stderr else super().__str__()


@dataclass
class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager on loopback ports.

    One instance serves a whole pytest session (tests keep out of each other's
    way with unique names) or one demo run. :meth:`stop_apiserver` and
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
    controllers: tuple[str, ...] = DEFAULT_CONTROLLERS
    _etcd: ManagedProcess | None = None
    _apiserver: ManagedProcess | None = None
    _controller_manager: ManagedProcess | None = None
    _paths: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.ca_file = self.run_dir / "pki" / "ca.crt"

    # -- life cycle -------------------------------------------------------

    @classmethod
    def start(
        cls,
        binaries: Binaries | None = None,
        *,
        attempts: int = 3,
        controllers: tuple[str, ...] = DEFAULT_CONTROLLERS,
    ) -> ControlPlane:
        """Start a control plane and wait until the API server is ready.

        Ports are chosen free but may be taken by someone else before the
        servers bind them; a start that fails that way is retried on new ports.
        ``controllers`` are the kube-controller-manager controllers to run.
        """
        binaries = binaries or find_binaries()
        reap_leftovers()
        last_error: ControlPlaneError | None = None
        for _ in range(attempts):
            run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-"))
            plane = cls(binaries=binaries, run_dir=run_dir, controllers=controllers)
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
                f"--controllers={','.join(self.controllers)}",
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

    def _process(self, name: str, argv: list[str]) -> ManagedProcess:
        return ManagedProcess(
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

    def server_pids(self) -> dict[str, int]:
        """The running servers' process ids by name (etcd, kube-apiserver, ...): what a benchmark charges CPU to."""
        procs = (self._etcd, self._apiserver, self._controller_manager)
        return {p.name: p.popen.pid for p in procs if p is not None and p.popen is not None and p.running()}

    @contextlib.contextmanager
    def extra_controllers(self, *names: str, flags: Sequence[str] = ()) -> Iterator[None]:
        """Run more kube-controller-manager controllers (``job``, ...) while the block runs.

        The control plane runs only the controllers every user of it relies
        on; a test whose workload needs another one for real (a batch Job's
        pods made by the Job controller) runs it for just that long: a
        second controller manager with only ``names``, no leader election,
        stopped when the block ends, even when it fails. ``flags`` go to that
        controller manager (``--kube-api-qps``, say).
        """
        if not names:
            raise ValueError("name at least one controller")
        proc = self._process(
            f"kube-controller-manager-{'-'.join(names)}",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                f"--controllers={','.join(names)}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
                *flags,
            ],
        )
        proc.start()
        try:
            yield
        finally:
            proc.stop()

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
        return log_tail(self.run_dir / "logs" / f"{component}.log", lines)

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
        return impersonating_client(self.configuration(), service_account, namespace)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = KUBECTL_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl with the admin kubeconfig; raise :class:`KubectlError` on failure when ``check``.

        Runs in the repository root, so ``kubectl("apply", "-k", "manifests/")``
        means the same wherever pytest or the demo was started.
        """
        argv = [
            str(self.binaries.kubectl),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.run_dir / 'kubectl-cache'}",
            *args,
        ]
        result = subprocess.run(  # noqa: PLW1510 - checked below, with stderr in the error
            argv, input=input, text=True, capture_output=True, timeout=timeout, cwd=SOURCE_ROOT
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result


@contextlib.contextmanager
def running_control_plane(binaries: Binaries | None = None) -> Iterator[ControlPlane]:
    """A started control plane that is stopped, and its folder removed, when the block ends.

    For scripts such as benchmarks, which have no pytest fixture: the servers
    go away on an exception or Ctrl-C too, as they do after a test session.
    """
    plane = ControlPlane.start(binaries)
    try:
        yield plane
    finally:
        plane.stop()

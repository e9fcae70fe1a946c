"""A local Kubernetes cluster: real etcd, kube-apiserver, controller-manager and scheduler, kwok as the nodes.

`Cluster(state_dir).up()` starts everything on loopback, creates the simulated GPU nodes and returns once the
cluster is usable (apiserver ready, the default ServiceAccount made by the controller-manager, the scheduler
healthy, every node Ready), printing a line per step so a slow or failing start is visible. `down()` stops
what `up()` started and may be called any number of times. Each cluster lives in its own state folder (files,
logs, pids) with ports picked at start, so a test cluster and a demo cluster run side by side.
"""

from __future__ import annotations

import contextlib
import fcntl
import pathlib
import shutil
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import yaml

from epd_testenv import api, components, layout, nodehost, nodeimages, nodes, pki, process, realnode, timeline

DEFAULT_READY_TIMEOUT_S = 120.0
"""Bring-up deadline. Warm, it takes well under 20 s; a loaded 2-core CI machine gets generous headroom."""

POLL_S = 0.2


PORT_ATTEMPTS = 3
"""Bring-up attempts when a component finds its port taken."""


class ClusterError(Exception):
    """The cluster could not be brought up (a component exited, or a deadline passed)."""


class PortTakenError(ClusterError):
    """A component could not bind its port: another process took it between our pick and its start.

    Ports are picked free, but several clusters (tests, demos, other people's) start on one machine at once,
    so the pick can race; bring-up then starts over with new ports.
    """


@dataclass(frozen=True)
class Settings:
    """What kind of cluster to bring up."""

    pool: nodes.NodePool = field(default_factory=nodes.NodePool)
    network: components.Network = field(default_factory=components.Network)
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    real_node: realnode.NodeNetwork | None = None
    """A real node (containerd, kubelet, kube-proxy, CoreDNS) beside the simulated ones; needs root."""
    node_images: tuple[str, ...] = ()
    """Tags of the project's images (images.txt) to copy into the real node's containerd."""

    @property
    def control_plane(self) -> components.Network:
        """The address plan: the simulated pods' range, and with a real node its Services and apiserver."""
        if self.real_node is None:
            return self.network
        return components.Network(
            pod_cidr=self.network.pod_cidr,
            service_cidr=self.real_node.service_cidr,
            api_host=self.real_node.gateway,
        )


@dataclass(frozen=True)
class Status:
    """What `status` reports."""

    running: list[str]
    """Components whose recorded process is alive."""
    stopped: list[str]
    """Components recorded by `up` whose process is gone."""
    server: str | None
    ready: bool
    """The apiserver answers /readyz."""


def _print(line: str) -> None:
    print(line, flush=True)


class Cluster:
    """One local cluster, identified by its state folder."""

    def __init__(
        self, state_dir: pathlib.Path, settings: Settings | None = None, say: Callable[[str], None] = _print
    ) -> None:
        # Absolute, because process ownership is checked by finding this path in each command line.
        self.state_dir = state_dir.resolve()
        self.settings = settings or Settings()
        self.files = components.Files(self.state_dir)
        self.node_files = realnode.NodeFiles(self.state_dir, layout.containerd_root())
        self._say = say
        self._started: list[process.Running] = []
        self._extra: dict[str, object] = {}

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.files.kubeconfig

    # -- lifecycle

    def up(self) -> None:
        """Start a fresh cluster (stopping and wiping any previous one here) and wait until usable."""
        with self._lock():
            for attempt in range(1, PORT_ATTEMPTS + 1):
                self._stop_locked(quiet=True)
                self._wipe()
                try:
                    with timeline.stage(f"cluster up ({self.state_dir.name})"):
                        self._bring_up()
                    return
                except PortTakenError as error:
                    self._stop_locked(quiet=True)
                    if attempt == PORT_ATTEMPTS:
                        raise
                    who = str(error).split(" ", 1)[0]
                    self._say(f"cluster: another process took {who}'s port; starting over with other ports")
                except BaseException:
                    self._say(f"cluster: bring-up failed; stopping what was started (logs in {self.files.logs})")
                    self._stop_locked(quiet=True)
                    raise

    def down(self) -> list[str]:
        """Stop every process `up` started here; returns their names (empty when nothing ran)."""
        with self._lock():
            return self._stop_locked(quiet=False)

    def status(self) -> Status:
        recorded, extra = process.load(self.state_dir)
        running = [p.name for p in recorded if process.is_ours(p.pid, self.state_dir)]
        stopped = [p.name for p in recorded if p.name not in running]
        server = extra.get("server")
        ready = False
        if isinstance(server, str) and running:
            host, port = server.removeprefix("https://").rsplit(":", 1)
            with contextlib.suppress(api.ApiError):
                ready = self._client(host, int(port)).request("GET", "/readyz")[0] == 200
        return Status(running, stopped, server if isinstance(server, str) else None, ready)

    # -- bring-up steps

    def _bring_up(self) -> None:
        began = time.monotonic()
        deadline = began + self.settings.ready_timeout_s
        ports = components.Ports(*process.free_ports(5))
        network = self.settings.control_plane
        node = self.settings.real_node
        self._extra = {"server": components.server_url(ports, network), "ports": asdict(ports)}

        extra_ips: tuple[str, ...] = ()
        if node is not None:
            nodehost.prepare(node, self.node_files)
            self._say(f"cluster: real node: bridge {node.bridge} {node.gateway}/{node.prefix_length}")
            extra_ips = (node.gateway, node.kubernetes_service_ip)
        pki.generate(self.files.pki.dir, extra_ips=extra_ips, real_node=node is not None)
        for path, config in components.component_kubeconfigs(self.files, ports, network).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            path.chmod(0o600)
        self.files.scheduler_config.write_text(yaml.safe_dump(components.scheduler_config(self.files)))
        self._say(f"cluster: starting in {self.state_dir} (apiserver {components.server_url(ports, network)})")

        # The apiserver retries etcd by itself, so both start at once.
        self._start(components.etcd(self.files, ports))
        self._start(components.apiserver(self.files, ports, network))
        client = self._client(network.api_host, ports.apiserver)
        self._wait("kube-apiserver /readyz", lambda: client.request("GET", "/readyz")[0] == 200, deadline)

        # The controller-manager gives up if the apiserver is not healthy within seconds, hence after /readyz.
        self._start(components.controller_manager(self.files, ports, network))
        self._start(components.scheduler(self.files, ports))
        self._start(components.kwok(self.files, network))
        for manifest in nodes.manifests(self.settings.pool):
            client.create("/api/v1/nodes", manifest)
        self._say(f"cluster: created {self.settings.pool.count} simulated GPU nodes")

        self._wait(
            "the default ServiceAccount (controller-manager working)",
            lambda: client.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            deadline,
        )
        self._wait("kube-scheduler /healthz", lambda: _healthz(ports.scheduler), deadline)
        self._wait(
            f"{self.settings.pool.count} nodes Ready (kwok working)",
            lambda: self._nodes_ready(client),
            deadline,
        )
        if node is not None:
            self._bring_up_real_node(node, client, deadline)
        self._say(f"cluster: up in {time.monotonic() - began:.1f} s")

    def _bring_up_real_node(self, node: realnode.NodeNetwork, client: api.Client, deadline: float) -> None:
        """containerd, the images, kubelet, kube-proxy and CoreDNS. Copying images does not count against the
        bring-up deadline (minutes for a vLLM image, once per build)."""
        files = self.node_files
        ports = realnode.NodePorts(*process.free_ports(5))
        kubeconfigs = {
            name: self.files.component_kubeconfig(name) for name in (realnode.NODE_NAME, "kube-proxy", "coredns")
        }
        for path, text in realnode.config_files(node, files, ports, self.files.pki.ca_cert, kubeconfigs).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        files.containerd_root.mkdir(parents=True, exist_ok=True)
        self._start(realnode.containerd(files))
        self._wait("containerd", lambda: nodeimages.containerd_answers(files), deadline)
        began = time.monotonic()
        nodeimages.import_images(files, self.settings.node_images, self._say)
        deadline += time.monotonic() - began
        self._start(realnode.kubelet(node, files, kubeconfigs[realnode.NODE_NAME]))
        self._wait(
            f"the real node {realnode.NODE_NAME} Ready (kubelet, containerd, CNI)",
            lambda: nodes.is_ready(client.get(f"/api/v1/nodes/{realnode.NODE_NAME}")),
            deadline,
        )
        client.patch_status(f"/api/v1/nodes/{realnode.NODE_NAME}", realnode.gpu_status_patch())
        self._start(realnode.kube_proxy(files))
        self._start(realnode.coredns(files))
        self._wait("kube-proxy /healthz", lambda: _http_ok(ports.proxy_healthz, "/healthz"), deadline)
        self._wait("CoreDNS /ready", lambda: _http_ok(ports.dns_ready, "/ready"), deadline)

    def _nodes_ready(self, client: api.Client) -> bool:
        listed = client.get(f"/api/v1/nodes?labelSelector={nodes.SIMULATED_LABEL}%3Dtrue")
        ready = [n for n in listed.get("items", []) if nodes.is_ready(n)]
        return len(ready) >= self.settings.pool.count

    def _client(self, host: str, port: int) -> api.Client:
        return api.Client(host, port, self.files.pki)

    def _start(self, component: components.Component) -> None:
        binary = shutil.which(component.binary) if component.binary else layout.binary(component.name)
        if binary is None:
            raise ClusterError(f"{component.binary} is not installed: run `make setup` (installs it)")
        running = process.start(component.name, [str(binary), *component.argv], self.files.logs)
        self._started.append(running)
        process.save(self.state_dir, self._started, self._extra)

    def _wait(self, what: str, check: Callable[[], bool], deadline: float) -> None:
        """Poll `check` until true; fail early when a started component has exited."""
        self._say(f"cluster: waiting for {what} ...")
        began = time.monotonic()
        while True:
            with contextlib.suppress(api.ApiError):
                if check():
                    self._say(f"cluster:   ok ({time.monotonic() - began:.1f} s)")
                    return
            for p in self._started:
                if not process.is_ours(p.pid, self.state_dir):
                    tail = process.log_tail(p.log)
                    error = PortTakenError if "address already in use" in tail else ClusterError
                    raise error(f"{p.name} exited; last lines of {p.log}:\n{tail}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out after {self.settings.ready_timeout_s:.0f} s waiting for {what}; "
                    f"logs in {self.files.logs}"
                )
            time.sleep(POLL_S)

    # -- teardown and bookkeeping

    def _stop_locked(self, *, quiet: bool) -> list[str]:
        recorded, _ = process.load(self.state_dir)
        recorded = recorded or self._started
        # Reverse start order, clients first and etcd last: an apiserver that loses etcd first hangs on exit.
        # The real node's containers go while containerd still runs, and what it changed on the machine last.
        order = list(reversed(recorded))
        split = next((i for i, p in enumerate(order) if p.name == "containerd"), len(order))
        stopped = process.stop(order[:split], self.state_dir)
        if split < len(order) and process.is_ours(order[split].pid, self.state_dir):
            nodehost.stop_containers(self.node_files)
        stopped += process.stop(order[split:], self.state_dir)
        nodehost.restore(self.node_files)
        (self.state_dir / process.STATE_FILE).unlink(missing_ok=True)
        self._started = []
        if not quiet:
            self._say(f"cluster: stopped {', '.join(stopped)}" if stopped else "cluster: nothing was running")
        return stopped

    def _wipe(self) -> None:
        """Remove what a previous cluster left, path by path: never the whole folder (it may be `.`)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        nodehost.unmount_under(self.node_files.dir)  # never delete through a container's mounted root
        for name in ("pki", "etcd", "logs", "config", "node"):
            shutil.rmtree(self.state_dir / name, ignore_errors=True)
        self.files.kubeconfig.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """One `up` or `down` at a time per state folder (e.g. `make demo` while `make cluster-down` runs)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / ".lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield


def _http_ok(port: int, path: str) -> bool:
    """A plain-HTTP health endpoint on loopback (kube-proxy, CoreDNS) answers 200."""
    try:
        with urllib.request.urlopen(f"http://{components.LOOPBACK}:{port}{path}", timeout=api.TIMEOUT_S) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _healthz(port: int) -> bool:
    """The scheduler's /healthz (always allowed without credentials). Its serving cert is self-signed."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://{components.LOOPBACK}:{port}/healthz", context=context, timeout=api.TIMEOUT_S
        ) as response:
            return bool(response.status == 200)
    except OSError:
        return False

"""What the real node changes on the machine, made and undone here: the bridge, kernel settings, firewall tables,
mounts, network namespaces and cgroups.

`prepare` records the machine's state before anything starts (into the cluster's folder, so a later `down`
from another process can undo it) and creates the bridge; `restore` undoes everything the node and its pods
added, and may run any number of times. Only one real node runs on a machine (one bridge, one kubelet port):
`prepare` refuses while another cluster's node is alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field

from epd_testenv import realnode

SYSCTLS = (
    # The kubelet's kernel tunables (it sets them at start).
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    # The CNI bridge plugin turns forwarding on for its gateway.
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
)
OWNER_FILE = pathlib.Path("/run/epd-testenv-real-node")
"""Which cluster folder holds the machine's real node (one per machine)."""
RECORD_FILE = "host.json"
NFT_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"), ("inet", realnode.FENCE_TABLE))
"""kube-proxy's nftables tables in nftables mode (it keeps all its rules there), and the harness's fence."""
FIREWALL_TOOLS = ("iptables", "ip6tables")
_ADDED_CHAIN = re.compile(r"^(KUBE-|CNI-)")
"""Chains the kubelet, kube-proxy or the CNI plugins may add; any of these not there before are ours to remove."""


class HostError(Exception):
    """The machine cannot take the real node now (another one runs, or a command failed)."""


@dataclass
class Record:
    """The machine before the node started."""

    sysctls: dict[str, str] = field(default_factory=dict)
    chains: dict[str, list[str]] = field(default_factory=dict)
    """Per "tool table": the chain names that existed."""
    bridge: str = ""


def _read_sysctl(name: str) -> str | None:
    try:
        return pathlib.Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check and result.returncode != 0:
        raise HostError(f"{' '.join(argv)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def _chains() -> dict[str, list[str]]:
    """Chain names per tool and table, from iptables-save (empty when the tool is missing)."""
    found: dict[str, list[str]] = {}
    for tool in FIREWALL_TOOLS:
        if shutil.which(f"{tool}-save") is None:
            continue
        table = ""
        for line in _run(f"{tool}-save", check=False).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
                found.setdefault(f"{tool} {table}", [])
            elif line.startswith(":"):
                found.setdefault(f"{tool} {table}", []).append(line[1:].split()[0])
    return found


def _owner_alive() -> str | None:
    """The folder of a cluster whose real node still runs here, if any."""
    try:
        owner = OWNER_FILE.read_text().strip()
    except OSError:
        return None
    kubelet = pathlib.Path(owner) / "node" / "kubelet"
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if str(kubelet) in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                return owner
    return None


def prepare(network: realnode.NodeNetwork, files: realnode.NodeFiles) -> None:
    """Record the machine's state and create the bridge with the gateway address (the kubelet needs its node
    IP on an interface before it starts)."""
    owner = _owner_alive()
    if owner is not None and owner != str(files.state):
        raise HostError(
            f"the real node of the cluster in {owner} runs on this machine (one per machine): "
            f"stop it first (python -m epd_testenv.cli down --state-dir {owner})"
        )
    if os.geteuid() != 0:
        raise HostError("the real node needs root (bridges, mounts, cgroups); run as root or leave it off")
    previous = files.dir / RECORD_FILE
    if previous.is_file():
        restore(files)  # a crashed run of this folder: undo it before recording afresh
    if owner is None and OWNER_FILE.is_file():
        stale = pathlib.Path(OWNER_FILE.read_text().strip())
        with contextlib.suppress(OSError, HostError):
            restore(realnode.NodeFiles(stale, files.containerd_root))
    record = Record(
        sysctls={name: value for name in SYSCTLS if (value := _read_sysctl(name)) is not None},
        chains=_chains(),
        bridge=network.bridge,
    )
    files.dir.mkdir(parents=True, exist_ok=True)
    previous.write_text(json.dumps(asdict(record), indent=2) + "\n")
    OWNER_FILE.write_text(f"{files.state}\n")
    if _run("ip", "link", "show", network.bridge, check=False).returncode == 0:
        _run("ip", "link", "delete", network.bridge)
    _run("ip", "link", "add", network.bridge, "type", "bridge")
    _run("ip", "addr", "add", f"{network.gateway}/{network.prefix_length}", "dev", network.bridge)
    _run("ip", "link", "set", network.bridge, "up")
    fenced = subprocess.run(
        ["nft", "-f", "-"], input=realnode.fence(network), capture_output=True, text=True, check=False
    )
    if fenced.returncode != 0:
        raise HostError(f"nft could not add the harness's forward fence: {fenced.stderr.strip()}")


def stop_containers(files: realnode.NodeFiles) -> list[str]:
    """Kill and delete every container the kubelet made (pods' and sandboxes'); returns their ids. Needs
    containerd running."""
    ctr = files.ctr
    listed = _run(*ctr, "containers", "list", "--quiet", check=False)
    ids = listed.stdout.split() if listed.returncode == 0 else []
    for cid in ids:
        _run(*ctr, "tasks", "kill", "--signal", "SIGKILL", cid, check=False)
    for cid in ids:
        for _ in range(50):
            if _run(*ctr, "tasks", "delete", "--force", cid, check=False).returncode == 0:
                break
            if cid not in _run(*ctr, "tasks", "list", "--quiet", check=False).stdout.split():
                break
            time.sleep(0.1)
        _run(*ctr, "containers", "delete", cid, check=False)
    return ids


def pod_containers(files: realnode.NodeFiles, namespace: str) -> list[str]:
    """Ids of the containers containerd holds for pods of a Kubernetes namespace (their CRI labels say which)."""
    ctr = files.ctr
    listed = _run(*ctr, "containers", "list", check=False).stdout.splitlines()[1:]
    found = []
    for cid in (line.split()[0] for line in listed if line.strip()):
        info = json.loads(_run(*ctr, "containers", "info", cid, check=False).stdout or "{}")
        if (info.get("Labels") or {}).get("io.kubernetes.pod.namespace") == namespace:
            found.append(cid)
    return found


def pod_pid(files: realnode.NodeFiles, namespace: str, pod: str) -> int:
    """The host PID of a running container of a pod (any of them: they share the pod's network namespace)."""
    ctr = files.ctr
    tasks = {}
    for line in _run(*ctr, "tasks", "list").stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "RUNNING":
            tasks[fields[0]] = int(fields[1])
    for cid in pod_containers(files, namespace):
        info = json.loads(_run(*ctr, "containers", "info", cid, check=False).stdout or "{}")
        if (info.get("Labels") or {}).get("io.kubernetes.pod.name") == pod and cid in tasks:
            return tasks[cid]
    raise HostError(f"no running container of pod {namespace}/{pod}")


BLOCK_TABLE = "epd_test_block"
"""The nftables table a test adds inside one pod's network namespace (gone with the pod, or `unblock`)."""


def block(pid: int, source: str, ports: list[int]) -> None:
    """Drop TCP from `source` to `ports` inside the network namespace of process `pid`: a path broken on
    purpose, as a NetworkPolicy or a firewall would, touching nothing outside that pod."""
    ruleset = (
        f"table inet {BLOCK_TABLE} {{ chain input {{ type filter hook input priority -10; policy accept; "
        f"ip saddr {source} tcp dport {{ {', '.join(str(p) for p in ports)} }} drop; }}; }}\n"
    )
    result = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "nft", "-f", "-"], input=ruleset, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise HostError(f"nft in the netns of {pid}: {result.stderr.strip()}")


def unblock(pid: int) -> None:
    _run("nsenter", "-t", str(pid), "-n", "nft", "delete", "table", "inet", BLOCK_TABLE, check=False)


def _kill_shims(files: realnode.NodeFiles) -> None:
    """containerd's shims outlive it; ours name our socket on their command line."""
    socket = str(files.containerd_socket)
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ProcessLookupError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "containerd-shim" in cmdline and socket in cmdline:
                os.kill(int(proc.name), signal.SIGKILL)


def unmount_under(root: pathlib.Path) -> None:
    """Lazily unmount everything mounted below `root`, deepest first (overlay root filesystems, network
    namespaces, the kubelet's volume mounts)."""
    prefix = str(root) + "/"
    points = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        _run("umount", "--lazy", point, check=False)


def _remove_cgroups() -> None:
    """The kubelet's pod cgroups (cgroupfs driver: `kubepods` in every hierarchy), leaves first."""
    for hierarchy in pathlib.Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / "kubepods"
        if not top.is_dir():
            continue
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _added(before: dict[str, list[str]]) -> dict[str, list[str]]:
    """Per "tool table", the KUBE-/CNI- chains that exist now and were not in `before`."""
    found = {
        key: [c for c in chains if _ADDED_CHAIN.match(c) and c not in before.get(key, [])]
        for key, chains in _chains().items()
    }
    return {key: chains for key, chains in found.items() if chains}


def _remove_added_chains(before: dict[str, list[str]]) -> None:
    for key, added in _added(before).items():
        tool, table = key.split()
        # Rules that jump to an added chain go first, then the chains themselves. A rule's comment is quoted
        # and may hold spaces (the CNI firewall plugin's does), hence shlex.
        for line in _run(f"{tool}-save", "-t", table, check=False).stdout.splitlines():
            if line.startswith("-A ") and any(f"-j {c}" in line for c in added):
                _run(tool, "-t", table, "-D", *shlex.split(line[3:]), check=False)
        for chain in added:
            _run(tool, "-t", table, "-F", chain, check=False)
        for chain in added:
            _run(tool, "-t", table, "-X", chain, check=False)


def restore(files: realnode.NodeFiles) -> None:
    """Undo what `prepare`, the node's processes and its pods changed. The processes must be stopped."""
    path = files.dir / RECORD_FILE
    if not path.is_file():
        return
    record = Record(**json.loads(path.read_text()))
    _kill_shims(files)
    unmount_under(files.dir)
    for family, table in NFT_TABLES:
        _run("nft", "delete", "table", family, table, check=False)
    _remove_added_chains(record.chains)
    if record.bridge and _run("ip", "link", "show", record.bridge, check=False).returncode == 0:
        _run("ip", "link", "delete", record.bridge, check=False)
    for name, value in record.sysctls.items():
        if _read_sysctl(name) != value:
            with contextlib.suppress(OSError):
                pathlib.Path("/proc/sys", name).write_text(value)
    _remove_cgroups()
    path.unlink()
    with contextlib.suppress(OSError):
        if OWNER_FILE.read_text().strip() == str(files.state):
            OWNER_FILE.unlink()


def added_chains(files: realnode.NodeFiles) -> list[str]:
    """KUBE-/CNI- chains that exist now and did not when the node started (none, with our settings)."""
    record = Record(**json.loads((files.dir / RECORD_FILE).read_text()))
    return [f"{key} chain {c}" for key, chains in _added(record.chains).items() for c in chains]


def kube_proxy_tables() -> list[str]:
    """kube-proxy's nftables tables that exist now."""
    return [
        f"{family} {table}"
        for family, table in NFT_TABLES
        if table == "kube-proxy" and _run("nft", "list", "table", family, table, check=False).returncode == 0
    ]


def sysctls() -> dict[str, str | None]:
    """The kernel settings the node may change, as they are now."""
    return {name: _read_sysctl(name) for name in SYSCTLS}


def leftovers(network: realnode.NodeNetwork, files: realnode.NodeFiles) -> list[str]:
    """What of the node is still on the machine (empty after a clean `restore`): for tests and `status`."""
    found = []
    if _run("ip", "link", "show", network.bridge, check=False).returncode == 0:
        found.append(f"bridge {network.bridge}")
    for family, table in NFT_TABLES:
        if _run("nft", "list", "table", family, table, check=False).returncode == 0:
            found.append(f"nftables table {family} {table}")
    for key, chains in _chains().items():
        found += [f"{key} chain {c}" for c in chains if _ADDED_CHAIN.match(c)]
    prefix = str(files.dir) + "/"
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        if line.split()[4].startswith(prefix):
            found.append(f"mount {line.split()[4]}")
    found += [f"cgroup {p}" for p in pathlib.Path("/sys/fs/cgroup").glob("*/kubepods")]
    return found

"""On one host, the prefill's and the decode's MooncakeStoreConnector lookup servers each have a socket of their own.

vLLM's store worker (rank 0) serves the scheduler's prefix lookups on
ipc://<VLLM_RPC_BASE_PATH>/lookup_rpc_port_<lookup_rpc_port>_host_<hostname>_dp_rank<r> (store/worker.py,
get_zmq_rpc_path_lookup, the same in 0.32 and 0.33; VLLM_RPC_BASE_PATH defaults to the temp dir), unlinking
whatever is there before it binds. Two instances of one host with the operator's lookup_rpc_port 0 thus get one
path, and the second to start takes the first one's lookups over. The local runner gives each vLLM instance its
own VLLM_RPC_BASE_PATH (local.plan.rpc_dir).

examples/local-e-p-d.yaml with KV through the store only (MooncakeStoreConnector on both sides), run by the
local runner without its encoder and proxy (the lookup servers do not need them): the path each instance's
engine builds, computed as vLLM does from that process's own environment and hostname, differs between the
two; each path is a listening unix socket held by a process of that instance; and a lookup sent through each
(vLLM's own wire format, from the e2e venv) gets an answer.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.config.roles import Role
from epd_operator.local import processes, profile
from epd_operator.local.plan import POD_IP
from epd_operator.local.processes import LocalDeployment, Running
from tests.e2e.conftest import progress
from tests.e2e.test_local_e_p_d import example_variant
from tests.sockets import group_pids, tcp_listeners, unix_listeners

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

ROLES = {"master", "store-client", "prefill", "decode"}
LOOKUP_TIMEOUT_MS = 30_000

LOOKUP_CLIENT = """
import sys
import zmq
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.protocol import LOOKUP_MSG, decode_lookup_response

sock = zmq.Context().socket(zmq.REQ)
sock.setsockopt(zmq.RCVTIMEO, int(sys.argv[2]))
sock.setsockopt(zmq.LINGER, 0)
sock.connect("ipc://" + sys.argv[1])
hashes = bytes(range(64))  # two 32-byte block hashes no prompt has
sock.send_multipart([LOOKUP_MSG, (64).to_bytes(4, "big"), (32).to_bytes(2, "big"), hashes])
print("hit_length", decode_lookup_response(sock.recv()).hit_length)
"""
"""A lookup as vLLM's LookupKeyClient sends it (protocol.py gives the tag and reads the answer)."""


def store_only(doc: dict[str, Any]) -> None:
    doc["metadata"]["name"] = "local-lookup"
    doc["spec"]["prefill"]["kv"]["connector"] = "mooncake-store"


@pytest.fixture(scope="module")
def local(
    request: pytest.FixtureRequest, e2e_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalDeployment]:
    workdir = tmp_path_factory.mktemp("lookup")
    say = progress(request.config)
    plan = processes.plan_on_free_ports(example_variant(workdir, store_only), workdir, tiny_model, profile.CPU)
    with processes.deployment(plan, workdir, e2e_python, say=lambda line: say(f"lookup: {line}"), only=ROLES) as it:
        yield it


def environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def lookup_path(run: Running) -> tuple[str, set[int]]:
    """The lookup socket path this instance's engine builds (vLLM's rule, from its own environment), and the
    instance's processes."""
    pids = group_pids(run.popen.pid)
    env = environment(run.popen.pid)
    base = env.get("VLLM_RPC_BASE_PATH") or env.get("TMPDIR") or tempfile.gettempdir()
    return f"{base}/lookup_rpc_port_0_host_{socket.gethostname()}_dp_rank0", pids


def by_role(local: LocalDeployment, role: Role) -> Running:
    return next(r for r in local.running if r.instance.role is role)


def test_the_prefill_and_the_decode_each_serve_lookups_on_a_socket_of_their_own(
    local: LocalDeployment, e2e_python: Path
) -> None:
    prefill, decode = by_role(local, Role.PREFILL), by_role(local, Role.DECODE)
    (prefill_path, prefill_pids), (decode_path, decode_pids) = lookup_path(prefill), lookup_path(decode)
    assert prefill_path != decode_path, f"one lookup socket for both instances: {prefill_path}"
    listening = unix_listeners(prefill_pids | decode_pids)
    for run, path, pids in ((prefill, prefill_path, prefill_pids), (decode, decode_path, decode_pids)):
        assert path in listening, f"{run.name}: nothing of it listens on {path}; its sockets: {listening}"
        assert listening[path] in pids, f"{run.name}: {path} is held by pid {listening[path]}, not by {pids}"
        answer = subprocess.run(
            [str(e2e_python), "-c", LOOKUP_CLIENT, path, str(LOOKUP_TIMEOUT_MS)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert answer.returncode == 0, f"{run.name}: the lookup through {path} failed:\n{answer.stderr[-2000:]}"
        assert answer.stdout.split() == ["hit_length", "0"], f"{run.name}: {answer.stdout!r}"
    assert prefill.alive() and decode.alive()


def test_no_planned_port_of_a_vllm_role_listens_beyond_loopback(local: LocalDeployment) -> None:
    """Every port the plan gives the prefill and the decode (HTTP, EC control, bootstrap) that is listened on
    is bound to loopback; what else they listen on is Mooncake's transfer engine (every interface, no flag)."""
    for role in (Role.PREFILL, Role.DECODE):
        run = by_role(local, role)
        listeners = tcp_listeners(group_pids(run.popen.pid))
        planned = set(run.instance.ports.values())
        assert (POD_IP, run.instance.ports["http"]) in {(lst.address, lst.port) for lst in listeners}, listeners
        beyond = [lst for lst in listeners if lst.port in planned and lst.address != POD_IP]
        assert not beyond, f"{run.name}: planned ports beyond loopback: {beyond}"

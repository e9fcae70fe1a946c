"""E + P + D with the other KV connector: examples/local-e-p-d.yaml with spec.prefill.kv.connector set to
mooncake-store, so KV goes prefill -> decode only through the Mooncake store (MooncakeStoreConnector: the prefill
kv_both writes its blocks, the decode kv_consumer reads them), with no P2P transfer and no bootstrap server. The
proxy then sends the decode its request once the prefill has answered, with no kv_transfer_params.

Through its proxy it answers as the session's baseline does, token for token, for the same cases as
test_local_e_p_d (one image, two images, the same image twice, text only, an image again; streamed and not), and
the decode's counters show where its prompt came from: every full 32-token block from the store
(`external_kv_transfer`, none from a P2P peer) or, for a prompt it has already seen (the streamed run of a case
repeats its whole run), from its own prefix cache; it computed at most the partial last block of each prompt. A
fresh prompt's blocks are in the store under the deployment's KV prefix, and the decode loads them from there.

The prefill writes the store asynchronously (a send thread, after the step that computed the blocks), so a decode
that looks the blocks up before they land computes them itself: correct, only slower (shared/docs/facts.md). On an
idle machine that happened to about one request in twenty (full e2e runs, each time another case). So each case
asserts the answer, that no token came by P2P, and that every prompt token is accounted for; whether the decode
loaded its blocks or recomputed them is tallied, and a check after the cases asserts that most of the requests
that ran loaded them (skipped, saying so, when no case ran); a fresh prompt must load them too (up to three fresh
prompts, each a real attempt).

On one host the prefill's and the decode's MooncakeStoreConnector lookup servers each have a socket of their own.
vLLM's store worker (rank 0) serves the scheduler's prefix lookups on
ipc://<VLLM_RPC_BASE_PATH>/lookup_rpc_port_<lookup_rpc_port>_host_<hostname>_dp_rank<r> (store/worker.py,
get_zmq_rpc_path_lookup, the same in 0.32 and 0.33; VLLM_RPC_BASE_PATH defaults to the temp dir), unlinking
whatever is there before it binds. Two instances of one host with the operator's lookup_rpc_port 0 thus get one
path, and the second to start takes the first one's lookups over. The local runner gives each vLLM instance its
own VLLM_RPC_BASE_PATH (local.plan.rpc_dir): the path each instance's engine builds, computed as vLLM does from
that process's own environment and hostname, differs between the two; each path is a listening unix socket held
by a process of that instance; and a lookup sent through each (vLLM's own wire format, from the e2e venv) gets an
answer. Every port the plan gives them is bound to loopback.
Instances: the session's baseline and this module's deployment, stopped when the module ends.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epd_connectors.config.kv_transfer import MooncakeConnectorConfig, connectors_of
from epd_connectors.config.roles import Role
from epd_local.plan import POD_IP
from epd_local.processes import LocalDeployment, Running
from tests.e2e.conftest import VllmInstance
from tests.e2e.test_local_e_p_d import (
    CASES,
    LONG_QUESTION,
    DecodeCounts,
    LocalEPD,
    ask,
    chat,
    decode_counts_after,
    example_variant,
    image,
    new_store_keys,
    running_example,
    serve_case,
    text,
)
from tests.sockets import group_pids, tcp_listeners, unix_listeners

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

BLOCK = 32
"""spec.model.blockSize of the example: the store keeps whole blocks only."""


def store_only(doc: dict[str, Any]) -> None:
    doc["metadata"]["name"] = "local-e-p-d-store"
    doc["spec"]["prefill"]["kv"]["connector"] = "mooncake-store"


@pytest.fixture(scope="module")
def epd(
    request: pytest.FixtureRequest, e2e_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalEPD]:
    workdir = tmp_path_factory.mktemp("e-p-d-store")
    manifest = example_variant(workdir, store_only)
    with running_example(request, e2e_python, tiny_model, workdir, "E+P+D store", manifest=manifest) as it:
        kv = it.instance(Role.PREFILL).bundle.kv_transfer
        assert kv is not None and not any(isinstance(c, MooncakeConnectorConfig) for c in connectors_of(kv))
        yield it


FRESH_ATTEMPTS = 3

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


def loaded_every_full_block(delta: DecodeCounts, requests: int, label: str) -> bool:
    """Every prompt token is accounted for and none came by P2P; True when only the partial last block of each
    prompt was computed (the rest from the store or, for a prompt this decode has seen, its own prefix cache)."""
    assert delta.prompt > 0, f"{label}: the decode recorded no prompt tokens: {delta}"
    assert delta.computed + delta.transferred + delta.cached_locally == delta.prompt, f"{label}: {delta}"
    assert delta.from_p2p == 0, f"{label}: a P2P transfer in a store-only deployment: {delta}"
    return delta.computed <= (BLOCK - 1) * requests and delta.transferred + delta.cached_locally > 0


def test_the_proxy_answers_as_the_baseline_and_most_cases_load_every_full_block_from_the_store(
    epd: LocalEPD, baseline: VllmInstance
) -> None:
    """Every case, whole and streamed, answers as the baseline; the tally is judged over the cases this test ran
    itself (a lookup may race the store write, so a minority may recompute full blocks)."""
    outcomes: dict[str, bool] = {}
    for case in CASES:
        for stream in (False, True):
            delta = serve_case(epd, baseline, case, stream, "E+P+D store")
            label = f"{case}, {'streamed' if stream else 'whole'}"
            outcomes[label] = loaded_every_full_block(delta, len(CASES[case]), label)
            if not outcomes[label]:
                print(f"{label}: the decode recomputed full blocks (looked up before the store write landed): {delta}")
    missed = [label for label, loaded in outcomes.items() if not loaded]
    assert len(missed) * 2 < len(outcomes), f"the decode recomputed full blocks in {missed} of {list(outcomes)}"


def test_a_fresh_prompt_reaches_the_decode_through_the_store(epd: LocalEPD) -> None:
    """A prompt no instance has seen: the prefill stores its full blocks under the deployment's KV prefix, and
    the decode, which cannot have them cached, loads them from the store and computes only the last one (a
    lookup that raced the store write is retried with another fresh prompt, at most FRESH_ATTEMPTS in all)."""
    misses = []
    for attempt in range(FRESH_ATTEMPTS):
        keys_before = epd.store_keys()
        before = DecodeCounts.read(epd)
        ask(epd.plan.endpoint, chat([image(12 + attempt), text(LONG_QUESTION)]))
        delta = decode_counts_after(epd, before, 1)
        assert len(new_store_keys(epd, keys_before)) >= 2, "a prompt of several full blocks stored fewer than two"
        assert delta.cached_locally == 0, f"a fresh prompt was in the decode's cache: {delta}"
        assert delta.computed + delta.transferred == delta.prompt and delta.from_p2p == 0, delta
        if delta.transferred >= 2 * BLOCK and delta.computed < BLOCK:
            assert delta.transferred % BLOCK == 0, delta
            return
        misses.append(delta)
    pytest.fail(f"{FRESH_ATTEMPTS} fresh prompts, and the decode loaded none from the store: {misses}")


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
    epd: LocalEPD, e2e_python: Path
) -> None:
    local = epd.local
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


def test_no_planned_port_of_a_vllm_role_listens_beyond_loopback(epd: LocalEPD) -> None:
    """Every port the plan gives the prefill and the decode (HTTP, EC control, bootstrap) that is listened on
    is bound to loopback; what else they listen on is Mooncake's transfer engine (every interface, no flag)."""
    for role in (Role.PREFILL, Role.DECODE):
        run = by_role(epd.local, role)
        listeners = tcp_listeners(group_pids(run.popen.pid))
        planned = set(run.instance.ports.values())
        assert (POD_IP, run.instance.ports["http"]) in {(lst.address, lst.port) for lst in listeners}, listeners
        beyond = [lst for lst in listeners if lst.port in planned and lst.address != POD_IP]
        assert not beyond, f"{run.name}: planned ports beyond loopback: {beyond}"


def test_no_vllm_role_logged_a_traceback(epd: LocalEPD) -> None:
    for role in (Role.ENCODER, Role.PREFILL, Role.DECODE):
        assert "Traceback" not in epd.log(role), f"the {role.value} logged a traceback"

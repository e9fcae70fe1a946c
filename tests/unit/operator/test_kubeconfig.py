"""The operator's own kubeconfig reader (module kubeconfig): what kubectl reads, read the same way.

The cluster tiers connect with it for real (client certificates from a file here, the service account in the
pods tier); these cases cover the forms those tiers do not use.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_operator import kubeconfig


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def config(user: dict[str, Any], cluster: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "main",
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        **extra,
    }


def test_paths_are_relative_to_the_kubeconfig_that_names_them(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    doc = config(
        {"client-certificate": "pki/client.crt", "client-key": "/abs/client.key"},
        {"certificate-authority": "ca.crt", "proxy-url": "http://127.0.0.1:3128"},
    )
    info = kubeconfig.load(str(write(tmp_path / "sub" / "config", doc)), None, environ={})
    assert info.server == "https://127.0.0.1:6443"
    assert info.ca_path == str(tmp_path / "sub" / "ca.crt")
    assert info.certificate_path == str(tmp_path / "sub" / "pki" / "client.crt")
    assert info.private_key_path == "/abs/client.key"
    assert info.proxy_url == "http://127.0.0.1:3128"
    assert info.default_namespace == "ns"
    assert info.token is None and info.expiration is None and not info.insecure


def test_inline_data_and_a_token(tmp_path: Path) -> None:
    doc = config(
        {"client-certificate-data": "Y2VydA==", "client-key-data": "a2V5", "token": "t0k"},
        {"certificate-authority-data": "Y2E=", "insecure-skip-tls-verify": True},
    )
    info = kubeconfig.load(str(write(tmp_path / "config", doc)), None, environ={})
    assert (info.ca_data, info.certificate_data, info.private_key_data) == ("Y2E=", "Y2VydA==", "a2V5")
    assert info.insecure
    assert info.as_http_headers() == {"Authorization": "Bearer t0k"}


def test_a_context_is_chosen_and_several_files_merge_first_wins_missing_ones_skipped(tmp_path: Path) -> None:
    first = config({"token": "first"})
    second = config({"token": "second"}, {"server": "https://127.0.0.2:6443"})
    second["contexts"].append({"name": "other", "context": {"cluster": "c2", "user": "u2"}})
    second["clusters"].append({"name": "c2", "cluster": {"server": "https://127.0.0.3:6443"}})
    second["users"].append({"name": "u2", "user": {"token": "other"}})
    paths = f"{tmp_path / 'absent'}:{write(tmp_path / 'a', first)}:{write(tmp_path / 'b', second)}"
    assert kubeconfig.load(paths, None, environ={}).token == "first"
    other = kubeconfig.load(paths, "other", environ={})
    assert (other.server, other.token) == ("https://127.0.0.3:6443", "other")


@pytest.mark.parametrize(
    ("doc", "context", "expected"),
    [
        ({**config({}), "current-context": ""}, None, "sets no current-context. Fix: pass --context"),
        (config({}), "missing", "has no context 'missing'. Fix: pass --context with one of ['main']"),
        (config({"auth-provider": {"name": "gcp"}}), None, "uses auth-provider"),
        (config({"exec": {"apiVersion": "v0", "command": "x"}}), None, "exec plugin apiVersion 'v0'"),
    ],
)
def test_refusals_name_the_problem_and_the_fix(
    tmp_path: Path, doc: dict[str, Any], context: str, expected: str
) -> None:
    with pytest.raises(kubeconfig.ConfigError, match=expected.replace("[", r"\[").replace("(", r"\(")):
        kubeconfig.load(str(write(tmp_path / "config", doc)), context, environ={})


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(kubeconfig.ConfigError, match=f"{tmp_path / 'absent'}.*Fix: pass --kubeconfig"):
        kubeconfig.load(str(tmp_path / "absent"), None, environ={})


def test_a_token_file_is_read_and_expires_to_be_read_again(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("rotating\n")
    info = kubeconfig.load(str(write(tmp_path / "config", config({"tokenFile": "token"}))), None, environ={})
    assert info.token == "rotating"
    assert info.expiration is not None
    assert not kubeconfig.expired(info)
    assert kubeconfig.expired(info, info.expiration + datetime.timedelta(seconds=1))


def test_an_exec_plugin_runs_with_its_env_and_the_exec_info(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, os, sys\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "token = f\"{os.environ['GREETING']}-{sys.argv[1]}-{info['spec']['interactive']}\"\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "    'status': {'token': token, 'expirationTimestamp': '2030-01-02T03:04:05Z'}}))\n"
    )
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": [str(plugin), "arg"],
        "env": [{"name": "GREETING", "value": "hello"}],
    }
    info = kubeconfig.load(str(write(tmp_path / "config", config({"exec": exec_}))), None, environ={})
    assert info.token == "hello-arg-False"
    assert info.expiration == datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def test_a_failing_exec_plugin_says_what_it_printed(tmp_path: Path) -> None:
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": sys.executable,
        "args": ["-c", "import sys; sys.exit('no credentials for you')"],
    }
    with pytest.raises(kubeconfig.ConfigError, match="no credentials for you"):
        kubeconfig.load(str(write(tmp_path / "config", config({"exec": exec_}))), None, environ={})


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    info = kubeconfig.in_cluster(environ, tmp_path)
    assert (info.server, info.token, info.ca_path) == ("https://[fd00::1]:6443", "sa-token", str(tmp_path / "ca.crt"))
    assert info.expiration is not None  # read again, as the kubelet rotates it
    with pytest.raises(kubeconfig.ConfigError, match="automountServiceAccountToken"):
        kubeconfig.in_cluster(environ, tmp_path / "absent")


def test_the_operator_process_never_loads_the_kubernetes_client() -> None:
    """The client library is installed here (the tests use it); the operator's entry point keeps kopf from
    importing its models all the same."""
    probe = "import sys, epd_operator.main, kopf; print(sorted(m for m in sys.modules if m.startswith('kubernetes')))"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(found.replace("'", '"')) == ["kubernetes"]  # the blocked entry only

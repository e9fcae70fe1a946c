"""Where the API server is and who the operator is to it: a kubeconfig (file and context) or the pod's service
account, read into kopf's `ConnectionInfo`, which kopf's watches and our client (module _kube) both connect with.

Our own reader rather than the Kubernetes client library's: importing that library costs the operator about a
third of its memory (its generated models), and kopf imports those models whenever the library is installed.
Read, as kubectl reads them: several files in $KUBECONFIG (the first to define a name wins), paths relative to
the file that names them, certificates, keys and the CA as files or data, insecure-skip-tls-verify, proxy-url, a
token or tokenFile, and exec credential plugins (client.authentication.k8s.io v1 and v1beta1). Refused with the
fix: auth-provider (kubectl dropped it for exec plugins).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf
import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_FILE_TTL = datetime.timedelta(seconds=60)
"""A token read from a file (a service account's rotates) is read again after this, as client-go does."""
EXEC_TIMEOUT_S = 60.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class ConfigError(Exception):
    """No usable configuration: the message says which file, context or field, and what to do."""


def load(kubeconfig: str | None, context: str | None, environ: Mapping[str, str] = os.environ) -> kopf.ConnectionInfo:
    """The connection `kubeconfig` (a path, or several joined by os.pathsep) and `context` describe; without a
    kubeconfig, the pod's service account when in a cluster, else ~/.kube/config."""
    if kubeconfig is None and environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(environ)
    paths = [Path(p).expanduser() for p in (kubeconfig or "~/.kube/config").split(os.pathsep) if p]
    if len(paths) > 1:  # as kubectl: files of a list that do not exist are skipped
        paths = [p for p in paths if p.exists()] or paths[:1]
    files = []
    for path in paths:
        try:
            files.append((path, yaml.safe_load(path.read_text()) or {}))
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"kubeconfig {path}: {exc}. Fix: pass --kubeconfig with a readable file") from exc
    return from_files(files, context, environ)


def in_cluster(environ: Mapping[str, str] = os.environ, account: Path = SERVICE_ACCOUNT) -> kopf.ConnectionInfo:
    host, port = environ["KUBERNETES_SERVICE_HOST"], environ.get("KUBERNETES_SERVICE_PORT", "443")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    try:
        token = (account / "token").read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"in-cluster: {exc}. Fix: mount the service account token (automountServiceAccountToken)"
        ) from exc
    return kopf.ConnectionInfo(
        server=server, ca_path=str(account / "ca.crt"), token=token, scheme="Bearer", expiration=_now() + TOKEN_FILE_TTL
    )


def from_files(
    files: list[tuple[Path, Mapping[str, Any]]], context: str | None, environ: Mapping[str, str] = os.environ
) -> kopf.ConnectionInfo:
    """The connection of `context` (default: the first current-context) in parsed kubeconfig files."""
    current: str | None = None
    named: dict[str, dict[str, tuple[Path, Mapping[str, Any]]]] = {"contexts": {}, "clusters": {}, "users": {}}
    for path, doc in files:
        current = current or doc.get("current-context") or None
        for section, entries in named.items():
            field = section[:-1]
            for item in doc.get(section) or []:
                entries.setdefault(str(item.get("name")), (path.parent, item.get(field) or {}))
    name = context or current
    where = ", ".join(str(p) for p, _ in files)
    if not name:
        raise ConfigError(f"kubeconfig {where} sets no current-context. Fix: pass --context")
    if name not in named["contexts"]:
        raise ConfigError(
            f"kubeconfig {where} has no context {name!r}. Fix: pass --context with one of {sorted(named['contexts'])}"
        )
    ctx = named["contexts"][name][1]
    cluster_name, user_name = str(ctx.get("cluster")), str(ctx.get("user", ""))
    if cluster_name not in named["clusters"]:
        raise ConfigError(f"kubeconfig {where}: context {name!r} names cluster {cluster_name!r}, which is not defined")
    base, cluster = named["clusters"][cluster_name]
    user_base, user = named["users"].get(user_name, (base, {}))
    if "auth-provider" in user:
        raise ConfigError(
            f"kubeconfig {where}: user {user_name!r} uses auth-provider, which kubectl no longer supports. "
            "Fix: use the provider's exec plugin (users[].user.exec)"
        )
    creds = _exec(user["exec"], user_base, environ) if user.get("exec") else {}
    token, expiration = user.get("token"), creds.get("expiration")
    if not token and user.get("tokenFile"):
        token = _path(user_base, user["tokenFile"]).read_text().strip()
        expiration = _now() + TOKEN_FILE_TTL
    return kopf.ConnectionInfo(
        server=str(cluster.get("server", "")),
        ca_path=_optional_path(base, cluster.get("certificate-authority")),
        ca_data=cluster.get("certificate-authority-data"),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        certificate_path=_optional_path(user_base, user.get("client-certificate")),
        certificate_data=creds.get("certificate_data") or user.get("client-certificate-data"),
        private_key_path=_optional_path(user_base, user.get("client-key")),
        private_key_data=creds.get("private_key_data") or user.get("client-key-data"),
        username=user.get("username"),
        password=user.get("password"),
        token=creds.get("token") or token,
        scheme="Bearer" if creds.get("token") or token else None,
        default_namespace=ctx.get("namespace"),
        proxy_url=cluster.get("proxy-url"),
        expiration=expiration,
    )


def _exec(plugin: Mapping[str, Any], base: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """Run an exec credential plugin; its token or client certificate, and when they expire."""
    version = plugin.get("apiVersion")
    if version not in EXEC_API_VERSIONS:
        raise ConfigError(f"exec plugin apiVersion {version!r} is not one of {list(EXEC_API_VERSIONS)}")
    command = str(plugin.get("command", ""))
    if "/" in command and not command.startswith("/"):
        command = str(base / command)  # a relative path is relative to the kubeconfig, as kubectl has it
    info = {"apiVersion": version, "kind": "ExecCredential", "spec": {"interactive": False}}
    env = {
        **environ,
        **{e["name"]: e["value"] for e in plugin.get("env") or []},
        "KUBERNETES_EXEC_INFO": json.dumps(info),
    }
    try:
        run = subprocess.run(
            [command, *map(str, plugin.get("args") or [])],
            env=env, capture_output=True, text=True, timeout=EXEC_TIMEOUT_S, check=True,
        )  # fmt: skip
        status = json.loads(run.stdout).get("status") or {}
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        stderr = getattr(exc, "stderr", "") or ""
        raise ConfigError(f"exec plugin {command}: {exc} {stderr.strip()}".strip()) from exc
    expires = status.get("expirationTimestamp")
    return {
        "token": status.get("token"),
        "certificate_data": status.get("clientCertificateData"),
        "private_key_data": status.get("clientKeyData"),
        "expiration": datetime.datetime.fromisoformat(expires.replace("Z", "+00:00")) if expires else None,
    }


def _path(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _optional_path(base: Path, value: Any) -> str | None:
    return str(_path(base, str(value))) if value else None


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def expired(info: kopf.ConnectionInfo, now: datetime.datetime | None = None) -> bool:
    """Whether `info` should be loaded again before the next request."""
    if info.expiration is None:
        return False
    when = info.expiration if info.expiration.tzinfo else info.expiration.replace(tzinfo=datetime.UTC)
    return (now or _now()) >= when

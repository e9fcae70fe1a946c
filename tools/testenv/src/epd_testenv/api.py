"""A few raw HTTPS calls to the local apiserver, for bringing the cluster up.

`cluster up` polls /readyz and creates a handful of objects; the standard library does that in milliseconds,
where importing the kubernetes client alone takes about a second of the 20-second budget. Tests use the real
kubernetes client (tests/cluster/conftest.py).
"""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from typing import Any

from epd_testenv import pki as pki_

TIMEOUT_S = 5.0
"""Per request: the apiserver is local, so anything slower means it is not up yet."""


class ApiError(Exception):
    """The apiserver answered with an unexpected status, or could not be reached."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


@dataclass(frozen=True)
class Client:
    """Talks to one apiserver on loopback as the admin identity."""

    host: str
    port: int
    pki: pki_.Pki

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.client_cert("admin")), str(self.pki.client_key("admin")))
        return context

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        """Send one request; returns the status and the decoded JSON (or text) body."""
        connection = http.client.HTTPSConnection(self.host, self.port, context=self._context(), timeout=TIMEOUT_S)
        try:
            headers = {"Accept": "application/json"}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            raw = response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as error:
            raise ApiError(0, f"{method} {path}: {error}") from error
        finally:
            connection.close()
        try:
            return response.status, json.loads(raw)
        except json.JSONDecodeError:
            return response.status, raw

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        if status != 200:
            raise ApiError(status, f"GET {path}: {body}")
        return body

    def patch_status(self, path: str, patch: dict[str, Any]) -> None:
        """A strategic-merge patch of an object's status subresource."""
        status, answer = self.request("PATCH", f"{path}/status", patch, "application/strategic-merge-patch+json")
        if status != 200:
            raise ApiError(status, f"PATCH {path}/status: {answer}")

    def create(self, path: str, body: dict[str, Any]) -> bool:
        """POST an object; False when it already exists (so bring-up steps may be repeated)."""
        status, answer = self.request("POST", path, body)
        if status == 409:
            return False
        if status not in (200, 201):
            raise ApiError(status, f"POST {path}: {answer}")
        return True

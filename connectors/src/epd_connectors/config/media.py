"""Which media URLs a deployment fetches: the hosts its vLLM instances may download from and the directory they
may read, as vLLM's own options and as the proxy's check before any backend sees a request.

vLLM fetches an http(s) media URL from inside the cluster, so an open fetcher reaches whatever the pod reaches.
vLLM (0.32-0.34) closes it only through an allow-list of exact host names (`--allowed-media-domains`, checked
on the first URL only: redirects are followed unless VLLM_MEDIA_URL_ALLOW_REDIRECTS=0), and has no switch that
turns fetching off; an allow-list of one name that never resolves does.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated

from pydantic import BeforeValidator, field_validator

from epd_connectors.config.base import ConfigModel, as_tuple, rule_error

DOMAINS_FLAG = "--allowed-media-domains"
LOCAL_PATH_FLAG = "--allowed-local-media-path"
REDIRECTS_ENV = "VLLM_MEDIA_URL_ALLOW_REDIRECTS"
NO_HOST = "media-fetching-is-off.invalid"
"""The allow-list that allows nothing: `.invalid` never resolves (RFC 2606)."""
HOST_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
"""A lower-case host name or IPv4 address: vLLM compares the URL's lower-cased host with each entry as given."""


class MediaAccess(ConfigModel):
    """The media URLs a deployment's instances may load besides inline data URLs."""

    domains: Annotated[tuple[str, ...], BeforeValidator(as_tuple)] | None = None
    """Hosts http(s) media URLs may name (exact names, as vLLM matches them); empty: none, the media must come
    inline; None: any host (vLLM's default)."""
    local_path: str | None = None
    """The directory file:// media URLs may name files under (vLLM --allowed-local-media-path); None: none."""

    @field_validator("domains")
    @classmethod
    def _hosts(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for host in value or ():
            if not HOST_NAME.match(host):
                raise rule_error(
                    "media.domains",
                    host,
                    "is not a lower-case host name",
                    "give the host alone, e.g. images.example.com",
                )
        return value

    @field_validator("local_path")
    @classmethod
    def _directory(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or posixpath.normpath(value) in ("/", "//")):
            raise rule_error("media.local_path", value, "is not an absolute directory below /", "give e.g. /media")
        return value

    @property
    def fetches_any_host(self) -> bool:
        return self.domains is None

    def allows_host(self, host: str) -> bool:
        return self.domains is None or host.lower() in self.domains

    def allows_file(self, path: str) -> bool:
        """Whether `path` (a file URL's path, percent-decoded) is below the local directory, as vLLM requires."""
        if self.local_path is None:
            return False
        root = posixpath.normpath(self.local_path)
        return posixpath.normpath(path).startswith(root.rstrip("/") + "/")

    def vllm_args(self) -> list[str]:
        args = [] if self.domains is None else [DOMAINS_FLAG, *(self.domains or (NO_HOST,))]
        if self.local_path is not None:
            args += [LOCAL_PATH_FLAG, self.local_path]
        return args

    def vllm_env(self) -> dict[str, str]:
        """An allow-list is checked on the first URL only: a redirect from an allowed host would get round it."""
        return {} if self.domains is None else {REDIRECTS_ENV: "0"}

"""The proxy's tunables as small value objects, each default a named constant with its unit and reason.

Timeouts and limits travel together through the flow, so they are frozen dataclasses (as httpx does) rather
than loose keyword arguments; the command line and the tests build them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epd_connectors.config.bundle import CanaryMedia, KVProtocol
from epd_connectors.config.media import MediaAccess

DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""Seconds to open a TCP connection to a backend; a pod that takes longer is as good as down."""
DEFAULT_ENCODE_TIMEOUT_S = 120.0
"""Seconds for one encoder batch; large videos on a busy encoder take tens of seconds."""
DEFAULT_PREFILL_TIMEOUT_S = 300.0
"""Seconds for the prefill answer (one token); long prompts queue behind others."""
DEFAULT_FIRST_TOKEN_TIMEOUT_S = 300.0
"""Seconds from sending the decode/PD request to its first byte (the PD instance may be prefilling)."""
DEFAULT_TOTAL_TIMEOUT_S = 3600.0
"""Seconds for a whole request; a guard against streams that never end."""
DEFAULT_PROBE_TIMEOUT_S = 2.0
"""Seconds for one health probe; vLLM answers /health at once when alive."""

DEFAULT_RETRIES = 2
"""Extra attempts on another instance after a connect error or a 5xx before the first byte."""
DEFAULT_ENCODER_BATCH_MAX = 8
"""Most media items in one encoder request; larger groups are split so no request holds an encoder long."""
DEFAULT_PROBE_INTERVAL_S = 2.0
"""Seconds between health probes of one instance; 0 turns probing off (see Limits.probing)."""
DEFAULT_EVICT_AFTER = 2
"""Consecutive failed probes that take an instance out of routing (one blip is forgiven)."""
DEFAULT_READMIT_AFTER = 1
"""Consecutive good probes that bring an evicted instance back."""
DEFAULT_SLOW_PROBE_GRACE_S = 15.0
"""Seconds an instance may leave probes unanswered (it accepts the connection, then says nothing in time) before
that evicts it. On a saturated node a busy engine's /health can stall for seconds, and evicting every instance
of a role for that turns a slow moment into 503s; a refused connection or an error status still counts at once."""
"""Consecutive good probes that bring an evicted instance back."""
DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
"""Largest request body accepted (bytes); inline base64 videos are big, unbounded bodies are an attack."""
DEFAULT_HEAD_TIMEOUT_S = 10.0
"""Seconds from a connection's or request's first byte to the end of its head (nginx's client_header_timeout
idea): a head is a few hundred bytes, so a client that takes longer is stalled or hostile."""
DEFAULT_BODY_TIMEOUT_S = 30.0
"""Seconds the proxy waits for the next piece of a request body (nginx's client_body_timeout): a slow upload
keeps going as long as it moves."""
DEFAULT_KEEPALIVE_S = 75.0
"""Seconds an idle client connection is kept: longer than the usual client pools' 60 s, so they close first."""
DEFAULT_MAX_CONNECTIONS = 10_000
"""Client connections open at once; one more is answered 503 and closed (each holds buffers and a parser)."""

DEFAULT_CANARY_INTERVAL_S = 60.0
"""Seconds between canaries of a transfer path that works; 0 turns canaries off (see Canary.on)."""
DEFAULT_CANARY_RETRY_S = 5.0
"""Seconds between canaries of a path that failed its last one, so a repaired path returns within seconds."""
DEFAULT_CANARY_TIMEOUT_S = 30.0
"""Seconds for one canary. It is a tiny image and one token, but it queues behind user requests; a push that
never arrives shows as this timeout (or as the consumer's own push_wait_timeout_s, 60 s, when shorter)."""
DEFAULT_CANARY_FAILURES = 2
"""Consecutive failed canaries that take a path out of routing: one slow canary under load is forgiven."""


@dataclass(frozen=True)
class Timeouts:
    """Per-stage time limits, in seconds."""

    connect: float = DEFAULT_CONNECT_TIMEOUT_S
    encode: float = DEFAULT_ENCODE_TIMEOUT_S
    prefill: float = DEFAULT_PREFILL_TIMEOUT_S
    first_token: float = DEFAULT_FIRST_TOKEN_TIMEOUT_S
    total: float = DEFAULT_TOTAL_TIMEOUT_S
    probe: float = DEFAULT_PROBE_TIMEOUT_S


@dataclass(frozen=True)
class Limits:
    """Bounds on retries, batching and probing."""

    retries: int = DEFAULT_RETRIES
    encoder_batch_max: int = DEFAULT_ENCODER_BATCH_MAX
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    evict_after: int = DEFAULT_EVICT_AFTER
    readmit_after: int = DEFAULT_READMIT_AFTER
    slow_probe_grace_s: float = DEFAULT_SLOW_PROBE_GRACE_S

    @property
    def probing(self) -> bool:
        """Whether the proxy probes its instances at all. An interval of 0 (or less) means no: every instance
        counts as healthy as configured or discovered (discovery lists only Ready pods), and nothing but a
        client's request is ever sent to one. That is for a proxy that must not reach its instances, such as
        the cluster tests' proxy, whose discovered pods are simulated addresses nothing may connect to. Without
        a prober nothing readmits an instance a failed request took out of routing, so a serving proxy keeps
        probing."""
        return self.probe_interval_s > 0


@dataclass(frozen=True)
class Clients:
    """What the proxy allows its clients: body size, how long a head or body may take, idle time, how many."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keepalive_s: float = DEFAULT_KEEPALIVE_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS


@dataclass(frozen=True)
class Canary:
    """How the proxy proves its transfer paths (module canary)."""

    interval_s: float = DEFAULT_CANARY_INTERVAL_S
    retry_s: float = DEFAULT_CANARY_RETRY_S
    timeout_s: float = DEFAULT_CANARY_TIMEOUT_S
    failures: int = DEFAULT_CANARY_FAILURES
    media: CanaryMedia = "image"
    """What an encoder-to-consumer canary carries (canary.canary_body)."""

    @property
    def on(self) -> bool:
        """Whether canaries run at all; an interval of 0 (or less) means no, and every path counts as working."""
        return self.interval_s > 0


@dataclass(frozen=True)
class ProxyOptions:
    """Everything about behaviour that is not the roster."""

    timeouts: Timeouts = field(default_factory=Timeouts)
    limits: Limits = field(default_factory=Limits)
    encoder_affinity: bool = True
    """Route a media item by its uuid to the encoder that saw it before (consistent hashing)."""
    kv_protocol: KVProtocol = KVProtocol.PASSIVE
    canary: Canary = field(default_factory=Canary)
    clients: Clients = field(default_factory=Clients)
    media: MediaAccess = field(default_factory=MediaAccess)
    """The media URLs a request may carry (the deployment's; any host when run by hand without a bundle)."""
    encoder_wake_s: float = 0.0
    """How long a media request waits for an encoder while encoders are at zero; 0: they are never at zero."""

"""Settings: one pydantic-settings object, read from ``OPML_*`` environment variables.

>>> Settings(port=9000).port
9000
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service; each field is ``OPML_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="OPML_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Interface uvicorn binds to.")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port of the HTTP/WS API.")
    data_dir: Path = Field(
        default=Path("data"),
        description="Embedded Redis: its working dir (AOF files, pid/port file).",
    )
    redis_url: str | None = Field(
        default=None,
        description="Use this Redis (>= 6.2) instead of starting the embedded one: a single "
        "server, any node of a Redis Cluster, or several cluster nodes separated by commas.",
    )
    redis_appendfsync: Literal["always", "everysec", "no"] = Field(
        default="always", description="Embedded Redis AOF fsync policy (always: an ack is on disk)."
    )
    redis_aof_rewrite_min_mb: int = Field(
        default=1024,
        ge=1,
        description="Embedded Redis: compact (rewrite) the AOF only once it is at least this "
        "many MB (and twice its size after the last rewrite). Below 1 GB a stream of vectors "
        "rewrites it every few seconds, each rewrite stalling appends.",
    )
    redis_timeout_s: float = Field(
        default=2.0, gt=0, description="Bound on every Redis call; past it the API answers 503."
    )
    redis_wait_replicas: int = Field(
        default=0,
        ge=0,
        description="Acknowledge a sample or metric append only after WAIT confirmed this many "
        "Redis replicas have it (else 503; retry with the same idempotency key); 0: an ack means "
        "'in the master'. Every process of a keyspace must use the same value.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = Field(
        default="info", description="uvicorn / service log level."
    )
    access_log: bool = Field(
        default=False,
        description="Log a line per HTTP request and WebSocket connection (uvicorn's access "
        "log, at info level). Off by default (the telemetry counts requests); on at "
        "OPML_LOG_LEVEL=debug too.",
    )
    keep_large_buffers: bool = Field(
        default=True,
        description="On glibc, raise malloc's thresholds at start-up so that freed buffers "
        "up to 4 MiB are reused instead of faulted in again (binary frames: 3-15 % less "
        "CPU per sample; the resident size can stay up to 16 MiB per heap above what is "
        "in use). Also left off when the environment tunes malloc itself (GLIBC_TUNABLES, "
        "MALLOC_*_).",
    )

    # -- security (service/security.py) --
    api_keys: list[str] = Field(
        default_factory=list,
        description='API keys as JSON list of "<sha256 hex of the key>:<scope>,<scope>" entries '
        "(scopes: ingest, query, admin); empty: no authentication (loopback only). An entry "
        'with a third part, "<hash>:<scopes>:<models>", limits its key to those models: a '
        "'|'-separated list of names and prefixes ending in '*' (tenant-a-*|shared); other "
        "models answer it 403 whether they exist or not, and the model list shows it only "
        "its own. python -m service.security new --scopes ingest --models 'tenant-a-*' makes "
        "one. A malformed entry stops the start with an error naming OPML_API_KEYS.",
    )
    allow_insecure_bind: bool = Field(
        default=False,
        description="Allow binding a non-loopback host without API keys (anyone can write).",
    )

    lean_path: bool = Field(
        default=True,
        description="Answer the hot queries (distance, verify, identify) on the lean path, without "
        "FastAPI's per-request machinery (same parsers and answers; false: every request goes "
        "through its FastAPI route).",
    )

    # -- several processes on one Redis (service/engine/registry.py, service/api/forward.py) --
    advertise_url: str | None = Field(
        default=None,
        description="The base URL other service processes reach this one at (requests for a "
        "model this process learns are forwarded to it); default http://<host>:<port>, with "
        "this machine's name when bound to all interfaces.",
    )
    lease_ttl_s: float = Field(
        default=10.0,
        ge=0.5,
        description="A model's writer lease; a dead owner is replaced within about this long.",
    )
    poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="How often a model's writer looks for log entries appended by other "
        "processes (its own appends wake it at once).",
    )

    # -- learner and durability --
    batch_max: int = Field(
        default=4096,
        ge=1,
        description="Most samples the learner applies per batch (about: it reads whole log "
        "entries, one request or frame each, at least one); fewer at large d (2^24 / d^2; "
        "sgd_psd: 2^22 / d^3).",
    )
    max_unapplied: int = Field(
        default=0,
        ge=0,
        description="Backpressure: new appends wait while more than this many logged samples "
        "are not yet applied by the learner (at most OPML_APPLY_WAIT_S, then 503); bounds the "
        "ack-to-applied lag and the log's growth under overload. 0 = automatic: two learner "
        "batches, at most 8192 (8192 at d = 64, 2048 at d = 128, 128 at d = 512).",
    )
    checkpoint_every: int = Field(
        default=10_000, ge=1, description="Checkpoint after this many samples applied ..."
    )
    checkpoint_interval_s: float = Field(
        default=30.0, gt=0, description="... or this many seconds after a change, whichever first."
    )
    idempotency_ttl_s: int = Field(
        default=86_400, ge=1, description="Retention of Idempotency-Key / WS frame id answers."
    )
    idempotency_max_records: int = Field(
        default=1_000_000,
        ge=0,
        description="Most Idempotency-Key / WS frame id answers a model keeps (each ~250 B of "
        "Redis memory): past it the oldest go before their retention ends, so memory stays "
        "bounded whatever the rate; 0: no cap (retention alone).",
    )

    # -- certificates (service/engine/certify.py) --
    certificate_every: int = Field(
        default=0,
        ge=0,
        description="Refresh the opml_certificate_* gauges of each model that holds samples "
        "out every this many versions (a held-out test-set certificate, method binomial); "
        "0: off.",
    )
    certificate_delta: float = Field(
        default=0.05, gt=0, le=0.3, description="delta of those periodic certificates."
    )
    certificate_false_accept_target: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Exported as opml_certificate_false_accept_target; the alert "
        "OpmlCertifiedFalseAcceptAboveTarget fires when a model's certified false accept "
        "bound exceeds it (unset: no target, no alert).",
    )

    # -- waits --
    min_version_wait_s: float = Field(default=5.0, ge=0, description="Bound on a min_version wait.")
    apply_wait_s: float = Field(
        default=30.0, gt=0, description="Bound on ?wait=true and PUT metric."
    )

    # -- limits --
    max_body_bytes: int = Field(
        default=32 * 2**20, ge=1024, description="Largest HTTP body / WS frame."
    )
    max_batch: int = Field(
        default=10_000, ge=1, description="Most samples in one request or frame."
    )
    max_dim: int = Field(default=1024, ge=1, description="Largest model dimension d.")
    max_classes: int = Field(
        default=10_000, ge=1, description="Most classes (buffer rows) per model."
    )
    max_models: int = Field(default=1000, ge=1, description="Most models in one service.")
    max_gallery: int = Field(
        default=100_000,
        ge=1,
        description="Most items in one model's identification gallery (each costs 2 d float64 "
        "in the process that serves it, G and G L^T, and d float64 in Redis).",
    )
    # -- slow clients (service/api/protocol.py) --
    head_timeout_s: float = Field(
        default=10.0,
        ge=0,
        description="A connection must send a complete request head within this many seconds "
        "of opening (or of the head's first byte, on a kept-alive connection); else it is "
        "answered 408 and closed (closed without an answer if it sent nothing). 0: no limit. "
        "Behind a reverse proxy, have the proxy bound its clients the same way (nginx "
        "client_header_timeout, HAProxy timeout http-request).",
    )
    body_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="A request body may take this many seconds plus one second per "
        "OPML_BODY_MIN_RATE bytes received; past that it is answered 408 (if nothing was "
        "answered yet) and the connection closed.",
    )
    body_min_rate: int = Field(
        default=1024,
        ge=0,
        description="Least request body rate in bytes/s after OPML_BODY_GRACE_S (a stalled "
        "upload is cut off, a slow steady one is not); 0: no limit. Behind a reverse proxy, "
        "have the proxy bound its clients' bodies (nginx client_body_timeout, HAProxy timeout "
        "http-request), or buffer them, so that it is never itself the slow client.",
    )
    ws_window: int = Field(
        default=32, ge=1, description="WS ingestion frames in flight per connection."
    )
    ws_per_message_deflate: bool = Field(
        default=False,
        description="Accept a WebSocket client's offer of permessage-deflate compression. Off: "
        "Python's websockets and browsers offer it by default, and on one-sample JSON frames "
        "it costs more CPU per frame than it saves in bytes, lowering the frames per second a "
        "connection sustains (`python3 dev.py bench ingest` measures both). On: for large "
        "frames on a slow or metered network, where fewer bytes are worth the CPU.",
    )
    events_queue: int = Field(
        default=16, ge=1, description="Undelivered /events frames kept per reader."
    )

    @model_validator(mode="after")
    def _replicas_need_a_redis_url(self) -> Settings:
        if self.redis_wait_replicas and self.redis_url is None:
            raise ValueError(
                "redis_wait_replicas: the embedded Redis has no replicas, so no append could "
                "ever be acknowledged; set OPML_REDIS_URL to a Redis with replicas, or use 0"
            )
        return self


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings (read once from the environment)."""
    return Settings()

"""The models of this service process: registry, loading, and the operations routes call.

Every process on a Redis keyspace keeps one :class:`ModelRuntime` per model. A lease loop (every
``OPML_LEASE_TTL_S / 3``) renews or takes each model's lease, so exactly one process owns (and
checkpoints) each model while the others follow its log as read replicas; the same loop syncs
the registry, so a model created or deleted through another process appears or goes here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from redis.exceptions import RedisError

from service import telemetry
from service.config import Settings
from service.core import LearnerConfig
from service.core.calibration import MIN_PAIRS
from service.core.certificates import served_threshold
from service.errors import Conflict, LimitExceeded, NotFound, ServiceError, Unavailable
from service.models import inputs
from service.models.runtime import ModelClosed, ModelRuntime, Snapshot
from service.models.schemas import ModelCreate, Sample
from service.storage.codec import StreamId, encode_vector, sample_id
from service.storage.store import Appended, Group, NoSuchModel, Store, TooManyClasses

log = logging.getLogger("service.models")


@dataclass(frozen=True)
class IngestResult:
    """What an ingestion request gets back."""

    accepted: int
    first_seq: int
    last_seq: int
    replayed: bool
    version: int | None = None
    results: list[dict[str, Any]] | None = None


class ModelService:
    """Registry of the loaded models plus every model operation (create, ingest, ...)."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.runtimes: dict[str, ModelRuntime] = {}
        self.loaded = asyncio.Event()
        self._loader: asyncio.Task[None] | None = None
        self._leases: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # create / delete / load
        #: This process in lease values (``<token> <owner id>``): host, pid and a random tag.
        self.owner_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load every model in the background (retrying while Redis is unreachable)."""
        self._loader = asyncio.create_task(self._load_all(), name="load-models")
        self._leases = asyncio.create_task(self._keep_leases(), name="leases")

    async def _load_all(self) -> None:
        delay = 0.1
        while True:
            try:
                version = await self.store.server_version()
                if version < (6, 2):
                    log.error("Redis %s is too old; 6.2 or newer is needed", version)
                async with self._lock:
                    for name in await self.store.model_names():
                        if name not in self.runtimes:
                            await self._load(name)
                for runtime in list(self.runtimes.values()):
                    await runtime.caught_up.wait()
                self.loaded.set()
                log.info("%d model(s) loaded", len(self.runtimes))
                return
            except RedisError as exc:
                telemetry.REDIS_ERRORS.labels("loader").inc()
                log.warning("loading models: Redis unavailable (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _load(self, name: str) -> None:
        meta = await self.store.model_meta(name)
        if meta is None:  # being created (or a create that died): not a model (yet)
            return
        runtime = ModelRuntime(
            name,
            LearnerConfig(**json.loads(meta["config"])),
            float(meta.get("created_at", 0.0)),
            self.store,
            self.settings,
            self.owner_id,
        )
        await runtime.load()
        await runtime.claim()
        runtime.start()
        self.runtimes[name] = runtime

    async def _keep_leases(self) -> None:
        """Renew/take every model's lease and follow creates and deletes of other processes."""
        await self.loaded.wait()
        while True:
            await asyncio.sleep(self.settings.lease_ttl_s / 3)
            try:
                async with self._lock:
                    await self._sync_registry()
                for runtime in list(self.runtimes.values()):
                    await runtime.claim()
            except RedisError as exc:
                telemetry.REDIS_ERRORS.labels("loader").inc()
                log.warning("renewing leases: Redis unavailable (%s); retrying", exc)

    async def _sync_registry(self) -> None:
        names = await self.store.model_names()
        stamps = await self.store.created_stamps(sorted(set(names) | set(self.runtimes)))
        for name, runtime in list(self.runtimes.items()):
            if stamps.get(name) != repr(runtime.created_at):  # deleted (maybe re-created)
                log.info("%s: deleted by another process", name)
                await runtime.stop(checkpoint=False)
                del self.runtimes[name]
                telemetry.forget_model(name)
        for name in names:
            if name not in self.runtimes and stamps.get(name) is not None:
                await self._load(name)

    async def close(self) -> None:
        """Stop every writer after its batch, write final checkpoints, release leases."""
        for task in (self._loader, self._leases):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await asyncio.gather(*(rt.stop(checkpoint=True) for rt in self.runtimes.values()))

    # -- registry ------------------------------------------------------------------------------

    def all(self) -> list[ModelRuntime]:
        """Every model, by name (503 while loading)."""
        if not self.loaded.is_set():
            raise Unavailable("models are still being loaded", retry_after=1)
        return [self.runtimes[n] for n in sorted(self.runtimes)]

    def get(self, name: str) -> ModelRuntime:
        runtime = self.runtimes.get(name)
        if runtime is None:
            if not self.loaded.is_set():
                raise Unavailable("models are still being loaded", retry_after=1)
            raise NotFound(f"model {name!r} does not exist")
        return runtime

    async def create(self, body: ModelCreate) -> ModelRuntime:
        s = self.settings
        if body.dim > s.max_dim:
            raise inputs.invalid(["body", "dim"], f"must be <= {s.max_dim} (OPML_MAX_DIM)")
        config = LearnerConfig(
            dim=body.dim,
            algorithm=body.algorithm,
            gamma=body.gamma,
            gamma_pair=body.gamma_pair,
            margin=body.margin,
            normalize=body.normalize,
            seed=body.seed,
            calibration_window=body.calibration_window,
        )
        if not self.loaded.is_set():
            raise Unavailable("models are still being loaded", retry_after=1)
        async with self._lock:
            if body.name in self.runtimes:
                raise Conflict(f"model {body.name!r} already exists")
            if len(self.runtimes) >= s.max_models:
                raise LimitExceeded(f"at most {s.max_models} models (OPML_MAX_MODELS)")
            created_at = time.time()
            if not await self.store.create_model(body.name, asdict(config), created_at):
                raise Conflict(f"model {body.name!r} already exists")
            runtime = ModelRuntime(body.name, config, created_at, self.store, s, self.owner_id)
            with contextlib.suppress(RedisError):  # else the lease loop takes it shortly
                await runtime.claim()
            runtime.start()
            self.runtimes[body.name] = runtime
            return runtime

    async def delete(self, name: str) -> None:
        async with self._lock:
            runtime = self.get(name)
            await runtime.stop(checkpoint=False)
            del self.runtimes[name]
            await self.store.delete_model(name)
            telemetry.forget_model(name)

    # -- ingestion -----------------------------------------------------------------------------

    async def ingest(
        self,
        name: str,
        items: list[Sample] | inputs.Block,
        *,
        idempotency_field: str = "",
        wait: bool = False,
        loc: list[str | int],
        indexed: bool,
        transport: str,
    ) -> IngestResult:
        """Validate, append atomically to the log, and (``wait``) wait until applied."""
        runtime = self.get(name)
        token = runtime.want_results() if wait else None
        try:
            try:
                appended = await self._append(runtime, items, idempotency_field, loc, indexed)
            except (ServiceError, RedisError) as exc:
                reason = exc.slug if isinstance(exc, ServiceError) else Unavailable.slug
                if reason != NotFound.slug:  # a vanished model has no series to count in
                    telemetry.SAMPLES_REJECTED.labels(name, transport, reason).inc(len(items))
                raise
            n = appended.last_seq - appended.first_seq + 1
            if appended.replayed:
                telemetry.IDEMPOTENT_REPLAYS.labels(name, transport).inc()
            else:
                telemetry.SAMPLES_ACCEPTED.labels(name, transport).inc(n)
            if token is None:
                return IngestResult(n, appended.first_seq, appended.last_seq, appended.replayed)
            runtime.raise_floor(token, appended.first_seq - 1)
            target = (appended.last_seq, 1)
            await self._wait_applied(runtime, target, appended.first_seq, appended.last_seq)
            return IngestResult(
                n,
                appended.first_seq,
                appended.last_seq,
                appended.replayed,
                runtime.snapshot.version,
                runtime.results(appended.first_seq, appended.last_seq),
            )
        finally:
            if token is not None:
                runtime.release(token)

    async def _append(
        self,
        runtime: ModelRuntime,
        items: list[Sample] | inputs.Block,
        idempotency_field: str,
        loc: list[str | int],
        indexed: bool,
    ) -> Appended:
        """Check the samples against the model and the limits, then log them atomically."""
        s = self.settings
        if len(items) > s.max_batch:
            raise LimitExceeded(
                f"{len(items)} samples in one request; at most {s.max_batch} (OPML_MAX_BATCH)"
            )
        if isinstance(items, inputs.Block):
            X, keys = inputs.block(items)
        else:
            X, keys = inputs.samples(items, runtime.config.dim, loc, indexed)
        digest = inputs.fingerprint(X, keys)
        try:
            room = await runtime.wait_room(len(keys), s.apply_wait_s)  # backpressure, in call order
        except ModelClosed:
            raise NotFound(f"model {runtime.name!r} was deleted") from None
        if not room:
            raise Unavailable(
                f"the learner is {runtime.unapplied} samples behind the log (more than "
                f"{runtime.unapplied_limit}: OPML_MAX_UNAPPLIED) and did not catch up within "
                f"{s.apply_wait_s:g} s; nothing was logged, retry later",
                retry_after=2,
            )
        try:
            # No await between the room check and this enqueue: calls are logged in call order.
            appended = await runtime.appender.append(
                Group(encode_vector(X), keys, idempotency_field, digest)
            )
            if not appended.replayed:
                runtime.notify_logged(appended.last_seq)  # before done_appending: no gap
        except NoSuchModel:
            raise NotFound(f"model {runtime.name!r} does not exist") from None
        except TooManyClasses as exc:
            raise LimitExceeded(
                f"the model has {exc.have} classes; at most {s.max_classes} per model "
                "(OPML_MAX_CLASSES)"
            ) from None
        finally:
            runtime.done_appending(len(keys))
        if appended.replayed and appended.fingerprint != digest:
            raise Conflict(
                "this idempotency key / frame id was used for different samples",
                first_seq=appended.first_seq,
                last_seq=appended.last_seq,
            )
        return appended

    async def _wait_applied(
        self, runtime: ModelRuntime, target: StreamId, first: int, last: int
    ) -> None:
        try:
            done = await runtime.wait_applied(target, self.settings.apply_wait_s)
        except ModelClosed:
            raise NotFound(f"model {runtime.name!r} was deleted") from None
        if not done:
            raise Unavailable(
                f"logged as seqs {first}..{last} (entry {sample_id(last)}) but not applied "
                f"within {self.settings.apply_wait_s:g} s; query with min_version={last}",
                retry_after=2,
                first_seq=first,
                last_seq=last,
            )

    async def put_metric(self, name: str, L: list[list[float]]) -> ModelRuntime:
        """Log a metric replacement after every sample logged so far and wait until applied."""
        runtime = self.get(name)
        matrix = inputs.metric(L, runtime.config.dim)
        try:
            entry = await self.store.append_metric(name, encode_vector(matrix))
        except NoSuchModel:
            raise NotFound(f"model {name!r} does not exist") from None
        runtime.notify_logged(entry[0])
        await self._wait_applied(runtime, entry, entry[0], entry[0])
        return runtime

    # -- queries -------------------------------------------------------------------------------

    async def snapshot(self, name: str, min_version: int | None) -> Snapshot:
        """The latest snapshot, after waiting (bounded) for ``min_version`` if given."""
        runtime = self.get(name)
        if min_version is None or runtime.snapshot.version >= min_version:
            return runtime.snapshot
        try:
            done = await runtime.wait_applied((min_version, 1), self.settings.min_version_wait_s)
        except ModelClosed:
            raise NotFound(f"model {name!r} was deleted") from None
        if not done:
            raise Unavailable(
                f"version {min_version} not reached within "
                f"{self.settings.min_version_wait_s:g} s (now {runtime.snapshot.version}, "
                f"logged {runtime.logged_seq})",
                retry_after=1,
                version=runtime.snapshot.version,
            )
        return runtime.snapshot


def model_body(runtime: ModelRuntime) -> dict[str, Any]:
    """The Model document of the contract, from one snapshot."""
    snap = runtime.snapshot
    c = runtime.config
    counts = snap.counts
    ckpt = runtime.checkpoint
    return {
        "name": runtime.name,
        "dim": c.dim,
        "algorithm": c.algorithm,
        "gamma": c.gamma,
        "gamma_pair": c.gamma_pair,
        "margin": c.margin,
        "normalize": c.normalize,
        "seed": c.seed,
        "calibration_window": c.calibration_window,
        "version": snap.version,
        "samples_seen": snap.version,
        "logged_seq": max(runtime.logged_seq, snap.version),
        "classes": snap.classes,
        "updates": updates(counts),
        "verification": verification(snap),
        "metric_puts": snap.metric_puts,
        "checkpoint": {
            "seq": ckpt.seq,
            "age_s": None if ckpt.at is None else max(0.0, time.time() - ckpt.at),
        },
        "created_at": runtime.created_at,
        "owner": runtime.owner,
        "fencing_token": runtime.fencing_token,
        "staleness_s": None
        if runtime.synced_at is None
        else max(0.0, time.monotonic() - runtime.synced_at),
    }


def updates(counts: dict[str, int]) -> dict[str, int]:
    return {
        "triplet": counts["triplet_update"] + counts["shrunk_update"],
        "shrunk": counts["shrunk_update"],
        "pair": counts["pair_update"],
        "passive": counts["passive"],
        "new_class": counts["new_class"],
        "single_class": counts["single_class"],
        "skipped": counts["skipped"],
    }


def verification(snap: Snapshot) -> dict[str, Any]:
    cal = snap.calibration
    return {
        "threshold": cal.threshold,
        "calibrated": cal.calibrated,
        "eer": cal.eer,
        "accuracy": cal.accuracy,
        "pairs": cal.pairs,
        "min_pairs": MIN_PAIRS,
    }


def verify_threshold(snap: Snapshot, margin: float, given: float | None) -> tuple[float, str]:
    """The threshold a verify uses and where it came from (the core's rule, which certificates
    certify by default: :func:`service.core.certificates.served_threshold`)."""
    return served_threshold(snap.calibration, margin, given)


def squared_norms_ok(values: np.ndarray[Any, Any], what: str) -> list[float]:
    """Finite values as a JSON-safe list (422 on float64 overflow)."""
    return [float(v) for v in inputs.finite_or_422(np.asarray(values, dtype=np.float64), what)]

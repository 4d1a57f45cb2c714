"""The models of this service process: loading, creating, deleting, and their leases.

Every process on a Redis keyspace keeps one :class:`~service.engine.runtime.ModelRuntime` per
model. A lease loop (every ``OPML_LEASE_TTL_S / 3``) renews or takes each model's lease, so
exactly one process owns (and checkpoints) each model while the others follow its log as read
replicas; the same loop syncs the registry, so a model created or deleted through another
process appears or goes here too.
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
from dataclasses import asdict

from redis.exceptions import RedisError

from service import telemetry
from service.config import Settings
from service.core import LearnerConfig
from service.engine.runtime import ModelRuntime
from service.errors import Conflict, LimitExceeded, NotFound, Unavailable
from service.storage.store import Store

log = logging.getLogger("service.registry")


class Registry:
    """The loaded models of this process and their lifecycle."""

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
                await self.store.open()  # a single server or a Redis Cluster
                version = await self.store.server_version()
                if version < (6, 2):
                    log.error("Redis %s is too old; 6.2 or newer is needed", version)
                async with self._lock:
                    # the registry may lag behind the models (see service.storage.store)
                    for name in await self.store.repair_registry():
                        if name not in self.runtimes:
                            await self._load(name)
                for runtime in list(self.runtimes.values()):
                    await runtime.writer.caught_up.wait()
                self.loaded.set()
                log.info("%d model(s) loaded", len(self.runtimes))
                return
            except RedisError as exc:
                telemetry.REDIS_ERROR["loader"].inc()
                log.warning("loading models: Redis unavailable (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _load(self, name: str) -> None:
        meta = await self.store.model_meta(name)
        if meta is None:  # being created (or a create that died): not a model (yet)
            return
        runtime = self._runtime(
            name, LearnerConfig(**json.loads(meta["config"])), float(meta.get("created_at", 0.0))
        )
        await runtime.load()
        runtime.start()
        self.runtimes[name] = runtime

    def _runtime(self, name: str, config: LearnerConfig, created_at: float) -> ModelRuntime:
        return ModelRuntime(name, config, created_at, self.store, self.settings, self.owner_id)

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
                telemetry.REDIS_ERROR["loader"].inc()
                log.warning("renewing leases: Redis unavailable (%s); retrying", exc)

    async def _sync_registry(self) -> None:
        names = await self.store.model_names()
        stamps = await self.store.created_stamps(sorted(set(names) | set(self.runtimes)))
        for name, runtime in list(self.runtimes.items()):
            if stamps.get(name) != repr(runtime.created_at):  # deleted (maybe re-created)
                log.info("%s: deleted by another process", name)
                await self._drop(runtime, checkpoint=False)
        for name in names:
            if name not in self.runtimes and stamps.get(name) is not None:
                await self._load(name)

    async def _drop(self, runtime: ModelRuntime, *, checkpoint: bool) -> None:
        await runtime.stop(checkpoint=checkpoint)
        del self.runtimes[runtime.name]
        runtime.metrics.forget()

    async def close(self) -> None:
        """Stop every writer after its batch, write final checkpoints, release leases."""
        for task in (self._loader, self._leases):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await asyncio.gather(*(rt.stop(checkpoint=True) for rt in self.runtimes.values()))

    # -- the models ----------------------------------------------------------------------------

    def all(self) -> list[ModelRuntime]:
        """Every model, by name (Unavailable while loading)."""
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

    async def create(self, name: str, config: LearnerConfig) -> ModelRuntime:
        """A new model (Conflict if the name exists, LimitExceeded past OPML_MAX_MODELS)."""
        if not self.loaded.is_set():
            raise Unavailable("models are still being loaded", retry_after=1)
        async with self._lock:
            if name in self.runtimes:
                raise Conflict(f"model {name!r} already exists")
            if len(self.runtimes) >= self.settings.max_models:
                raise LimitExceeded(f"at most {self.settings.max_models} models (OPML_MAX_MODELS)")
            created_at = time.time()
            if not await self.store.create_model(name, asdict(config), created_at):
                raise Conflict(f"model {name!r} already exists")
            runtime = self._runtime(name, config, created_at)
            with contextlib.suppress(RedisError):  # else the lease loop takes it shortly
                await runtime.claim()
            runtime.start()
            self.runtimes[name] = runtime
            return runtime

    async def delete(self, name: str) -> None:
        async with self._lock:
            runtime = self.get(name)
            await self._drop(runtime, checkpoint=False)
            await self.store.delete_model(name)

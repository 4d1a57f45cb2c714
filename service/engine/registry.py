"""The models of this service process: loading, creating, deleting, and who learns each one.

Several processes may share one Redis keyspace (or Redis Cluster). Every process knows every
model (its configuration; it can append to its log), but each model is learned by exactly one
of them, its owner: the process holding its writer lease (:mod:`service.engine.lease`). Which
process that should be is decided by rendezvous hashing over the live members
(:mod:`service.engine.membership`), so models spread evenly and about 1/N of them move when a
process joins or leaves.

A placement loop runs every third of ``OPML_LEASE_TTL_S``: heartbeat (membership), follow the
model index (models created or deleted through other processes), then for each model renew the
lease of the models this process learns and should keep, hand over gracefully those that
should move (final checkpoint, then release), and take the ones that should be here once their
lease is free (load checkpoint + replay the log tail, in the background). A graceful stop
leaves the membership and hands everything over at once; a process that dies loses its models
when its leases expire (within the TTL).

Appends made through any process but the model's owner are announced on the model's own
wake channel (:mod:`service.storage.notices`) by the append script itself (the owner wakes its
writer directly). The listener here subscribes to the channels of the models this process
learns or should learn, and to no others (an append costs one notification in the whole
deployment, not one per process); it wakes the owner's writer at once, and also retries the
take-over of a model whose previous owner just released it. The subscriptions follow
placement (recomputed when it may have changed, looked at every :data:`_LISTEN_TICK_S`); a
subscription's confirmation wakes the model's writer too, so an append made before it took
effect is read then, not at the writer's next poll.
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

from service import telemetry
from service.config import Settings
from service.core import LearnerConfig
from service.engine.membership import Membership
from service.engine.runtime import ModelRuntime
from service.engine.tasks import stop_task, wait_event
from service.errors import Conflict, LimitExceeded, NotFound, StorageUnavailable, Unavailable
from service.storage.store import Listener, Store

log = logging.getLogger("service.registry")

#: A model whose lease another process holds is retried on an append notification at most this
#: often (a released model is taken over at once, without a busy loop).
_RETRY_TAKE_S = 0.1
#: The append listener looks at placement changes (its subscriptions) at least this often.
_LISTEN_TICK_S = 0.1


class Registry:
    """The models known to this process, and which of them it learns."""

    def __init__(self, store: Store, settings: Settings, url: str = "") -> None:
        self.store = store
        self.settings = settings
        self.runtimes: dict[str, ModelRuntime] = {}
        self.loaded = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = asyncio.Event()  # the loops stop when it is set (see engine/tasks.py)
        self._lock = asyncio.Lock()  # create / delete / model index sync
        self._tried: dict[str, float] = {}  # model -> monotonic time of the last take-over try
        self._placed = 0  # bumped whenever placement may have changed (the listener follows)
        #: This process in lease values and the members hash: its advertised URL (no two live
        #: processes share one; a process restarted on the same address, after a crash, takes
        #: its previous incarnation's leases at once instead of waiting for them to expire).
        self.owner_id = url or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.membership = Membership(store, self.owner_id, url, settings.lease_ttl_s)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load the models in the background (retrying while Redis is unreachable), then keep
        placing them; listen for appends made through other processes."""
        self._tasks = [
            asyncio.create_task(self._run(), name="placement"),
            asyncio.create_task(self._listen(), name="appends"),
        ]

    async def _run(self) -> None:
        delay = 0.1
        while not self._closing.is_set():  # the first round: whatever Redis does, keep trying
            try:
                await self.store.open()  # a single server or a Redis Cluster
                version = await self.store.server_version()
                if version < (6, 2):
                    log.error("Redis %s is too old; 6.2 or newer is needed", version)
                async with self._lock:
                    # the model index may lag behind the models (see service.storage.models)
                    await self.store.repair_index()
                await self._round()
                break
            except Unavailable as exc:
                telemetry.REDIS_ERROR["loader"].inc()
                log.warning("loading models: Redis unavailable (%s); retrying", exc)
                await self._pause(delay)
                delay = min(delay * 2, 2.0)
        # Renewals go on while the models taken in the first round load.
        self._tasks.append(asyncio.create_task(self._settle(), name="settle"))
        while not self._closing.is_set():
            await self._pause(self.settings.lease_ttl_s / 3)
            if self._closing.is_set():
                return
            try:
                await self._round()
            except Unavailable as exc:
                telemetry.REDIS_ERROR["loader"].inc()
                log.warning("placing models: Redis unavailable (%s); retrying", exc)

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the registry is closing."""
        await wait_event(self._closing, seconds)

    async def _settle(self) -> None:
        """Ready once the models taken at start-up have applied their log tails."""
        await asyncio.gather(
            *(rt.caught_up() for rt in self.runtimes.values() if rt.writer is not None)
        )
        self.loaded.set()
        log.info(
            "%d model(s) known, %d learned here",
            len(self.runtimes),
            sum(rt.writer is not None for rt in self.runtimes.values()),
        )

    async def _round(self) -> None:
        """One round of the placement loop (see the module docstring)."""
        await self.membership.heartbeat()
        async with self._lock:
            await self._sync_models()
        for runtime in list(self.runtimes.values()):
            await self._place(runtime)
        self._placed += 1  # members may have come or gone

    async def _place(self, runtime: ModelRuntime) -> None:
        """Keep, hand over or take one model, as membership says (nothing once the model is
        closed or the registry is closing: see ``ModelRuntime.placing``)."""
        async with runtime.placing:
            if runtime.closed or self._closing.is_set():
                return
            wanted = self.membership.should_own(runtime.name)
            if runtime.writer is not None:
                if not wanted:
                    owner = self.membership.owner_of(runtime.name)
                    log.info("%s: handing over to %s", runtime.name, owner)
                    await runtime.deactivate(checkpoint=True)
                # Lost (fenced, expired, or overtaken by another owner's checkpoint): stop the
                # writer without claiming again, since its state may be behind the latest
                # checkpoint and the log trimmed past it; a later round takes the model afresh
                # (activate: the checkpoint, then the log).
                elif not runtime.lease.held or (
                    not await runtime.claim() and not runtime.lease.held
                ):
                    await runtime.deactivate(checkpoint=False)
            elif wanted:
                self._tried[runtime.name] = time.monotonic()
                if await runtime.claim():
                    runtime.activate()
                    self._placed += 1

    async def _sync_models(self) -> None:
        """Follow the models created and deleted through other processes."""
        names = await self.store.model_names()
        stamps = await self.store.created_stamps(sorted(set(names) | set(self.runtimes)))
        for name, runtime in list(self.runtimes.items()):
            if stamps.get(name) != repr(runtime.created_at):  # deleted (maybe re-created)
                log.info("%s: deleted through another process", name)
                await self._drop(runtime)
        for name in names:
            if name not in self.runtimes and stamps.get(name) is not None:
                await self._know(name)

    async def _know(self, name: str) -> ModelRuntime | None:
        """A runtime for a model found in Redis (None: no such model)."""
        meta = await self.store.model_meta(name)
        if meta is None:  # being created (or a create that died): not a model (yet)
            return None
        config = json.loads(meta["config"])
        runtime = self._runtime(name, LearnerConfig(**config), float(meta.get("created_at", 0.0)))
        self.runtimes[name] = runtime
        self._placed += 1
        return runtime

    def _runtime(self, name: str, config: LearnerConfig, created_at: float) -> ModelRuntime:
        return ModelRuntime(name, config, created_at, self.store, self.settings, self.owner_id)

    async def _drop(self, runtime: ModelRuntime) -> None:
        await runtime.close()
        self.runtimes.pop(runtime.name, None)
        self._tried.pop(runtime.name, None)
        runtime.telemetry.forget()
        self._placed += 1

    async def _listen(self) -> None:
        """Wake the writer of a model when another process appended to it, or take over a
        model just released (pub/sub, one wake channel per model; see the module docstring)."""
        await self.loaded.wait()
        while not self._closing.is_set():
            heard: set[str] = set()
            seen = -1
            try:
                async with self.store.listen() as listener:
                    while not self._closing.is_set():
                        if seen != self._placed:
                            seen = self._placed
                            await self._follow(listener, heard)
                        if not heard:  # nothing subscribed: nothing to read
                            await self._pause(_LISTEN_TICK_S)
                            continue
                        name = await listener.next_model(_LISTEN_TICK_S)
                        if name is not None:
                            self._woken(name)
            except Unavailable as exc:  # the writers still poll; resubscribe shortly
                log.debug("append notifications interrupted (%s); resubscribing", exc)
                await self._pause(1.0)

    async def _follow(self, listener: Listener, heard: set[str]) -> None:
        """Subscribe to the channels of the models learned here or that should be, and
        unsubscribe from the others (``heard``: the models subscribed to, updated)."""
        wanted = {
            name
            for name, runtime in self.runtimes.items()
            if runtime.writer is not None or self.membership.should_own(name)
        }
        if wanted - heard:
            await listener.subscribe(sorted(wanted - heard))
        if heard - wanted:
            await listener.unsubscribe(sorted(heard - wanted))
        heard.clear()
        heard.update(wanted)

    def _woken(self, name: str) -> None:
        runtime = self.runtimes.get(name)
        if runtime is None:
            return
        if runtime.writer is not None:
            runtime.writer.heard_append()
        elif (
            self.loaded.is_set()
            and self.membership.should_own(name)
            and time.monotonic() - self._tried.get(name, 0.0) > _RETRY_TAKE_S
        ):
            self._tried[name] = time.monotonic()
            task = asyncio.create_task(self._place(runtime), name=f"take:{name}")
            task.add_done_callback(_log_failure)

    async def close(self) -> None:
        """Leave the membership, stop every writer after its batch, write final checkpoints
        and release the leases (other processes take over at once)."""
        self._closing.set()
        for task in self._tasks:
            await stop_task(task)
        with contextlib.suppress(Unavailable):
            await self.membership.leave()
        await asyncio.gather(*(_hand_back(rt) for rt in self.runtimes.values()))

    # -- the models ----------------------------------------------------------------------------

    def all(self) -> list[ModelRuntime]:
        """Every model, by name (Unavailable while loading)."""
        if not self.loaded.is_set():
            raise Unavailable("models are still being loaded", retry_after=1)
        return [self.runtimes[n] for n in sorted(self.runtimes)]

    def get(self, name: str) -> ModelRuntime:
        """A model known here (NotFound, or Unavailable while loading)."""
        runtime = self.runtimes.get(name)
        if runtime is None:
            if not self.loaded.is_set():
                raise Unavailable("models are still being loaded", retry_after=1)
            raise NotFound(f"model {name!r} does not exist")
        return runtime

    async def lookup(self, name: str) -> ModelRuntime:
        """:meth:`get`, but a model not known here yet (just created through another process)
        is looked up in Redis before the answer is NotFound."""
        runtime = self.runtimes.get(name)
        if runtime is not None or not self.loaded.is_set():
            return self.get(name)
        async with self._lock:
            runtime = self.runtimes.get(name) or await self._know(name)
        if runtime is None:
            raise NotFound(f"model {name!r} does not exist")
        return runtime

    async def gone(self, name: str) -> bool:
        """True (and the model forgotten here) when ``name`` no longer exists in Redis: it was
        deleted through another process since our last model index round."""
        if await self.store.model_exists(name):
            return False
        async with self._lock:
            runtime = self.runtimes.get(name)
            if runtime is not None:
                await self._drop(runtime)
        return True

    async def holder(self, name: str) -> tuple[str, str] | None:
        """(member id, URL) of the process that learns ``name`` now, if it is alive."""
        member = await self.store.lease_holder(name)
        if member is None:
            return None
        url = self.membership.members.get(member)
        if url is None:  # joined since our last heartbeat
            url = (await self.membership.heartbeat()).get(member)
        return None if url is None else (member, url)

    def placement(self, name: str) -> tuple[str, str] | None:
        """(member id, URL) of the other process that should learn ``name``, if there is one
        (None: this process should)."""
        owner = self.membership.owner_of(name)
        if owner is None or owner == self.owner_id:
            return None
        url = self.membership.members.get(owner)
        return None if url is None else (owner, url)

    async def create(self, name: str, config: LearnerConfig) -> ModelRuntime:
        """A new model (Conflict if the name exists, LimitExceeded past OPML_MAX_MODELS),
        learned here at once; the placement loop hands it over if another process should."""
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
            self.runtimes[name] = runtime
            async with runtime.placing:
                with contextlib.suppress(Unavailable):  # else the placement loop takes it
                    if await runtime.claim():
                        runtime.activate()
                        self._placed += 1
            await runtime.caught_up()
            return runtime

    async def delete(self, name: str) -> None:
        """Delete a model (every key of it) and stop learning it."""
        async with self._lock:
            runtime = self.get(name)
            await self._drop(runtime)
            await self.store.delete_model(name)


async def _hand_back(runtime: ModelRuntime) -> None:
    """The service stops: final checkpoint and release (after any placement in progress)."""
    async with runtime.placing:
        await runtime.deactivate(checkpoint=True)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        if isinstance(exc, StorageUnavailable):
            telemetry.REDIS_ERROR["loader"].inc()
        else:
            log.error("taking a model over failed", exc_info=exc)

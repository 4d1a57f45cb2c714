"""Stopping the engine's background tasks within a bound, and waiting for an event within one.

Python 3.11's ``asyncio.wait_for`` can swallow a cancellation: when the cancel arrives after the
awaited operation has finished but before ``wait_for`` returns, it returns the result and the
``CancelledError`` is lost (fixed in Python 3.12). redis-py wraps the sending of every command
in ``wait_for`` when a socket timeout is set, which the service always sets, so a plain
``task.cancel(); await task`` on a loop that keeps calling Redis can wait for ever: a service
that was paused and resumed once ignored SIGTERM that way (its shutdown waited on its lease
loop). So the engine's loops stop cooperatively (they watch a closing flag), and
:func:`stop_task` cancels again until the task has ended, within a bound.

>>> import asyncio
>>> async def demo() -> bool:
...     task = asyncio.create_task(asyncio.sleep(60))
...     await stop_task(task, bound_s=1.0)
...     return task.cancelled()
>>> asyncio.run(demo())
True
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

log = logging.getLogger("service.tasks")


async def wait_event(event: asyncio.Event, timeout: float | None) -> None:
    """Return when ``event`` is set, or after ``timeout`` seconds (None: no bound).

    ``asyncio.timeout``, not ``wait_for``: no task per wait (the writer waits once per batch),
    and a cancellation is never swallowed (see the module docstring).

    >>> asyncio.run(wait_event(asyncio.Event(), 0.01))
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


async def stop_task(task: asyncio.Task[Any], bound_s: float = 10.0) -> None:
    """Cancel ``task`` (again and again: see the module docstring) until it has ended, at
    most ``bound_s`` seconds; past that it is logged and left behind."""
    deadline = time.monotonic() + bound_s
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.2)
        if not task.done() and time.monotonic() > deadline:
            log.error("task %s did not stop within %g s", task.get_name(), bound_s)
            return
    if not task.cancelled():
        with contextlib.suppress(Exception):  # its failure was logged where it happened
            task.result()

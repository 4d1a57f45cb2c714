"""Risk certificates of a model, as the engine gives them: on one frozen snapshot, off the
event loop, with the core's errors turned into the domain's.

The metric, threshold and version come from one published :class:`~service.engine.snapshot.
Snapshot`, and the held-out samples from a copy of the learner's held-out state taken while the
writer holds its learning lock (:meth:`Writer.frozen_holdout <service.engine.writer.Writer.
frozen_holdout>`): the copy and the snapshot describe the same applied log prefix, so the
certificate is exactly the core's :meth:`Learner.certificate <service.core.Learner.
certificate>` at that version. The computation (about 20-50 ms for the test-set bound at
5,000 held-out samples, 0.25-0.3 s for PAC-Bayes: ``benchmarks/results/certificate_service.md``)
runs in one dedicated thread: a burst of requests queues there instead of taking both cores
from the learners, and the event loop keeps answering. The requests for one model take turns
(:meth:`Writer.certificate <service.engine.writer.Writer.certificate>`), so a burst holds one
copy of its reservoir at a time.

Errors: a bad ``delta`` / ``method`` is the caller's (422, checked before anything runs by
:func:`~service.core.certificates.check_certificate_args`); everything the core refuses after
that is about the model's state: :class:`~service.errors.NotCertifiable` (409), with ``needed``
and ``have`` when samples are missing.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

from service.core.certificates import Certificate, Method, NoHoldout, NotEnoughHeldOut
from service.core.holdout import Holdout
from service.engine.snapshot import Snapshot
from service.errors import NotCertifiable

#: The refusal of a model without held-out samples, in the service's terms: the fraction is part
#: of the model's configuration, chosen when it is created; single samples can be flagged.
NO_HOLDOUT = (
    "this model holds no samples out, so there is nothing to certify on: the held-out fraction "
    'is chosen when the model is created ("holdout": e.g. 0.2 in its configuration, 0 by '
    'default; it cannot be changed later), or samples are flagged when sent ("holdout": true '
    "on each sample to hold out)"
)
#: One thread: certificates are rare and CPU-bound; the machine's cores belong to the learners.
_THREADS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opml-certificate")


async def certify(
    frozen: tuple[Snapshot, Holdout], delta: float, method: Method, threshold: float | None
) -> Certificate:
    """The certificate of a snapshot, given with the held-out state as of it (the writer's
    ``frozen_holdout()``); arguments already validated."""
    snap, holdout = frozen
    compute = functools.partial(
        holdout.certificate,
        snap.metric.L,
        snap.calibration,
        delta,
        method,
        threshold,
        snap.version,
        margin=snap.margin,  # the served fallback threshold, in input units (as verify's)
    )
    try:
        return await asyncio.get_running_loop().run_in_executor(_THREADS, compute)
    except NotEnoughHeldOut as exc:
        raise NotCertifiable(str(exc), needed=exc.needed, have=exc.have) from None
    except NoHoldout:  # the core's hint names learn_many's arguments: the service's users
        raise NotCertifiable(NO_HOLDOUT) from None
    except ValueError as exc:  # the model is not configured for this method
        raise NotCertifiable(str(exc)) from None

"""Bounded exponential backoff for transient failures (503 + Retry-After, dropped connections).

>>> policy = RetryPolicy(attempts=3, base_delay_s=0.1, max_delay_s=1.0, jitter=0.0)
>>> [policy.delay(n) for n in range(4)]
[0.1, 0.2, 0.4, 0.8]
>>> policy.delay(0, retry_after=30.0)      # the server's Retry-After, capped at max_delay_s
1.0
>>> RetryPolicy.none().attempts
0
>>> RetryPolicy(retry_refused=False).gives_up(0, ConnectionRefusedError(111, "refused"))
True
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a transient failure is retried.

    ``attempts`` is the number of retries after the first try (0: fail at once). The n-th
    retry waits ``base_delay_s * 2**n`` (at most ``max_delay_s``), or the server's
    ``Retry-After`` when it sent one (also capped), plus up to ``jitter`` of it at random.
    Streams apply the same budget to consecutive reconnects without an ack in between.
    ``retry_refused=False`` gives up at once on a refused connection (nothing listens at the
    address: a command line should say so rather than wait); the default retries it, as a
    service restarting refuses connections for a moment.
    """

    attempts: int = 5
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0
    jitter: float = 0.1
    retry_refused: bool = True

    def __post_init__(self) -> None:
        if self.attempts < 0 or self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("RetryPolicy: attempts and delays must be >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("RetryPolicy: jitter must be within [0, 1]")

    @classmethod
    def none(cls) -> RetryPolicy:
        """Never retry."""
        return cls(attempts=0)

    def gives_up(self, failures: int, cause: BaseException) -> bool:
        """Whether to stop after ``failures`` consecutive failures, the last being ``cause``."""
        return failures >= self.attempts or (not self.retry_refused and refused(cause))

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        wanted = retry_after if retry_after is not None else self.base_delay_s * 2**attempt
        wait = min(max(wanted, 0.0), self.max_delay_s)
        return wait * (1.0 + self.jitter * random.random()) if self.jitter else wait


def refused(failure: BaseException) -> bool:
    """Whether ``failure`` is (or was caused by) a refused connection: nothing listens there.

    >>> try:
    ...     raise OSError("connect failed") from ConnectionRefusedError(111, "refused")
    ... except OSError as exc:
    ...     refused(exc), refused(TimeoutError("slow"))
    (True, False)
    """
    cause: BaseException | None = failure
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False

"""Disjoint tuples for a certificate, from labels and a seeded generator only
(docs/algorithms/certificates.md; the rule is stated in :mod:`service.core.certificates`): triplets,
positive pairs and negative pairs, each sample in at most one tuple, so that conditional on the
labels the tuple errors are independent. :func:`check_enough` refuses a set that forms too few of
them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.core.certificates import NotEnoughHeldOut

#: Fewest tuples of each quantity a certificate is made from (10 error-free tuples already
#: bound a rate only by 0.34 at delta / 3 = 0.0167).
MIN_TUPLES = 10


@dataclass(frozen=True)
class Tuples:
    """Indices of disjoint tuples: ``triplets`` rows ``(anchor, positive, negative)``,
    ``positive_pairs`` and ``negative_pairs`` rows ``(first, second)``.

    >>> t = build_tuples(np.repeat(np.arange(2), 14), np.random.default_rng(1))
    >>> t.triplets.shape[1], t.positive_pairs.shape[1], t.negative_pairs.shape[1]
    (3, 2, 2)
    """

    triplets: NDArray[np.int64]
    positive_pairs: NDArray[np.int64]
    negative_pairs: NDArray[np.int64]


def _blocks(
    idx: NDArray[np.int64], labels: NDArray[np.int64], size: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The samples ``idx`` grouped by class (keeping their order) into complete blocks of
    ``size``: block members (one row per block) and the round of each block (its rank within
    its class), blocks ordered by class, then round."""
    lab = labels[idx]
    order = np.argsort(lab, kind="stable")
    members, classes = idx[order], lab[order]
    n = len(classes)
    starts = np.flatnonzero(np.r_[True, classes[1:] != classes[:-1]]) if n else np.empty(0, int)
    counts = np.diff(np.r_[starts, n])
    rank = np.arange(n) - np.repeat(starts, counts)
    full = rank < np.repeat(counts - counts % size, counts)
    rounds: NDArray[np.int64] = rank[full][::size] // size
    return members[full].reshape(-1, size), rounds


def _across_classes(
    idx: NDArray[np.int64], labels: NDArray[np.int64], size: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """Tuples whose last member is of another class, formed in rounds: in round ``r`` every
    class with an ``r``-th complete block takes part; the blocks of the round are put in a
    random cyclic order and each block's tuple is its first ``size - 1`` samples plus the last
    sample of the next block. Rounds with a single class are dropped."""
    blocks, rounds = _blocks(idx, labels, size)
    keys = rng.random(len(blocks))
    order = np.lexsort((keys, rounds))
    blocks, rounds = blocks[order], rounds[order]
    n = len(rounds)
    starts = np.flatnonzero(np.r_[True, rounds[1:] != rounds[:-1]]) if n else np.empty(0, int)
    counts = np.diff(np.r_[starts, n])
    nxt = np.arange(n) + 1
    nxt[starts + counts - 1] = starts  # the last block of a round passes to its first
    tuples = np.column_stack([blocks[:, : size - 1], blocks[nxt, size - 1]]) if n else blocks
    out: NDArray[np.int64] = tuples[np.repeat(counts >= 2, counts)].astype(np.int64)
    return out


def build_tuples(labels: NDArray[np.int64], rng: np.random.Generator) -> Tuples:
    """Disjoint triplets, positive pairs and negative pairs from labels alone (never features).

    The samples are shuffled and dealt into a triplet pool (3 in 7), a positive-pair pool (2 in
    7) and a negative-pair pool (2 in 7). Positive pairs: consecutive samples of one class.
    Triplets and negative pairs: rounds over the classes (see
    :mod:`service.core.certificates`). Each sample
    is in at most one tuple.

    >>> t = build_tuples(np.repeat(np.arange(4), 70), np.random.default_rng(0))
    >>> len(t.triplets), len(t.positive_pairs), len(t.negative_pairs)
    (39, 40, 40)
    >>> used = np.concatenate([t.triplets.ravel(), t.positive_pairs.ravel(),
    ...                        t.negative_pairs.ravel()])
    >>> len(np.unique(used)) == len(used)
    True
    """
    n = len(labels)
    shuffled = rng.permutation(n).astype(np.int64)
    deal = np.arange(n) % 7
    return Tuples(
        triplets=_across_classes(shuffled[deal < 3], labels, 3, rng),
        positive_pairs=_blocks(shuffled[(deal == 3) | (deal == 4)], labels, 2)[0],
        negative_pairs=_across_classes(shuffled[deal >= 5], labels, 2, rng),
    )


def tuple_rng(seed: int, stream: int) -> np.random.Generator:
    """The generator that forms a certificate's tuples: fixed by the model's seed and the
    number of samples that ever entered the window, so one snapshot always gives the same
    tuples (and a window that moved gets fresh ones)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(2, stream))))


def check_enough(tuples: Tuples, n: int, classes: int, what: str, window: int) -> None:
    """NotEnoughHeldOut unless every quantity has :data:`MIN_TUPLES` tuples."""
    fewest = min(len(tuples.triplets), len(tuples.positive_pairs), len(tuples.negative_pairs))
    if fewest >= MIN_TUPLES:
        return
    floor = 7 * MIN_TUPLES  # every pool full of ideal tuples
    total = max(floor, math.ceil(n * MIN_TUPLES / fewest) if fewest else 2 * max(n, 1))
    needed = max(total - n, 1)
    detail = " of at least two classes" if classes < 2 else ""
    hint = f"; the window keeps at most {window}, raise it" if total > window else ""
    raise NotEnoughHeldOut(
        needed,
        n,
        f"not enough {what}: {n} form {fewest} tuples of the scarcest kind, a certificate needs "
        f"{MIN_TUPLES} of each; about {needed} more{detail} are needed{hint}",
    )


def build_pairs(
    labels: NDArray[np.int64], rng: np.random.Generator
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Disjoint positive pairs and, separately, disjoint negative pairs, each drawn from *all*
    the samples (labels and a seeded generator only, never features).

    Within each kind every sample is in at most one pair, so conditional on the labels the
    errors of one kind are independent; a sample may be in one positive and one negative pair,
    which is harmless for bounds that hold one kind at a time and are joined by a union bound
    (the operating points, :mod:`service.core.operating_points`). Twice the pairs of
    :func:`build_tuples`' pools, which share the samples among three kinds.

    >>> pos, neg = build_pairs(np.repeat(np.arange(4), 70), np.random.default_rng(0))
    >>> len(pos), len(neg), len(np.unique(neg)) == neg.size
    (140, 140, True)
    """
    n = len(labels)
    positives = _blocks(rng.permutation(n).astype(np.int64), labels, 2)[0]
    negatives = _across_classes(rng.permutation(n).astype(np.int64), labels, 2, rng)
    return positives, negatives

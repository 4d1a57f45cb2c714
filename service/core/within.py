"""Within-class statistics, online: the LDA learner and the whitening preconditioners.

:class:`WithinClass` keeps, for every class ``k``, its count ``n_k`` and running mean ``m_k``,
and the pooled within-class scatter ``S_W = sum_k sum_{i in k} (x_i - m_k)(x_i - m_k)^T``. A
sample of class ``k`` updates them by Welford's recurrence::

    n_k <- n_k + 1,   delta = x - m_k,   m_k <- m_k + delta / n_k,   S_W <- S_W + delta (x - m_k)^T

(exact in exact arithmetic: the rank-one term is the change of class ``k``'s scatter), O(d^2) per
sample in one compiled pass. Samples are folded in one at a time in stream order, so the
statistics are bit-identical however the stream is batched; they are float64 arrays of the
learner's state, so a resumed learner continues bit-identically too.

From them, at a *refresh* (every ``refresh`` learned samples, and before the first of those at
32, 64, 128, ... samples: :func:`next_refresh`; O(d^3 + K d^2) for ``K`` classes, i.e.
O(d^3 / refresh) per sample amortised, next to the O(d^2) of the statistics):

* the pooled within-class covariance ``Sigma_W = S_W / (n - K)``, shrunk towards a multiple of
  the identity with the same trace, ``(1 - alpha) Sigma_W + alpha (tr Sigma_W / d) I``
  (``shrinkage = alpha`` in [0, 1]; 0 = none), which makes it definite when ``d`` is close to
  or above the number of samples;
* :func:`fisher`: Fisher's discriminant directions, the generalized eigenvectors of the
  between-class scatter ``S_B = sum_k n_k (m_k - m)(m_k - m)^T`` against ``Sigma_W`` (``S_B v =
  lambda Sigma_W v``, ``v^T Sigma_W v = 1``), the ``min(K - 1, d)`` of largest ``lambda`` as the
  rows of ``L`` (the others zero): the projection of scikit-learn's
  ``LinearDiscriminantAnalysis(solver="eigen")``, which keeps the same ``K - 1`` directions
  (its covariance is ``S_W / n``, so its squared distances are ours times ``n / (n - K)``). Computed
  by a Cholesky factor ``Sigma_W = C C^T`` and a symmetric eigenproblem of
  ``C^{-1} S_B C^{-T}``;
* :func:`whitening`: the symmetric inverse square root ``W = Sigma_W^{-1/2}``, under which the
  within-class covariance is the identity (the preconditioner of ``precondition="whiten"``);
* :func:`discriminant`: the symmetric root of LDA's metric with each discriminant direction
  weighted by how well it separates the classes, plus a small multiple of the Euclidean metric
  of the features scaled by their within-class spread (the preconditioner of
  ``precondition="discriminant"``). Whitening weights all directions alike, and with ``K - 1``
  well below ``d`` the ``d - K + 1`` directions without between-class variance then dominate
  every distance.

Directions in which no sample varies at all (a constant feature, an exact linear relation
between features) are left out: both are computed on the range of the total scatter, and ``L``
and ``W - c I`` are zero outside it. While ``Sigma_W`` is singular on that range (fewer samples
than dimensions and classes, or a direction that varies only between classes) and ``shrinkage``
is 0, a refresh returns ``None`` and the learner keeps its metric: an inverse of a singular
covariance would blow up the directions the stream has not varied in yet.

The learner's use of ``W`` (``precondition="whiten"`` or ``"discriminant"``: ``opml``,
``copml``, ``sgd``): the learner keeps the same statistics and learns its ``L`` by its own rule
on ``W x``, ``W`` the within-class whitening or the discriminant weighting above (identity until
the first refresh that finds the pooled covariance definite); both are symmetric and definite,
which is all whitening's carry-over below needs. The served ``L`` (:attr:`Learner.L`, every query,
snapshot and certificate) is the effective ``L W``. Until the first refresh that finds the
pooled covariance definite there is no ``W`` (it needs a definite covariance from at least ten
samples per dimension, :data:`~service.core.within.WHITEN_SAMPLES`): the samples only feed the
statistics and the buffer, and are measured as ``lda``'s are (``L = I`` is served, or a metric
set by :meth:`Learner.set_metric`); at that refresh ``W`` arrives and the served metric becomes
``L W`` (the whitened, or discriminant-weighted, Euclidean distance by default), the buffered
rows ``h`` become ``W h``, the steps start on ``W x`` and ``step="scaled"``'s running scale
starts there; the verification calibrator's window restarts, since the distances it held were
of ``L`` alone.
Every later refresh ``W -> W'`` turns the buffer rows ``W h`` into ``W' h``. Under ``"whiten"``
it also sets ``L <- L W W'^{-1}``, so the served metric does not jump: the refresh changes the
coordinates the next steps are taken in, not the metric (the running scale then adapts over its
horizon). Under ``"discriminant"`` ``L`` is kept and the served metric becomes ``L W'``: ``W``
is itself the estimate of the metric to serve, so a carry-over would freeze the first one (from
ten samples per dimension) into every later metric; the metric moves at each refresh by what the
statistics moved, less each time as they settle, and the verification calibrator's window spans
the refresh, as ``lda``'s does. ``W`` is the symmetric root of its metric, which moves little
when the statistics do (another factor of the same metric could rotate), so an ``L`` learned on
``W x`` still fits ``W' x``. Batches are cut at the refresh points, so any batching and any
resume point give the same ``L``; under ``"discriminant"`` the steps' size follows a schedule in
the samples learned (``Learner._schedule``). Rehearsal is not combined with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from service.core._validation import Array
from service.core.calibration import ThresholdCalibrator
from service.core.update import NEW_CLASS, PASSIVE, SINGLE_CLASS, nan_filled

#: The first refresh point: before ``refresh`` samples, refreshes fall on the powers of two
#: from here (32, 64, 128, ...), so a short stream, or the start of a long one, is not left
#: without a metric for ``refresh`` samples (log2(refresh / 32) more refreshes in all).
FIRST_REFRESH = 32


def next_refresh(learned: int, refresh: int) -> int:
    """The first refresh point after ``learned`` samples: a power of two from
    :data:`FIRST_REFRESH` below ``refresh``, then every multiple of ``refresh``.

    >>> [next_refresh(t, 1000) for t in (0, 32, 100, 512, 999, 1000, 1500)]
    [32, 64, 128, 1000, 1000, 2000, 2000]
    """
    point = FIRST_REFRESH
    while point <= learned:
        point *= 2
    multiple = (learned // refresh + 1) * refresh
    return point if point < refresh else multiple


#: Relative floor of ``Sigma_W``'s smallest eigenvalue (times its mean one) below which it
#: counts as singular: beyond ~1e12 the inverse's rounding error reaches 1e-4 relative.
SINGULAR = 1e-12
#: Relative floor (times the largest) of the total scatter's eigenvalues whose directions
#: count as varied (:func:`_support`): an exact linear relation leaves ~1e-16 of rounding.
SUPPORT = 1e-10


@njit(cache=True, nogil=True, error_model="numpy")
def _accumulate(rows: Array, slots: Any, counts: Array, means: Array, scatter: Array) -> None:
    """Welford's recurrence for each row in order (module docstring); ``scatter`` is kept
    symmetric by updating its upper triangle and mirroring it once per call (each entry's
    sum is the same per-row sequence however the rows are batched)."""
    n, d = rows.shape
    delta = np.empty(d)
    for t in range(n):
        k = slots[t]
        counts[k] += 1.0
        inv = 1.0 / counts[k]
        for i in range(d):
            delta[i] = rows[t, i] - means[k, i]
            means[k, i] += delta[i] * inv
        for i in range(d):
            after = rows[t, i] - means[k, i]
            for j in range(i, d):
                scatter[i, j] += delta[j] * after
    for i in range(d):
        for j in range(i + 1, d):
            scatter[j, i] = scatter[i, j]


@njit(cache=True, nogil=True, error_model="numpy")
def _apply(rows: Array, W: Array, out: Array) -> None:
    # Row by row, each entry summed over i in ascending order (the inner loop runs along
    # contiguous rows of W, so it vectorises).
    n, d = rows.shape
    for t in range(n):
        for j in range(d):
            out[t, j] = 0.0
        for i in range(d):
            a = rows[t, i]
            for j in range(d):
                out[t, j] += a * W[i, j]


def apply(rows: Array, W: Array) -> Array:
    """``rows W`` row by row in one fixed summation order: BLAS rounds a product of one row
    differently from one of many, and the learner must not depend on how rows are batched.

    >>> apply(np.array([[1.0, 2.0]]), np.array([[1.0, 0.0], [1.0, 3.0]])).tolist()
    [[3.0, 6.0]]
    """
    out: Array = np.empty_like(rows)
    _apply(np.require(rows, np.float64, ["C"]), np.require(W, np.float64, ["C"]), out)
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def measure(
    L: Array,
    H: Array,
    rows: Array,
    slots: Any,
    known: Any,
    negatives: Any,
    codes: Any,
    values: Array,
    single: int,
    new: int,
    measured: int,
) -> None:
    """For a learner whose ``L`` does not move between refreshes: each row's triplet distances
    ``||L (x - h_own)||^2`` and ``||L (x - h_neg)||^2`` measured before the row enters the
    buffer (prequential, as the updating learners' are), and the row buffered. ``codes``:
    ``new`` for a class's first sample, ``single`` while one class is known, else
    ``measured``; ``values[t, 1:3]`` the two distances."""
    n, d = rows.shape
    r = L.shape[0]
    for t in range(n):
        slot = slots[t]
        if slot == known[t]:
            codes[t] = new
        elif known[t] < 2:
            codes[t] = single
        else:
            neg = negatives[t]
            d_pos = 0.0
            d_neg = 0.0
            for i in range(r):
                a = 0.0
                b = 0.0
                for j in range(d):
                    a += L[i, j] * (rows[t, j] - H[slot, j])
                    b += L[i, j] * (rows[t, j] - H[neg, j])
                d_pos += a * a
                d_neg += b * b
            codes[t] = measured
            values[t, 1] = d_pos
            values[t, 2] = d_neg
        for j in range(d):
            H[slot, j] = rows[t, j]


class WithinClass:
    """Per-class counts and means and the pooled within-class scatter (module docstring).

    >>> stats = WithinClass(dim=2)
    >>> stats.observe(np.array([[0.0, 0.0], [2.0, 0.0], [5.0, 5.0], [5.0, 7.0]]),
    ...               np.array([0, 0, 1, 1]))
    >>> stats.counts[:2].tolist(), stats.means[:2].tolist()
    ([2.0, 2.0], [[1.0, 0.0], [5.0, 6.0]])
    >>> stats.scatter.tolist()  # (+-1, 0) twice and (0, +-1) twice
    [[2.0, 0.0], [0.0, 2.0]]
    >>> stats.covariance(0.0).tolist()  # S_W / (n - K)
    [[1.0, 0.0], [0.0, 1.0]]
    """

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.counts: Array = np.zeros(4)
        self.means: Array = np.zeros((4, dim))
        self.scatter: Array = np.zeros((dim, dim))

    @property
    def n_classes(self) -> int:
        return int(np.count_nonzero(self.counts))

    @property
    def n_samples(self) -> int:
        return int(self.counts.sum())

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` classes (doubling, as the learner's buffer)."""
        if rows > len(self.counts):
            size = max(rows, 2 * len(self.counts))
            counts, means = np.zeros(size), np.zeros((size, self.dim))
            counts[: len(self.counts)] = self.counts
            means[: len(self.means)] = self.means
            self.counts, self.means = counts, means

    def observe(self, rows: Array, slots: Any) -> None:
        """Fold ``rows`` (of the classes at buffer ``slots``) in, in order."""
        self.reserve(int(slots.max(initial=-1)) + 1)
        rows = np.require(rows, np.float64, ["C"])
        _accumulate(rows, np.asarray(slots, dtype=np.int64), self.counts, self.means, self.scatter)

    def covariance(self, shrinkage: float) -> Array | None:
        """``Sigma_W`` shrunk by ``shrinkage`` (module docstring); None before any class has
        two samples."""
        n, k = self.n_samples, self.n_classes
        if n - k < 1:
            return None
        cov: Array = self.scatter / (n - k)
        if shrinkage:
            target = float(np.trace(cov)) / self.dim
            cov = (1.0 - shrinkage) * cov
            cov[np.diag_indices(self.dim)] += shrinkage * target
        return cov

    def between(self) -> Array:
        """``S_B = sum_k n_k (m_k - m)(m_k - m)^T`` over the seen classes."""
        counts, means = self.counts, self.means
        seen = counts > 0
        n = counts[seen].sum()
        centre = (counts[seen, None] * means[seen]).sum(axis=0) / n
        diff = (means[seen] - centre) * np.sqrt(counts[seen])[:, None]
        out: Array = diff.T @ diff
        return out

    # -- state -----------------------------------------------------------------------------

    def to_state(self, n_classes: int) -> dict[str, Array]:
        return {
            "within_counts": self.counts[:n_classes].copy(),
            "within_means": self.means[:n_classes].copy(),
            "within_scatter": self.scatter.copy(),
        }

    def restore(self, arrays: dict[str, Array], n_classes: int) -> None:
        """Set from :meth:`to_state` output (ValueError if the shapes or values are off)."""
        d = self.dim
        counts = np.asarray(arrays["within_counts"], dtype=np.float64).reshape(-1)
        means = np.asarray(arrays["within_means"], dtype=np.float64).reshape(-1, d)
        scatter = np.asarray(arrays["within_scatter"], dtype=np.float64)
        if len(counts) != n_classes or len(means) != n_classes or scatter.shape != (d, d):
            raise ValueError("state: within-class statistics do not match the classes")
        finite = np.isfinite(counts).all() and np.isfinite(means).all()
        if not finite or not np.isfinite(scatter).all() or (counts < 0).any():
            raise ValueError("state: within-class statistics are not finite")
        self.reserve(n_classes)
        self.counts[:n_classes] = counts
        self.means[:n_classes] = means
        self.scatter = np.array(scatter, order="C")


def _definite(cov: Array) -> bool:
    low = float(np.linalg.eigvalsh(cov)[0])
    return low > SINGULAR * max(float(np.trace(cov)) / len(cov), np.finfo(float).tiny)


def _support(stats: WithinClass) -> Array:
    """An orthonormal basis ``P`` (``d x p``) of the directions the stream varies in: the
    range of the total scatter ``S_W + S_B``. A constant feature, or an exact linear relation
    between features (a sum kept next to its parts), leaves a direction in which every sample
    is the same; no distance depends on it, and ``Sigma_W`` is singular there whatever the
    stream, so the metric is computed on the others (``P`` is ``I`` for data that vary in
    every direction)."""
    total = stats.scatter + stats.between()
    values, vectors = np.linalg.eigh(0.5 * (total + total.T))
    keep = values > SUPPORT * max(float(values[-1]), np.finfo(float).tiny)
    if keep.all():
        return np.eye(stats.dim)
    out: Array = vectors[:, keep]
    return out


def _projected(stats: WithinClass, shrinkage: float) -> tuple[Array, Array] | None:
    """``P`` and ``P^T Sigma_W P`` shrunk (within the support); None while it is singular."""
    n, k = stats.n_samples, stats.n_classes
    if n - k < 1:
        return None
    P = _support(stats)
    cov: Array = P.T @ (stats.scatter / (n - k)) @ P
    if shrinkage:
        target = float(np.trace(cov)) / len(cov)
        cov = (1.0 - shrinkage) * cov
        cov[np.diag_indices(len(cov))] += shrinkage * target
    if not _definite(cov):
        return None
    return P, cov


def fisher(stats: WithinClass, shrinkage: float) -> Array | None:
    """The ``d x d`` ``L`` whose first ``min(K - 1, d)`` rows are Fisher's discriminant
    directions (module docstring), the rest zero; None while ``Sigma_W`` is singular or fewer
    than two classes are known.

    >>> stats = WithinClass(dim=2)
    >>> stats.observe(np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 5.0], [2.0, 7.0]]),
    ...               np.array([0, 0, 1, 1]))
    >>> L = fisher(stats, 0.0)
    >>> L.shape, bool(np.allclose(L[1], 0.0))
    ((2, 2), True)
    """
    projected = _projected(stats, shrinkage) if stats.n_classes >= 2 else None
    if projected is None:
        return None
    P, cov = projected
    inv = np.linalg.inv(np.linalg.cholesky(cov))  # C^{-1}
    reduced = inv @ (P.T @ stats.between() @ P) @ inv.T
    _, vectors = np.linalg.eigh(0.5 * (reduced + reduced.T))
    r = min(stats.n_classes - 1, len(cov))
    L = np.zeros((stats.dim, stats.dim))
    # v = P C^{-T} u, largest eigenvalues first (eigh's order is ascending).
    L[:r] = (P @ (inv.T @ vectors[:, ::-1][:, :r])).T
    return L


#: Samples per dimension before a first ``W`` is formed: a covariance from fewer is noisy in
#: its small eigenvalues, and whitening by it blows that noise up into the metric.
WHITEN_SAMPLES = 10


def whitening(stats: WithinClass, shrinkage: float) -> Array | None:
    """``W = Sigma_W^{-1/2}`` (symmetric); None while ``Sigma_W`` is singular or the stream
    holds fewer than :data:`WHITEN_SAMPLES` samples per dimension.

    >>> stats = WithinClass(dim=2)
    >>> stats.observe(np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 5.0], [0.0, 6.0]] * 5),
    ...               np.array([0, 0, 1, 1] * 5))
    >>> np.round(whitening(stats, 0.0), 6).tolist()  # Sigma_W = diag(40, 2.5) / 18
    [[0.67082, 0.0], [0.0, 2.683282]]
    """
    if stats.n_samples < WHITEN_SAMPLES * stats.dim:
        return None
    projected = _projected(stats, shrinkage)
    if projected is None:
        return None
    P, cov = projected
    values, vectors = np.linalg.eigh(cov)
    out: Array = P @ ((vectors / np.sqrt(values)) @ vectors.T) @ P.T
    if P.shape[1] < stats.dim:  # no sample varies there: any invertible scale will do
        out += (np.eye(stats.dim) - P @ P.T) / np.sqrt(float(values.mean()))
    return 0.5 * (out + out.T)


#: ``precondition="discriminant"``'s weights (:func:`discriminant`): a direction with Fisher ratio
#: ``lambda`` counts ``lambda / (lambda + DISCRIMINANT_KNEE)``, so a direction that separates the
#: classes by more than a fifth of its within-class spread counts nearly fully (the graded ones
#: too, when ``K - 1 >= d``) and one with no between-class variance not at all; the floor adds
#: ``DISCRIMINANT_FLOOR`` times the Euclidean metric of the features scaled by their within-class
#: spread. A floor in whitened coordinates would weight most the directions of least
#: within-class spread, where noise dominates and nearest neighbours suffer; one scaled by the
#: total spread (between-class included) left more of the digits' 5-NN error
#: (``docs/design/discriminant-metric.md``).
DISCRIMINANT_KNEE = 0.2
DISCRIMINANT_FLOOR = 0.03


def discriminant(stats: WithinClass, shrinkage: float) -> Array | None:
    """``D = M^{1/2}`` (symmetric, definite) for ``M = W U diag(lambda / (lambda + c)) U^T W +
    epsilon S^{-1}``; None when :func:`whitening` is.

    ``W = Sigma_W^{-1/2}`` is the whitening, ``W Sigma_B W = U diag(lambda) U^T`` (``Sigma_B =
    S_B / (n - K)``, the same normalisation as ``Sigma_W``; ``lambda`` the Fisher ratios ``v^T
    S_B v / v^T S_W v`` of the discriminant directions), ``c`` :data:`DISCRIMINANT_KNEE`,
    ``epsilon`` :data:`DISCRIMINANT_FLOOR` and ``S`` the diagonal of ``Sigma_W`` (a feature
    that varies within no class takes the mean of the others'). The first term is LDA's metric
    with each direction weighted by how well it separates the classes; the second is the
    Euclidean distance of the features scaled by their within-class spread, scaled down: it
    keeps the metric definite, leaves the learner directions to grow, and keeps the fine
    structure a nearest neighbour uses. Invariant to a rescaling of each feature (not to a
    rotation of the features, as whitening is). O(d^3).

    >>> stats = WithinClass(dim=2)
    >>> rows = [[0.0, 0.0], [4.0, 0.0], [0.0, 1.0], [4.0, 1.0]]  # class 0; class 1 is 5 higher
    >>> stats.observe(np.array(rows * 5 + [[a, b + 5.0] for a, b in rows] * 5),
    ...               np.array([0] * 20 + [1] * 20))
    >>> M = discriminant(stats, 0.0) @ discriminant(stats, 0.0)
    >>> bool(M[1, 1] > 100 * M[0, 0]), bool(abs(M[0, 1]) < 1e-12)  # the means differ along y
    (True, True)
    """
    W = whitening(stats, shrinkage)
    if W is None:
        return None
    n, k = stats.n_samples, stats.n_classes
    between = stats.between() / (n - k)
    B = W @ between @ W
    ratios, U = np.linalg.eigh(0.5 * (B + B.T))
    ratios = np.maximum(ratios, 0.0)  # rounding below zero in directions with none
    weights = ratios / (ratios + DISCRIMINANT_KNEE)
    spread = np.diag(stats.scatter) / (n - k)  # diag(Sigma_W)
    varied = spread > SUPPORT * max(float(spread.max()), np.finfo(float).tiny)
    spread[~varied] = spread[varied].mean()  # whitening() found a definite Sigma_W: some vary
    M = W @ ((U * weights) @ U.T) @ W
    M[np.diag_indices(len(M))] += DISCRIMINANT_FLOOR / spread
    values, vectors = np.linalg.eigh(0.5 * (M + M.T))
    out: Array = (vectors * np.sqrt(np.maximum(values, 0.0))) @ vectors.T
    return 0.5 * (out + out.T)


def measured_batch(
    L: Array,
    H: Array,
    rows: Array,
    slots: Any,
    known: Any,
    negatives: Any,
    calibrator: ThresholdCalibrator,
) -> tuple[Any, Array]:
    """``lda``, and a whitened learner before its first ``W``: the batch's triplets measured
    by the current ``L`` (prequential, :func:`measure`), the buffer ``H`` updated; the
    calibrator takes the measurements. Returns the steps' ``codes`` and ``values``."""
    n = len(rows)
    codes = np.empty(n, dtype=np.int64)
    values = nan_filled((n, 4))
    measure(L, H, rows, slots, known, negatives, codes, values, SINGLE_CLASS, NEW_CLASS, PASSIVE)
    done = codes == PASSIVE
    calibrator.observe_many(values[done, 1], values[done, 2])
    return codes, values

"""scikit-learn / metric-learn style estimators: :class:`OPML`, :class:`COPML`, :class:`SGD`,
:class:`SGDPSD` and :class:`BRM` (one per ``LearnerConfig.algorithm``).

They follow the metric-learn contract: hyperparameters only in ``__init__``, learned state in
trailing-underscore attributes, ``fit`` returns ``self``, ``transform(X) = X @ components_.T``,
``get_mahalanobis_matrix()``, ``pair_distance`` (square-rooted, Eq. 1) and ``pair_score`` (its
negative). Unlike metric-learn they also learn incrementally: ``partial_fit`` continues the same
one-pass stream, so ``fit(X, y)`` equals ``partial_fit`` over any split of ``X`` in order.

scikit-learn is optional. When it is installed the estimators inherit ``BaseEstimator`` and
``TransformerMixin`` (so ``clone``, ``Pipeline`` and ``GridSearchCV`` work); without it they
carry an equivalent ``get_params`` / ``set_params`` / ``fit_transform`` of their own.

Labels may be anything hashable that scikit-learn accepts; integers (numpy or not) map to their
decimal string as in the service, anything else to ``str(label)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from service.core._validation import Array, as_float_array, label_key
from service.core.brm import restricted_root
from service.core.config import LearnerConfig, Normalize, StepRule
from service.core.learner import Learner
from service.core.steps import Step


class _ParamsBase:
    """``get_params`` / ``set_params`` / ``fit_transform`` for when scikit-learn is absent."""

    @classmethod
    def _get_param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p for p in sig.parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> Any:
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"{name}: not a parameter of {type(self).__name__}")
            setattr(self, name, value)
        return self

    def fit_transform(self, X: Any, y: Any = None, **fit_params: Any) -> Any:
        return self.fit(X, y, **fit_params).transform(X)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"


if TYPE_CHECKING:
    _Base = _ParamsBase
else:
    try:
        from sklearn.base import BaseEstimator, TransformerMixin

        class _Base(TransformerMixin, BaseEstimator):
            pass

    except ImportError:  # scikit-learn is an optional extra
        _Base = _ParamsBase


class NotFittedError(ValueError, AttributeError):
    """Raised by a query before ``fit`` / ``partial_fit`` (as scikit-learn's own).

    >>> isinstance(NotFittedError("call fit first"), ValueError | AttributeError)
    True
    """


def _seed_from(random_state: Any) -> int:
    if random_state is None:
        return int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(2**32))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2**63))
    if isinstance(random_state, int | np.integer) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValueError(f"random_state: must be >= 0, got {random_state}")
        return int(random_state)
    raise ValueError(f"random_state: an int, None or a numpy generator, got {random_state!r}")


def _check_2d(X: Any, name: str = "X") -> Array:
    if hasattr(X, "toarray") or hasattr(X, "tocsr"):
        raise TypeError(f"{name}: sparse input is not supported; pass a dense array")
    arr = np.asarray(X)
    if np.iscomplexobj(arr):
        raise ValueError(f"{name}: Complex data not supported")
    if arr.dtype == object:
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}: {exc}") from None
    arr = as_float_array(arr, name)
    if arr.ndim != 2:
        raise ValueError(
            f"{name}: Expected 2D array, got {arr.ndim}D array instead. Reshape your data "
            "with X.reshape(-1, 1) for a single feature or X.reshape(1, -1) for one sample."
        )
    if arr.shape[0] < 1:
        raise ValueError(f"{name}: Found array with 0 sample(s) (shape={arr.shape})")
    if arr.shape[1] < 1:
        raise ValueError(
            f"{name}: Found array with 0 feature(s) (shape={arr.shape}) while a minimum of 1 "
            "is required."
        )
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: Input contains NaN or infinity")
    return arr


def _label_keys(y: Any, n: int) -> list[str]:
    if y is None:
        raise ValueError("y: requires y to be passed, but the target y is None")
    labels = np.asarray(y)
    if labels.ndim != 1:
        labels = labels.ravel() if labels.ndim == 2 and labels.shape[1] == 1 else labels
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(f"y: expected {n} labels, got shape {np.shape(y)}")
    if labels.dtype.kind == "f" and not np.isfinite(labels).all():
        raise ValueError("y: Input contains NaN or infinity")
    out = []
    for value in labels.tolist():
        is_int = isinstance(value, int | np.integer) and not isinstance(value, bool)
        out.append(label_key(value) if is_int or isinstance(value, str) else str(value))
    return out


def _check_pairs(pairs: Any, dim: int) -> Array:
    arr = as_float_array(pairs, "pairs")
    if arr.ndim != 3 or arr.shape[1] != 2 or arr.shape[2] != dim:
        raise ValueError(f"pairs: expected shape (n, 2, {dim}), got {arr.shape}")
    return arr


class _OnlineMetric(_Base):
    """Shared body of the estimators: every ``__init__`` parameter other than
    ``random_state`` is a :class:`LearnerConfig` field of the same name."""

    _algorithm: str = ""
    learner_: Learner
    n_features_in_: int

    random_state: Any

    def _config(self, dim: int) -> LearnerConfig:
        params = {name: getattr(self, name) for name in self._get_param_names()}
        del params["random_state"]
        return LearnerConfig(
            dim=dim,
            algorithm=self._algorithm,  # type: ignore[arg-type]
            seed=_seed_from(self.random_state),
            **params,
        )

    def fit(self, X: Any, y: Any) -> Any:
        """Learn from scratch in one pass over the rows of ``X`` in the order given."""
        Xs = _check_2d(X)
        keys = _label_keys(y, Xs.shape[0])
        self.learner_ = Learner(self._config(Xs.shape[1]))
        self.n_features_in_ = Xs.shape[1]
        self.learner_.learn_many(Xs, keys)
        return self

    def partial_fit(self, X: Any, y: Any) -> Any:
        """Continue the stream with the rows of ``X``; the first call starts it."""
        Xs = _check_2d(X)
        keys = _label_keys(y, Xs.shape[0])
        if not hasattr(self, "learner_"):
            self.learner_ = Learner(self._config(Xs.shape[1]))
            self.n_features_in_ = Xs.shape[1]
        self._check_features(Xs)
        self.learner_.learn_many(Xs, keys)
        return self

    def _fitted(self) -> Learner:
        if not hasattr(self, "learner_"):
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with "
                "appropriate arguments before using this estimator."
            )
        return self.learner_

    def _check_features(self, Xs: Array) -> None:
        if Xs.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {Xs.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input."
            )

    @property
    def components_(self) -> Array:
        """The learned ``L`` (read-only view), ``M = L^T L``."""
        return self._fitted().L

    def transform(self, X: Any) -> Array:
        """``X L^T`` (inputs l2-normalised first when ``normalize="l2"``)."""
        learner = self._fitted()
        Xs = _check_2d(X)
        self._check_features(Xs)
        return learner.transform(Xs)

    def get_mahalanobis_matrix(self) -> Array:
        """``M = L^T L``."""
        L = self._fitted().L
        M: Array = L.T @ L
        return M

    def pair_distance(self, pairs: Any) -> Array:
        """Distances (Eq. 1) of ``pairs``, an array of shape ``(n, 2, d)``."""
        learner = self._fitted()
        arr = _check_pairs(pairs, learner.dim)
        n = arr.shape[0]
        Z = learner.transform(arr.reshape(2 * n, -1)).reshape(n, 2, -1)
        diff = Z[:, 0] - Z[:, 1]
        out: Array = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        return out

    def pair_score(self, pairs: Any) -> Array:
        """``-pair_distance(pairs)``: higher means more similar."""
        return -self.pair_distance(pairs)

    def get_metric(self) -> Callable[[Any, Any], float]:
        """A function ``(a, b) -> distance`` (Eq. 1) on the current ``L``, e.g. for k-NN."""
        learner = self._fitted()
        return learner.distance

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()  # type: ignore[misc]
        tags.target_tags.required = True
        return tags


class OPML(_OnlineMetric):
    """One-pass closed-form online metric learning (paper Algorithm 1).

    Each sample forms a triplet with its class's latest sample and the latest sample of a random
    other class; an active hinge (Eq. 4) triggers the rank-two closed-form update (Eq. 16).
    Samples of the only class seen so far are buffered, not learned from.

    ``gamma``, ``margin`` and ``step`` are :class:`~service.core.LearnerConfig`'s: with the
    default ``step="scaled"`` they are read in units of the data's typical squared difference
    (``gamma=None``: 0.05; ``"auto"`` races a grid during the first ``auto_warmup`` triplets);
    ``step="paper"`` is the paper's literal rule (``gamma=None``: 1e-3). ``rehearsal`` further
    steps on samples drawn from a reservoir of ``rehearsal_memory`` past ones follow every sample
    (:mod:`service.core.rehearsal`; default 0, one pass).

    >>> from service.core import OPML
    >>> X = [[0.0, 0.0], [0.0, 0.5], [0.3, 0.0], [0.3, 0.5], [0.0, 0.1], [0.2, 0.5]]
    >>> y = [0, 1, 0, 1, 0, 1]
    >>> m = OPML(gamma=0.1, step="paper", random_state=0).fit(X, y)
    >>> m.learner_.counts["triplet_update"]
    4
    >>> before = 0.5                          # Euclidean distance between the class centres
    >>> bool(m.pair_distance([[[0.0, 0.0], [0.0, 0.5]]])[0] > before)
    True
    >>> m1 = OPML(random_state=0).fit(X, y)
    >>> m1000 = OPML(random_state=0).fit(np.multiply(X, 1024.0), y)   # scale-free default
    >>> bool(np.array_equal(m1.components_, m1000.components_))
    True
    """

    _algorithm = "opml"

    def __init__(
        self,
        gamma: float | str | None = None,
        margin: float = 1.0,
        normalize: Normalize = "none",
        step: Step | None = None,
        auto_warmup: int = 1000,
        rehearsal: int = 0,
        rehearsal_memory: int = 1000,
        random_state: Any = None,
    ) -> None:
        self.gamma = gamma
        self.margin = margin
        self.normalize = normalize
        self.step = step
        self.auto_warmup = auto_warmup
        self.rehearsal = rehearsal
        self.rehearsal_memory = rehearsal_memory
        self.random_state = random_state


class COPML(_OnlineMetric):
    """OPML with the cold-start pair pre-stage (paper Algorithm 2, Eq. 20).

    While one class only has been seen, adjacent samples form a similar pair and ``L`` takes a
    Sherman-Morrison step with ``gamma_pair``; afterwards every step is an OPML step with
    ``gamma``. Step rules and units as in :class:`OPML` (``gamma_pair=None``: 0.1 scaled,
    1e-2 paper).

    >>> from service.core import COPML
    >>> X = [[0.0, 0.0], [0.0, 1.0], [0.0, 2.0], [3.0, 0.0]]
    >>> m = COPML(gamma_pair=0.5, random_state=0).fit(X, ["a", "a", "a", "b"])
    >>> m.learner_.counts["pair_update"], m.learner_.counts["new_class"]
    (2, 2)
    >>> bool(m.components_[1, 1] < 1.0)     # the pair direction shrank
    True
    """

    _algorithm = "copml"

    def __init__(
        self,
        gamma: float | str | None = None,
        gamma_pair: float | None = None,
        margin: float = 1.0,
        normalize: Normalize = "none",
        step: Step | None = None,
        auto_warmup: int = 1000,
        rehearsal: int = 0,
        rehearsal_memory: int = 1000,
        random_state: Any = None,
    ) -> None:
        self.gamma = gamma
        self.gamma_pair = gamma_pair
        self.margin = margin
        self.normalize = normalize
        self.step = step
        self.auto_warmup = auto_warmup
        self.rehearsal = rehearsal
        self.rehearsal_memory = rehearsal_memory
        self.random_state = random_state


class SGD(_OnlineMetric):
    """Online SGD on the triplet margin loss for ``L``: OPML's explicit twin (``algorithm="sgd"``,
    :mod:`service.core.sgd`).

    The same triplets as OPML; each active one takes the gradient step of
    ``mu * softplus(z / mu)`` (``mu = 0``: the hinge) under the step rule ``step``
    (``"descent"``: ``eta_t = min(eta, kappa / (2 q lambda_+))``). ``kappa=None`` is 0.5 with
    ``step="descent"`` (other rules take no ``kappa``). ``lam`` decays ``L`` (regulariser
    ``lam ||L||_F^2``). While one class has been seen, the pair step uses ``gamma_pair``.

    >>> from service.core import SGD
    >>> X = [[0.0, 0.0], [0.0, 0.5], [0.3, 0.0], [0.3, 0.5], [0.0, 0.1], [0.2, 0.5]]
    >>> y = [0, 1, 0, 1, 0, 1]
    >>> m = SGD(eta=0.05, step="constant", random_state=0).fit(X, y)
    >>> m.learner_.counts["sgd_update"]
    4
    >>> bool(m.pair_distance([[[0.0, 0.0], [0.0, 0.5]]])[0] > 0.5)
    True
    """

    _algorithm = "sgd"

    def __init__(
        self,
        eta: float = 5e-4,
        mu: float = 0.0,
        step: StepRule = "descent",
        kappa: float | None = None,
        lam: float = 0.0,
        gamma_pair: float = 1e-2,
        margin: float = 1.0,
        normalize: Normalize = "none",
        random_state: Any = None,
    ) -> None:
        self.eta = eta
        self.mu = mu
        self.step = step
        self.kappa = kappa
        self.lam = lam
        self.gamma_pair = gamma_pair
        self.margin = margin
        self.normalize = normalize
        self.random_state = random_state


class SGDPSD(_OnlineMetric):
    """Projected online SGD on ``M = L^T L`` (``algorithm="sgd_psd"``, :mod:`service.core.psd`):
    the convex setting of the stability paper (Chen et al., AAAI 2023); **O(d^3) per active step**
    (an eigendecomposition).

    Hyperparameters as :class:`SGD`, with defaults ``eta = 2e-3`` (a step on ``M``: near
    ``M = I`` it matches OPML's and SGD's steps on ``L`` to first order) and ``mu = 0.1`` (a
    smooth loss); no cold-start pre-stage. ``learner_.stability()`` reports the step-mass
    diagnostics, with Lemma 2's ``gamma_hat`` when every step met the 1-expansiveness
    condition.

    >>> from service.core import SGDPSD
    >>> X = [[0.0, 0.0], [0.0, 0.5], [0.3, 0.0], [0.3, 0.5], [0.0, 0.1], [0.2, 0.5]]
    >>> m = SGDPSD(eta=0.05, random_state=0).fit(X, [0, 1, 0, 1, 0, 1])
    >>> bool(np.linalg.eigvalsh(m.get_mahalanobis_matrix()).min() >= -1e-12)
    True
    >>> m.learner_.stability().gamma_hat is not None
    True
    """

    _algorithm = "sgd_psd"

    def __init__(
        self,
        eta: float = 2e-3,
        mu: float = 0.1,
        step: StepRule = "descent",
        kappa: float | None = None,
        lam: float = 0.0,
        margin: float = 1.0,
        normalize: Normalize = "none",
        random_state: Any = None,
    ) -> None:
        self.eta = eta
        self.mu = mu
        self.step = step
        self.kappa = kappa
        self.lam = lam
        self.margin = margin
        self.normalize = normalize
        self.random_state = random_state


class BRM(_OnlineMetric):
    """Online BRM-R (``algorithm="brm"``, :mod:`service.core.brm`): ``L`` learned under the
    boundary-restricted distance ``D_R`` (the BRM paper, Sigmoid, ``p = 2``).

    ``margin`` is the relative loss's ``tau`` on ``D_R^2`` (< 1); ``restricted_distance``
    gives ``D_R`` of pairs; ``pair_distance`` stays the Mahalanobis distance of ``L``.

    >>> from service.core import BRM
    >>> X = [[0.0, 0.0], [0.0, 2.0], [2.0, 0.0], [2.0, 2.0], [0.0, 0.3], [1.8, 2.0]]
    >>> m = BRM(eta=0.5, step="constant", random_state=0).fit(X, [0, 1, 0, 1, 0, 1])
    >>> d = m.restricted_distance([[[0.0, 0.0], [0.0, 2.0]], [[0.0, 0.0], [2.0, 0.0]]])
    >>> bool(0.0 <= d.min() and d.max() < 1.0)
    True
    """

    _algorithm = "brm"

    def __init__(
        self,
        eta: float = 0.3,
        step: StepRule = "descent",
        kappa: float | None = None,
        lam: float = 0.0,
        margin: float = 0.1,
        normalize: Normalize = "none",
        random_state: Any = None,
    ) -> None:
        self.eta = eta
        self.step = step
        self.kappa = kappa
        self.lam = lam
        self.margin = margin
        self.normalize = normalize
        self.random_state = random_state

    def restricted_distance(self, pairs: Any) -> Array:
        """``D_R`` (the BRM paper's Eq. 7) of ``pairs``, an array of shape ``(n, 2,
        d)``; in [0, 1)."""
        learner = self._fitted()
        arr = _check_pairs(pairs, learner.dim)
        return restricted_root(learner.restricted_squared_pairs(arr[:, 0], arr[:, 1]))


class OnlineLDA(_OnlineMetric):
    """Fisher's discriminant metric from within-class statistics kept online
    (``algorithm="lda"``, :mod:`service.core.within`): the ``K - 1`` discriminant directions,
    recomputed every ``refresh`` samples (and at 32, 64, 128, ... before that).

    >>> import numpy as np
    >>> from service.core import OnlineLDA
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, size=300)
    >>> X = rng.normal(size=(300, 4)) + 3.0 * np.eye(3, 4)[y]
    >>> m = OnlineLDA(refresh=300).fit(X, y)
    >>> int(np.linalg.matrix_rank(m.components_))  # K - 1 directions
    2
    """

    _algorithm = "lda"

    def __init__(
        self,
        refresh: int = 1000,
        shrinkage: float = 0.0,
        margin: float = 1.0,
        normalize: Normalize = "none",
        random_state: Any = None,
    ) -> None:
        self.refresh = refresh
        self.shrinkage = shrinkage
        self.margin = margin
        self.normalize = normalize
        self.random_state = random_state

"""The Gaussian mechanism on model updates: clipping and noise, pure numpy functions.

A model update u = (u_1, …, u_L) is treated as one vector across all its layers. The
mechanism (DP-FedAvg, McMahan et al. 2018; GDPFed Alg. 1) is

    clip:   ū = u · min(1, C / ‖u‖₂)                       so that ‖ū‖₂ <= C,
    noise:  ũ = ū + N(0, σ² C² / m · I)                     m = noise shares.

If m clients each add N(0, σ²C²/m) and only their *sum* is released (secure aggregation,
or a trusted aggregator that publishes only the sum), the sum carries N(0, σ²C²) noise: a
Gaussian mechanism with multiplier σ for any one client's contribution (sensitivity C).
Each *single* upload, as an honest-but-curious server sees it without secure aggregation,
only carries multiplier σ/√m (:func:`local_noise_multiplier`); with m = 1 the two coincide
and every upload is private on its own (local DP).

Nothing here draws from numpy's global random state: noise takes an explicit source, a
:class:`privacy.randomness.NoiseSource` (what clients use: entropy nobody else knows) or a
``np.random.Generator`` (seeded, for tests).

**Floating point (issue 39).** The noise here is a float Gaussian added to a float update, so its
low-order bits may carry information about the value it was added to (Mironov, CCS 2012, for the
Laplace mechanism); nothing here counters that, and every report says so. The exact alternative is
``secure-aggregation = "secagg+ddg"`` (:mod:`privacy.mechanisms.ddg`: integers, discrete Gaussian
noise drawn in integer arithmetic); why the float paths keep the report's line instead of snapping
is said there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from privacy.checks import check_int, check_nonnegative_finite, check_positive_finite
from privacy.randomness import NoiseSource

__all__ = [
    "CLIPPED",
    "NOISE_STD",
    "NON_FINITE",
    "UPDATE_NORM",
    "clip_update",
    "finite_or_zero",
    "gaussian_noise_like",
    "l2_norm",
    "local_noise_multiplier",
    "privatize_update",
]

#: Diagnostic keys returned by :func:`privatize_update` (kebab-case, like the metric keys).
UPDATE_NORM = "update-norm"
CLIPPED = "clipped"
NOISE_STD = "noise-std"
NON_FINITE = "non-finite-update"

_MAX_SHRINK_ITERATIONS = 64


def _check_arrays(arrays: Sequence[np.ndarray], name: str = "update") -> list[np.ndarray]:
    if isinstance(arrays, np.ndarray):
        raise TypeError(f"{name} must be a sequence of arrays (one per layer), not one ndarray")
    out = [np.asarray(a) for a in arrays]
    for i, a in enumerate(out):
        if not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"{name}[{i}] must have a floating dtype; found {a.dtype}")
    return out


def l2_norm(arrays: Sequence[np.ndarray]) -> float:
    """Global Euclidean norm ‖u‖₂ = sqrt(Σ_l ‖u_l‖²) over all arrays, in float64.

    An empty sequence has norm 0. Computed as a hypotenuse of per-array norms, so it does
    not overflow before the result itself does.
    """
    norms = [_array_norm(np.asarray(a, dtype=np.float64).ravel()) for a in arrays]
    return math.hypot(*norms) if norms else 0.0


def _square_sum(flat: np.ndarray) -> float:
    # einsum, not ``flat @ flat``: BLAS' dot spreads a 10^4-element vector over its threads, which on a
    # busy machine costs a millisecond of waiting per call (#38: a third of a GDPFed client's DP step)
    return float(np.einsum("i,i->", flat, flat))


def _array_norm(flat: np.ndarray) -> float:
    with np.errstate(over="ignore"):
        norm = math.sqrt(_square_sum(flat))
    if math.isinf(norm) and np.isfinite(flat).all():  # squares overflowed: rescale
        peak = float(np.abs(flat).max())
        scaled = flat / peak
        norm = peak * math.sqrt(_square_sum(scaled))
    return norm


def clip_update(
    update: Sequence[np.ndarray], max_norm: float
) -> tuple[list[np.ndarray], float]:
    """Scale the whole update by min(1, C/‖u‖₂), all layers together.

    Parameters
    ----------
    update : sequence of ndarray
        The layers of one update; floating dtypes.
    max_norm : float
        Clipping bound C > 0.

    Returns
    -------
    clipped : list of ndarray
        New arrays (same shapes and dtypes) with ‖clipped‖₂ <= C; an update already within
        the bound (including the zero update) is returned unchanged (copied). The
        direction is preserved. In low precision dtypes the scale is nudged down by a few
        ulps when rounding would otherwise leave the norm a hair above C.
    pre_clip_norm : float
        ‖u‖₂ before clipping.

    Raises
    ------
    ValueError
        If C is not a positive finite number, or the update holds NaN or inf.
    TypeError
        If an array is not floating point.
    """
    bound = check_positive_finite("max_norm", max_norm)
    arrays = _check_arrays(update)
    norm = l2_norm(arrays)
    if not math.isfinite(norm):
        raise ValueError(f"update must be finite to be clipped; its norm is {norm}")
    if norm <= bound:  # also the zero update: nothing to scale, no division by zero
        return [a.copy() for a in arrays], norm
    scale = bound / norm
    for _ in range(_MAX_SHRINK_ITERATIONS):
        clipped = [(a.astype(np.float64) * scale).astype(a.dtype) for a in arrays]
        if l2_norm(clipped) <= bound:
            return clipped, norm
        scale *= 1.0 - 4.0 * max(float(np.finfo(a.dtype).eps) for a in arrays)
    raise ValueError(f"could not clip update of norm {norm} to {bound} in its dtype")


def gaussian_noise_like(
    arrays: Sequence[np.ndarray], std: float, rng: np.random.Generator | NoiseSource
) -> list[np.ndarray]:
    """Independent N(0, std²) noise with the shapes and dtypes of ``arrays``.

    Drawn in float64 from ``rng`` (array by array, in order) and cast to each array's
    dtype, so equal seeds give identical noise. ``std = 0`` returns zeros and draws
    nothing.

    Raises
    ------
    ValueError
        If ``std`` is negative or not finite.
    TypeError
        If ``rng`` is neither a ``numpy.random.Generator`` nor a noise source, or an array
        is not floating point.
    """
    std = check_nonnegative_finite("std", std)
    arrays = _check_arrays(arrays, name="arrays")
    draw: Callable[[tuple[int, ...]], np.ndarray]
    if isinstance(rng, np.random.Generator):
        draw = lambda shape: rng.standard_normal(shape) * std  # noqa: E731
    elif isinstance(rng, NoiseSource):
        draw = lambda shape: rng.normal(shape, std)  # noqa: E731
    else:
        raise TypeError(f"rng must be a numpy.random.Generator or a NoiseSource; found {type(rng).__name__}")
    if std == 0.0:
        return [np.zeros(a.shape, dtype=a.dtype) for a in arrays]
    return [draw(a.shape).astype(a.dtype) for a in arrays]


def finite_or_zero(update: Sequence[np.ndarray]) -> tuple[list[np.ndarray], bool]:
    """The update, or the zero update of its shapes where any coordinate is NaN or ±inf; and whether it was.

    Local training can diverge on a client's data. Refusing to release then would tell whoever
    sees the reply that it did: a data-dependent bit that no charge covers. Releasing the zero
    update instead keeps the mechanism's input a function of the data into the C-ball (the zero
    update is in it and does not depend on the data), so the sensitivity, 2C under replace-one,
    and with it the charge, hold unchanged. (TFF's robust aggregators zero non-finite updates
    the same way.)
    """
    arrays = [np.asarray(a) for a in update]
    if all(np.isfinite(a).all() for a in arrays):
        return arrays, False
    return [np.zeros_like(a) for a in arrays], True


def privatize_update(
    update: Sequence[np.ndarray],
    *,
    clip: float,
    noise_multiplier: float,
    noise_shares: int,
    rng: np.random.Generator | NoiseSource,
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Clip an update to C, then add this client's share of Gaussian noise.

    ũ = clip(u, C) + N(0, σ²C²/m · I), with m = ``noise_shares``: m clients whose noise
    sums to one release with multiplier σ (m = 1: each upload is private on its own).
    σ = 0 clips only (no noise, no privacy from this step).

    Parameters
    ----------
    update : sequence of ndarray
        The layers of the update (e.g. local model − global model).
    clip : float
        Clipping bound C > 0 (the L2 sensitivity of one client's contribution).
    noise_multiplier : float
        σ >= 0 of the *released aggregate*.
    noise_shares : int
        m >= 1, how many clients' noise adds up to the release.
    rng : numpy.random.Generator or NoiseSource
        Source of the noise (clients pass a private :mod:`privacy.randomness` source).

    Returns
    -------
    noisy : list of ndarray
        The privatised update, same shapes and dtypes.
    diagnostics : dict of str to float
        ``"update-norm"``: ‖u‖₂ before clipping; ``"clipped"``: 1.0 if clipping changed
        the update, else 0.0; ``"noise-std"``: σC/√m, the per-coordinate noise std added;
        ``"non-finite-update"``: 1.0 if u held NaN or inf and the zero update was released in its
        place (:func:`finite_or_zero`), else 0.0.
    """
    bound = check_positive_finite("clip", clip)
    sigma = check_nonnegative_finite("noise_multiplier", noise_multiplier)
    shares = check_int("noise_shares", noise_shares, minimum=1)
    finite, zeroed = finite_or_zero(_check_arrays(update))
    clipped, norm = clip_update(finite, bound)
    std = sigma * bound / math.sqrt(shares)
    noise = gaussian_noise_like(clipped, std, rng)
    noisy = [(c + n).astype(c.dtype) for c, n in zip(clipped, noise, strict=True)]
    diagnostics = {
        UPDATE_NORM: norm,
        CLIPPED: 1.0 if norm > bound else 0.0,
        NOISE_STD: std,
        NON_FINITE: 1.0 if zeroed else 0.0,
    }
    return noisy, diagnostics


def local_noise_multiplier(noise_multiplier: float, noise_shares: int) -> float:
    """σ/√m: the multiplier that one client's upload carries on its own.

    With m shares each client adds N(0, σ²C²/m). An honest-but-curious server that sees
    individual uploads (no secure aggregation) sees one clipped update under noise std
    σC/√m, i.e. a Gaussian mechanism with multiplier σ/√m: that, not σ, is the guarantee
    against the server, and what a client charges to its own ledger. (The ledger's
    replace-one accountant applies the sensitivity 2C of replacing a client's whole
    update by another; see :mod:`privacy.accountants`.) σ holds only for the *sum* of all m
    shares, and only if all m clients actually add their share: if just m' < m do
    (dropouts), the sum carries multiplier σ√(m'/m); if k of them collude with the server
    and reveal their noise, the rest protects a client with σ√((m−k)/m).

    Raises
    ------
    ValueError
        If σ < 0 or not finite, or m < 1.
    """
    sigma = check_nonnegative_finite("noise_multiplier", noise_multiplier)
    shares = check_int("noise_shares", noise_shares, minimum=1)
    return sigma / math.sqrt(shares)

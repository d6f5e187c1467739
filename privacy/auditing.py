"""Empirical privacy: lower bounds on ε from attacks on canaries, and the one-shot estimate.

An accountant gives an *upper* bound on ε for the mechanism it was told about. An audit runs
the mechanism itself on canaries, attacks it, and turns the attack's success into a *lower*
bound on ε at a stated confidence: a falsification test. If the lower bound exceeds what the
ledger charged, the mechanism (or its charge) is broken; if it does not, nothing is proven
beyond "this attack did not break it". Everything here is pure statistics, independent of
:mod:`privacy.accountants` (the tests check one against the other).

Notation: a canary is a unit whose presence is randomised by a secret bit S ∈ {−1, +1}, drawn
uniformly and independently per canary; changing one S gives a neighbouring input (under
replace-one: the canary's record or update +u against −u; under add/remove: present against
absent). The attack turns what it observes into a score per canary, higher meaning "S = +1".

The ε of a pair of Gaussians (eq. (1), the Gaussian mechanism's exact privacy profile, and its
unequal-variance generalisation) is :mod:`privacy.gaussian_profile`'s.

**One run** (Steinke, Nasr & Jagielski, NeurIPS 2023, Thm. 3.1 with δ as in their Prop. 5.4
and Algorithm 2). m canaries, r guesses T_i ∈ {−1, +1} (abstaining on the rest), W the number
of correct guesses. If the mechanism is (ε, δ)-DP with respect to each S_i, then for every v

    P[W >= v] <= β + α·2mδ,   β = P[Binomial(r, q) >= v],   q = e^ε / (1 + e^ε),           (2)
                              α = max_{i = 1..v} P[v − i <= Binomial(r, q) < v] / i.

So observing v correct rejects (ε, δ)-DP at significance p when (2) is <= p; the lower bound
is the largest such ε (:func:`one_run_epsilon_bound`). A claim of ε also holds for every
ε' > ε, so the sup of rejected ε is a valid bound whatever the shape of (2) in ε. Guessing +1
on the k highest scores and −1 on the k lowest (:func:`one_run_audit`) makes r = 2k fixed in
advance; k is chosen from a fixed grid with a Bonferroni correction, so no choice depends on
the secrets.

**Hypothesis test** (Kairouz et al. 2015; Jagielski et al. 2020; Nasr et al., "Tight
Auditing", USENIX Security 2023). Any test of S = −1 against S = +1 with false-positive rate
FPR and false-negative rate FNR satisfies, under (ε, δ)-DP,

    ε >= log((1 − δ − FNR) / FPR)   and   ε >= log((1 − δ − FPR) / FNR).                 (3)

With Clopper–Pearson upper bounds on both rates (each at significance p/2), (3) is a lower
bound at confidence 1 − p (:func:`hypothesis_test_bound`), and since the two rate bounds hold
together, (3) bounds ε(δ') for every δ' at once (:class:`RateBounds`): the empirical privacy
curve, to set against a claimed one. The threshold must not be chosen on the trials that are
counted: :func:`threshold_audit` picks it on a pilot share of the trials and counts the rest.

**One-shot estimate** (Andrew, Kairouz, Oh, Oprea, McMahan & Suriyakumar, "One-shot Empirical
Privacy Estimation for Federated Learning", ICLR 2024, arXiv 2302.03098, Sec. 3–4). Canaries
are random unit directions; the statistic of each is the cosine between the final model
delta and the canary (:func:`canary_cosines`). Gaussians are fitted to the cosines of the
inserted canaries and of the others (held out, or inserted with the opposite sign), and ε is
that of the two fitted Gaussians at δ (:func:`one_shot_epsilon`). It is an *estimate* (exact
for the Gaussian mechanism as the dimension grows), not a bound, and it has no confidence
level.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from privacy.gaussian_profile import EPS_MAX, EPS_TOL, check_delta, gaussian_epsilon, two_gaussians_epsilon

# scipy is imported inside the functions that use it: ``privet --help`` and config errors import this
# module for DEFAULT_CONFIDENCE and must stay fast (scipy.stats alone is ~0.5-2 s; tests/privet/test_cli_imports.py).

__all__ = [
    "DEFAULT_CONFIDENCE",
    "GUESS_FRACTIONS",
    "OneShotEstimate",
    "canary_cosines",
    "clopper_pearson_upper",
    "hypothesis_test_bound",
    "one_run_audit",
    "one_run_epsilon_bound",
    "one_run_p_value",
    "one_shot_epsilon",
    "RateBounds",
    "rate_bounds",
    "threshold_audit",
]

#: The confidence every lower bound is stated at unless a caller says otherwise.
DEFAULT_CONFIDENCE = 0.95

#: Fractions of the canaries :func:`one_run_audit` tries guessing on (Bonferroni over all of them).
GUESS_FRACTIONS: tuple[float, ...] = (1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128)

def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1); found {confidence!r}")
    return float(confidence)


# --------------------------------------------------------------------------- one run (Steinke et al.)
def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """The bound (2) on P[W >= v] under (ε, δ)-DP: a p-value for rejecting (ε, δ)-DP.

    Parameters
    ----------
    canaries : int
        m, every canary whose bit was randomised (guessed on or not).
    guesses, correct : int
        r guesses made (fixed in advance), v of them correct; 0 <= v <= r <= m.
    epsilon, delta : float
        The (ε, δ) claim being tested.

    Notes
    -----
    α is computed from the binomial probabilities within 40 standard deviations of the mean;
    the mass outside, at most P[Binomial < k_low], is added to the last running average, so
    the value returned is never below (2).
    """
    from scipy import stats
    from scipy.special import expit

    m, r, v = int(canaries), int(guesses), int(correct)
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries; found {v}, {r}, {m}")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0; found {epsilon!r}")
    delta = check_delta(delta)
    if v == 0:
        return 1.0
    q = float(expit(epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0.0:
        return min(1.0, beta)
    spread = 40.0 * math.sqrt(r * q * (1 - q)) + 40.0
    low = max(0, min(v - 1, int(math.floor(r * q - spread))))
    values = np.arange(v - 1, low - 1, -1)  # v−1, v−2, …, low: the i-th is v − i
    running = np.cumsum(stats.binom.pmf(values, r, q))
    counts = np.arange(1, values.size + 1)
    alpha = float(np.max(running / counts))
    if low > 0:  # P[v − i <= Bin < v] for i > v − low is at most running[-1] + P[Bin < low]
        alpha = max(alpha, (float(running[-1]) + float(stats.binom.cdf(low - 1, r, q))) / (v - low + 1))
    return min(1.0, beta + alpha * 2.0 * m * delta)


def _largest_rejected(p_value: Callable[[float], float], significance: float) -> float:
    """sup{ε : p(ε) <= significance} by bisection; the value returned is always one whose p was verified."""
    if float(p_value(0.0)) > significance:
        return 0.0
    low, high = 0.0, 1.0
    while float(p_value(high)) <= significance:
        low, high = high, 2.0 * high
        if high > EPS_MAX:
            return low
    while high - low > EPS_TOL * max(1.0, low):
        mid = 0.5 * (low + high)
        if float(p_value(mid)) <= significance:
            low = mid
        else:
            high = mid
    return low


def one_run_epsilon_bound(canaries: int, guesses: int, correct: int, delta: float,
                          confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The largest ε that (2) rejects at significance 1 − confidence: a lower bound on ε.

    Valid (true ε below it with probability >= confidence) when the guesses were fixed without
    looking at the secrets; 0 when not even ε = 0 is rejected.
    """
    significance = 1.0 - _check_confidence(confidence)
    return _largest_rejected(lambda eps: one_run_p_value(canaries, guesses, correct, eps, delta), significance)


def _as_trials(scores: Sequence[float] | np.ndarray, secrets: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    b = np.asarray(secrets).ravel()
    if s.size != b.size or s.size == 0:
        raise ValueError(f"scores and secrets must be non-empty and of equal length; found {s.size}, {b.size}")
    if not np.all(np.isin(b, (-1, 1))):
        raise ValueError("secrets must be -1 or +1")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    return s, b.astype(np.int64)


def one_run_audit(scores: Sequence[float] | np.ndarray, secrets: Sequence[int] | np.ndarray, delta: float,
                  confidence: float = DEFAULT_CONFIDENCE, *, two_sided: bool = True,
                  fractions: Sequence[float] = GUESS_FRACTIONS) -> float:
    """Steinke et al.'s lower bound from canary scores: guess on the extremes, best of a fixed grid.

    For each fraction f of the m canaries, guess +1 on the ⌊fm/2⌋ highest scores and −1 on as
    many lowest (``two_sided``; otherwise +1 on the ⌊fm⌋ highest only), count the correct
    guesses, and take :func:`one_run_epsilon_bound` at significance (1 − confidence)/|grid|;
    the maximum over the grid is a lower bound at ``confidence`` (Bonferroni). Ties are broken
    by canary index, which is independent of the secrets.
    """
    s, b = _as_trials(scores, secrets)
    m = s.size
    significance = (1.0 - _check_confidence(confidence)) / len(fractions)
    order = np.argsort(-s, kind="stable")  # highest first
    ranked = b[order]
    best = 0.0
    for fraction in fractions:
        if not 0 < fraction <= 1:
            raise ValueError(f"guess fractions must be in (0, 1]; found {fraction!r}")
        k = int(fraction * m) // 2 if two_sided else int(fraction * m)
        if k == 0:
            continue
        correct = int(np.sum(ranked[:k] == 1))
        if two_sided:
            correct += int(np.sum(ranked[m - k:] == -1))
        guesses = 2 * k if two_sided else k
        best = max(best, one_run_epsilon_bound(m, guesses, correct, delta, 1.0 - significance))
    return best


# --------------------------------------------------------------------------- hypothesis test
def clopper_pearson_upper(count: int | np.ndarray, trials: int, confidence: float) -> np.ndarray:
    """One-sided Clopper–Pearson upper bound on a binomial rate: P[rate <= bound] >= confidence."""
    from scipy import stats

    confidence = _check_confidence(confidence)
    k = np.asarray(count, dtype=np.float64)
    if trials <= 0:
        return np.ones_like(k)
    safe = np.minimum(k, trials - 1)  # beta.ppf needs n − k > 0; k = n is bound 1 below
    upper = np.where(k >= trials, 1.0, stats.beta.ppf(confidence, safe + 1, trials - safe))
    return np.asarray(upper, dtype=np.float64)


@dataclass(frozen=True)
class RateBounds:
    """Upper confidence bounds on the error rates of one test, holding together at ``confidence``.

    By (3), every δ' gets a lower bound :meth:`epsilon` from the same two numbers, and all of
    them hold at once (one event: both rates are below their bounds). So the whole empirical
    privacy curve can be set against a claimed one at no further cost in confidence.

    Attributes
    ----------
    false_positive, false_negative : float
        Clopper–Pearson upper bounds on FPR and FNR, each at significance (1 − confidence)/2.
    confidence : float
        The joint confidence.
    negatives, positives : int
        The trials counted (S = −1 and S = +1).
    """

    false_positive: float
    false_negative: float
    confidence: float
    negatives: int
    positives: int

    def epsilon(self, delta: float) -> float:
        """The larger side of eq. (3) at δ (0 where neither is positive)."""
        delta = check_delta(delta)
        return max(0.0, _ratio_bound(self.false_negative, self.false_positive, delta),
                   _ratio_bound(self.false_positive, self.false_negative, delta))


def rate_bounds(false_positives: int, negatives: int, false_negatives: int, positives: int,
                confidence: float = DEFAULT_CONFIDENCE) -> RateBounds:
    """Clopper–Pearson upper bounds on FPR and FNR, each at significance (1 − confidence)/2."""
    per_rate = 1.0 - (1.0 - _check_confidence(confidence)) / 2.0
    return RateBounds(float(clopper_pearson_upper(false_positives, negatives, per_rate)),
                      float(clopper_pearson_upper(false_negatives, positives, per_rate)),
                      confidence, int(negatives), int(positives))


def hypothesis_test_bound(false_positives: int, negatives: int, false_negatives: int, positives: int,
                          delta: float, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """Eq. (3) with Clopper–Pearson upper bounds on FPR and FNR, each at significance (1 − confidence)/2.

    Returns the larger of the two directions of (3), and 0 where neither is positive.
    """
    return rate_bounds(false_positives, negatives, false_negatives, positives, confidence).epsilon(delta)


def _ratio_bound(miss: float | np.ndarray, false_alarm: float | np.ndarray, delta: float) -> float:
    """Max of log((1 − δ − miss) / false_alarm) (elementwise, NaN/−inf where undefined), as a float."""
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.log(1.0 - delta - np.asarray(miss)) - np.log(np.asarray(false_alarm))
    value = np.where(np.isnan(value), -np.inf, value)
    return float(np.max(value, initial=-np.inf))


def _rates_by_threshold(s: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """For every candidate threshold t (score >= t ⇒ guess +1): thresholds, FP counts, FN counts, #neg, #pos."""
    pos, neg = np.sort(s[b == 1]), np.sort(s[b == -1])
    thresholds = np.concatenate([np.unique(s), [np.inf]])
    fp = neg.size - np.searchsorted(neg, thresholds, side="left")
    fn = np.searchsorted(pos, thresholds, side="left")
    return thresholds, fp, fn, int(neg.size), int(pos.size)


def threshold_audit(scores: Sequence[float] | np.ndarray, secrets: Sequence[int] | np.ndarray, delta: float,
                    confidence: float = DEFAULT_CONFIDENCE, *, pilot_fraction: float = 0.25,
                    against: Sequence[tuple[float, float]] | None = None) -> RateBounds:
    """Nasr et al.'s threshold attack with Clopper–Pearson bounds, the threshold chosen on a pilot share.

    The first ⌊pilot_fraction · n⌋ trials (their order is independent of the secrets) choose
    the threshold; the remaining trials are counted once, at that threshold, so
    ``.epsilon(δ')`` of the result is a lower bound on ε(δ') at ``confidence``, for every δ'
    at once. With too few trials on either side the bounds are 1 (no information).

    Parameters
    ----------
    against : sequence of (δ', ε'), optional
        A claimed privacy curve. Without it the threshold maximises the bound (3) at δ on the
        pilot; with it, the largest excess max_δ' [bound(δ') − ε'] over the claim (the test
        most likely to refute the claim, often far from the tail that δ = 1e-5 needs).
    """
    s, b = _as_trials(scores, secrets)
    delta = check_delta(delta)
    confidence = _check_confidence(confidence)
    if not 0 < pilot_fraction < 1:
        raise ValueError(f"pilot_fraction must be in (0, 1); found {pilot_fraction!r}")
    split = int(pilot_fraction * s.size)
    rest_b = b[split:]
    negatives, positives = int(np.sum(rest_b == -1)), int(np.sum(rest_b == 1))
    thresholds, fp, fn, n_neg, n_pos = _rates_by_threshold(s[:split], b[:split])
    if min(n_neg, n_pos, negatives, positives) == 0:
        return RateBounds(1.0, 1.0, confidence, negatives, positives)
    per_rate = 1.0 - (1.0 - confidence) / 2.0
    fpr = clopper_pearson_upper(fp, n_neg, per_rate)
    fnr = clopper_pearson_upper(fn, n_pos, per_rate)

    def curve(d: float) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            both = np.maximum(np.log(1.0 - d - fnr) - np.log(fpr), np.log(1.0 - d - fpr) - np.log(fnr))
        return np.asarray(np.nan_to_num(both, nan=-np.inf), dtype=np.float64)

    if against is None:
        objective = curve(delta)
    else:
        claims = [(check_delta(d), float(e)) for d, e in against]
        if not claims:
            raise ValueError("against must hold at least one (delta, epsilon) claim")
        objective = np.max(np.stack([np.maximum(curve(d), 0.0) - e for d, e in claims]), axis=0)
    threshold = float(thresholds[int(np.argmax(objective))])
    guess_pos = s[split:] >= threshold
    false_pos = int(np.sum(guess_pos & (rest_b == -1)))
    false_neg = int(np.sum(~guess_pos & (rest_b == 1)))
    return rate_bounds(false_pos, negatives, false_neg, positives, confidence)


# --------------------------------------------------------------------------- one-shot (Andrew et al.)
def canary_cosines(observed: np.ndarray, canaries: np.ndarray) -> np.ndarray:
    """cos(observed, c_j) for each canary direction c_j (rows of ``canaries``).

    ``observed`` is one flat vector (the final model delta) or one per canary (same row count).
    """
    obs = np.asarray(observed, dtype=np.float64)
    can = np.atleast_2d(np.asarray(canaries, dtype=np.float64))
    can_norm = np.linalg.norm(can, axis=1)
    if obs.ndim == 1:
        dots = can @ obs
        obs_norm = np.full(can.shape[0], np.linalg.norm(obs))
    else:
        if obs.shape != can.shape:
            raise ValueError(f"one observed vector per canary needs shape {can.shape}; found {obs.shape}")
        dots = np.einsum("ij,ij->i", obs, can)
        obs_norm = np.linalg.norm(obs, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = dots / (obs_norm * can_norm)
    return np.asarray(np.nan_to_num(cos, nan=0.0), dtype=np.float64)


@dataclass(frozen=True)
class OneShotEstimate:
    """Andrew et al.'s ε estimate and the two Gaussians it was read from.

    Attributes
    ----------
    epsilon : float
        ε of N(mean_out, std_out²) against N(mean_in, std_in²) at ``delta``.
    mean_in, std_in, mean_out, std_out : float
        The fitted Gaussians (sample mean and standard deviation) of the inserted canaries'
        statistics and of the others'.
    delta : float
        δ the estimate is for.
    """

    epsilon: float
    mean_in: float
    std_in: float
    mean_out: float
    std_out: float
    delta: float


def one_shot_epsilon(inserted: Sequence[float] | np.ndarray, held_out: Sequence[float] | np.ndarray,
                     delta: float, *, equal_variance: bool = True) -> OneShotEstimate:
    """Fit a Gaussian to each population of canary statistics and return the ε between the two.

    With ``equal_variance`` (the default) the two fits share their pooled standard deviation s
    and ε is that of the Gaussian mechanism with μ = |mean_in − mean_out| / s (eq. (1) of
    :mod:`privacy.gaussian_profile`): under the Gaussian mechanism the two variances are equal, and fitting them apart only adds
    sampling noise, which a quadratic privacy loss turns into a large overestimate at small δ.
    Without it, ε is that of the two separately fitted Gaussians (as Andrew et al.'s code
    reads a fitted N(μ, σ²) against the null).

    Parameters
    ----------
    inserted : array_like
        The statistic (cosine) of each inserted canary, >= 2 values.
    held_out : array_like
        The statistic of each canary that was not inserted (add/remove), or was inserted with
        the opposite sign (replace-one), >= 2 values.
    delta : float
        δ of the estimate.
    """
    delta = check_delta(delta, allow_zero=False)
    x_in, x_out = np.asarray(inserted, dtype=np.float64).ravel(), np.asarray(held_out, dtype=np.float64).ravel()
    if x_in.size < 2 or x_out.size < 2:
        raise ValueError(f"each population needs >= 2 values; found {x_in.size} and {x_out.size}")
    m_in, s_in = float(np.mean(x_in)), float(np.std(x_in, ddof=1))
    m_out, s_out = float(np.mean(x_out)), float(np.std(x_out, ddof=1))
    if equal_variance:
        pooled = math.sqrt(((x_in.size - 1) * s_in**2 + (x_out.size - 1) * s_out**2) / (x_in.size + x_out.size - 2))
        s_in = s_out = pooled
        eps = gaussian_epsilon(abs(m_in - m_out) / pooled, delta) if pooled > 0 else (
            0.0 if m_in == m_out else math.inf)
    else:
        eps = two_gaussians_epsilon(m_out, s_out, m_in, s_in, delta)
    return OneShotEstimate(eps, m_in, s_in, m_out, s_out, delta)

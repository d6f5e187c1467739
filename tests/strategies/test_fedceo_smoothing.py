"""Tests for strategies/fedceo_smoothing.py: the FedCEO server mathematics.

Every expected value is computed independently here (full-FFT loops, per-slice SVDs,
direct objective evaluation); nothing is compared against hard-coded outputs except
the threshold table of the notes, which is itself derived from the paper's formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from strategies import tensor_svt as tensor_svt_module
from strategies.fedceo_smoothing import (
    is_smoothing_round,
    mean_model,
    smooth_client_models,
    smoothed_mean_model,
    smoothing_threshold,
    stack_clients,
    svt_matrix,
    tensor_svt,
    unstack_clients,
)


# ----------------------------------------------------------------- independent oracles
def tnn(x: np.ndarray) -> float:
    """Tensor nuclear norm, Definition 2.2: mean over the K full-FFT slices."""
    xf = np.fft.fft(x, axis=2)
    k = x.shape[2]
    return sum(np.linalg.norm(xf[:, :, i], "nuc") for i in range(k)) / k


def objective(x: np.ndarray, y: np.ndarray, c: float) -> float:
    """f(X) = ½‖X − Y‖_F² + c · TNN(X)."""
    return 0.5 * float(np.sum((x - y) ** 2)) + c * tnn(x)


def loop_t_tsvd(y: np.ndarray, thr: float) -> np.ndarray:
    """Reference T-tSVD: one full FFT, one SVD per slice in a plain loop."""
    yf = np.fft.fft(y, axis=2)
    out = np.empty_like(yf)
    for i in range(y.shape[2]):
        u, s, vh = np.linalg.svd(yf[:, :, i], full_matrices=False)
        out[:, :, i] = (u * np.maximum(s - thr, 0.0)) @ vh
    return np.fft.ifft(out, axis=2).real


def slice_singular_values(y: np.ndarray) -> list[np.ndarray]:
    yf = np.fft.fft(y, axis=2)
    return [np.linalg.svd(yf[:, :, i], compute_uv=False) for i in range(y.shape[2])]


def correlated_clients(
    rng: np.random.Generator,
    n1: int,
    n2: int,
    k: int,
    rank: int = 2,
    noise: float = 0.3,
) -> np.ndarray:
    """Clients = shared low-rank model + independent noise, stacked as (n1, n2, K)."""
    common = rng.standard_normal((n1, rank)) @ rng.standard_normal((rank, n2))
    return common[:, :, None] + noise * rng.standard_normal((n1, n2, k))


def random_models(
    rng: np.random.Generator, k: int, shapes: list[tuple[int, ...]], noise: float = 0.3
) -> list[list[np.ndarray]]:
    common = [rng.standard_normal(s) for s in shapes]
    return [
        [c + noise * rng.standard_normal(c.shape) for c in common] for _ in range(k)
    ]


# conv, bias, linear, bias, linear, scalar
SHAPES = [(4, 3, 3, 3), (4,), (5, 36), (5,), (3, 5), ()]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20250713)


# --------------------------------------------------------- proximal-operator property
@pytest.mark.parametrize("k", [4, 5])
def test_tensor_svt_is_prox_of_tnn(rng: np.random.Generator, k: int) -> None:
    y = correlated_clients(rng, 6, 5, k)
    all_sv = np.concatenate(slice_singular_values(y))
    thr = float(np.median(all_sv))  # kills some singular values, keeps others
    x_star = tensor_svt(y, thr)
    f_star = objective(x_star, y, thr)
    tol = 1e-10 * (1.0 + abs(f_star))

    # f is 1-strongly convex, so at its minimiser f(X) − f(X*) ≥ ½‖X − X*‖² for all X.
    for scale in (1e-4, 1e-2, 1.0):
        for _ in range(40):
            delta = rng.standard_normal(y.shape)
            delta *= scale / np.linalg.norm(delta)
            gap = objective(x_star + delta, y, thr) - f_star
            assert gap >= 0.5 * scale**2 - tol
    mean_tensor = np.repeat(y.mean(axis=2, keepdims=True), k, axis=2)
    for other in (y, np.zeros_like(y), mean_tensor):
        gap = objective(other, y, thr) - f_star
        assert gap >= 0.5 * float(np.sum((other - x_star) ** 2)) - tol


def test_threshold_constant_is_exactly_thr_under_mean_tnn(
    rng: np.random.Generator,
) -> None:
    """Among tensor_svt(Y, s), the objective with constant c is minimised at s = c."""
    y = correlated_clients(rng, 5, 4, 6)
    thr = float(np.median(np.concatenate(slice_singular_values(y))))
    best = objective(tensor_svt(y, thr), y, thr)
    for s in thr * np.array([0.5, 0.9, 0.99, 1.01, 1.1, 2.0]):
        assert objective(tensor_svt(y, float(s)), y, thr) > best
    # Negative control: with a *summed* TNN (no 1/K) the same X* is not optimal; the
    # prox of c·Σ_k‖X̄^(k)‖_* is tensor_svt(Y, c·K) instead.
    k = y.shape[2]

    def summed(x: np.ndarray) -> float:
        return 0.5 * float(np.sum((x - y) ** 2)) + thr * k * tnn(x)

    assert summed(tensor_svt(y, thr * k)) < summed(tensor_svt(y, thr)) - 1e-6


# ------------------------------------------------------------- reference agreement
@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize(
    ("n1", "n2", "k"), [(6, 4, 5), (3, 7, 6), (1, 8, 4), (5, 5, 1)]
)
def test_tensor_svt_matches_per_slice_loop(
    rng: np.random.Generator, half: bool, n1: int, n2: int, k: int
) -> None:
    y = correlated_clients(rng, n1, n2, k, rank=1)
    for thr in (0.0, 0.5, 2.0, 50.0):
        np.testing.assert_allclose(
            tensor_svt(y, thr, half_spectrum=half), loop_t_tsvd(y, thr), atol=1e-12
        )


@pytest.mark.parametrize("k", [1, 2, 3, 6, 7, 10])
def test_half_spectrum_equals_full_spectrum(rng: np.random.Generator, k: int) -> None:
    for n1, n2 in [(9, 4), (4, 9), (1, 6)]:
        y = correlated_clients(rng, n1, n2, k, rank=1, noise=1.0)
        for thr in (0.1, 1.0, 3.0):
            half = tensor_svt(y, thr, half_spectrum=True)
            full = tensor_svt(y, thr, half_spectrum=False)
            np.testing.assert_allclose(half, full, atol=1e-10, rtol=0)


def test_chunked_svds_match_one_batch(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    y = correlated_clients(rng, 6, 5, 9, rank=1, noise=1.0)
    want = loop_t_tsvd(y, 1.0)
    monkeypatch.setattr(tensor_svt_module, "_CHUNK_BYTES", 2 * 6 * 5 * 16)  # 2 slices
    for half in (True, False):
        np.testing.assert_allclose(
            tensor_svt(y, 1.0, half_spectrum=half), want, atol=1e-12
        )


def test_float32_in_float32_out(rng: np.random.Generator) -> None:
    y = correlated_clients(rng, 6, 5, 4).astype(np.float32)
    out = tensor_svt(y, 1.0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, loop_t_tsvd(y.astype(np.float64), 1.0), atol=1e-5)


def test_svt_matrix_is_prox_of_nuclear_norm(rng: np.random.Generator) -> None:
    m = rng.standard_normal((7, 4))
    thr = float(np.median(np.linalg.svd(m, compute_uv=False)))
    x = svt_matrix(m, thr)

    def f(z: np.ndarray) -> float:
        return 0.5 * float(np.sum((z - m) ** 2)) + thr * float(np.linalg.norm(z, "nuc"))

    for _ in range(50):
        d = 1e-2 * rng.standard_normal(m.shape)
        assert f(x + d) - f(x) >= 0.5 * float(np.sum(d**2)) - 1e-12


# -------------------------------------------------------------- global-model identity
def test_mean_of_smoothed_models_is_svt_of_average(rng: np.random.Generator) -> None:
    k = 6
    models = random_models(rng, k, SHAPES)
    thr = 1.5
    smoothed = smooth_client_models(models, thr)
    global_model = mean_model(smoothed)
    average = mean_model(models)

    # Linear weights: SVT of the plain (out, in) average at thr/K, layout-independent.
    for i in (2, 4):
        np.testing.assert_allclose(
            global_model[i], svt_matrix(average[i], thr / k), atol=1e-12
        )
    # Biases: a 1×out matrix whose only singular value is its norm.
    for i in (1, 3):
        norm = np.linalg.norm(average[i])
        expected = average[i] * max(norm - thr / k, 0.0) / norm
        np.testing.assert_allclose(global_model[i], expected, atol=1e-12)
    # Conv: the (kw·kh·in, out) matrix of each kernel; SVT is invariant to row order.
    conv_avg = average[0]
    matrix = conv_avg.reshape(conv_avg.shape[0], -1).T  # (in·kh·kw, out)
    expected = svt_matrix(matrix, thr / k).T.reshape(conv_avg.shape)
    np.testing.assert_allclose(global_model[0], expected, atol=1e-12)
    # And the cheap helper agrees on every parameter.
    for got, want in zip(smoothed_mean_model(models, thr), global_model, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_threshold_zero_is_identity(rng: np.random.Generator) -> None:
    models = random_models(rng, 5, SHAPES)
    for half in (True, False):
        smoothed = smooth_client_models(models, 0.0, half_spectrum=half)
        for got_model, want_model in zip(smoothed, models, strict=True):
            for got, want in zip(got_model, want_model, strict=True):
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, atol=1e-12)


def test_large_threshold_collapses_clients_onto_low_rank_mean(
    rng: np.random.Generator,
) -> None:
    k = 7
    models = random_models(rng, k, [(6, 8), (6,), (4, 2, 2, 2)], noise=0.05)
    rank_one = np.outer(rng.standard_normal(6), rng.standard_normal(8))
    for model in models:  # the weight's shared part is rank 1; the noise is full rank
        model[0] = rank_one + 0.05 * rng.standard_normal((6, 8))
    # The largest singular value of any non-DC Fourier slice of any parameter.
    sigma_m = max(
        float(sv.max())
        for i in range(3)
        for sv in slice_singular_values(stack_clients([m[i] for m in models])[0])[1:]
    )
    thr = sigma_m * (1 + 1e-9)
    smoothed = smooth_client_models(models, thr)
    average = mean_model(models)
    for i in range(3):
        for client in smoothed[1:]:
            np.testing.assert_allclose(client[i], smoothed[0][i], atol=1e-12)
    # Proposition 3.2: every client equals SVT(average, thr/K) ...
    expected = svt_matrix(average[0], thr / k)
    np.testing.assert_allclose(smoothed[0][0], expected, atol=1e-12)
    for got, want in zip(smoothed[0], smoothed_mean_model(models, thr), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12)
    # ... which is of lower rank than the full-rank average.
    assert np.linalg.matrix_rank(average[0]) == 6
    assert np.linalg.matrix_rank(smoothed[0][0], tol=1e-9) < 6


def test_layers_selects_parameters(rng: np.random.Generator) -> None:
    models = random_models(rng, 4, SHAPES)
    smoothed = smooth_client_models(models, 5.0, layers=[2])
    full = smooth_client_models(models, 5.0)
    for k, model in enumerate(models):
        for i, param in enumerate(model):
            want = full[k][i] if i == 2 else param
            np.testing.assert_allclose(smoothed[k][i], want, atol=1e-12)
    assert smoothed[0][0] is not models[0][0]  # untouched parameters are copies


def test_integer_parameters_are_left_alone_by_default() -> None:
    models = [[np.ones((3, 2)), np.array(7, dtype=np.int64)] for _ in range(3)]
    out = smooth_client_models(models, 0.1)
    assert out[0][1].dtype == np.int64 and int(out[0][1]) == 7
    with pytest.raises(TypeError, match="parameter 1"):
        smooth_client_models(models, 0.1, layers=[1])


# ------------------------------------------------------------------------ layout
@pytest.mark.parametrize(
    ("shape", "matrix"),
    [
        ((8, 3, 5, 5), (75, 8)),  # conv (out, in, kh, kw) -> (kw·kh·in, out)
        ((6, 2, 3), (6, 6)),  # conv1d (out, in, k) -> (k·in, out)
        ((7, 4), (4, 7)),  # linear (out, in) -> (in, out)
        ((7,), (1, 7)),  # bias (out,) -> (1, out)
        ((), (1, 1)),  # scalar
    ],
)
def test_stack_unstack_round_trip(
    rng: np.random.Generator, shape: tuple[int, ...], matrix: tuple[int, int]
) -> None:
    k = 5
    tensors = [rng.standard_normal(shape) for _ in range(k)]
    tensor3, original = stack_clients(tensors)
    assert tensor3.shape == (*matrix, k)
    assert original == shape
    back = unstack_clients(tensor3, original)
    assert len(back) == k
    for got, want in zip(back, tensors, strict=True):
        assert got.shape == shape
        np.testing.assert_array_equal(got, want)


def test_stack_element_mapping(rng: np.random.Generator) -> None:
    out_c, in_c, kh, kw, k = 4, 3, 2, 5, 3
    convs = [rng.standard_normal((out_c, in_c, kh, kw)) for _ in range(k)]
    t, _ = stack_clients(convs)
    for o, c, i, j, client in np.ndindex(out_c, in_c, kh, kw, k):
        assert t[(j * kh + i) * in_c + c, o, client] == convs[client][o, c, i, j]
    linears = [rng.standard_normal((4, 6)) for _ in range(k)]
    t, _ = stack_clients(linears)
    for client in range(k):
        np.testing.assert_array_equal(t[:, :, client], linears[client].T)
    biases = [rng.standard_normal(4) for _ in range(k)]
    t, _ = stack_clients(biases)
    for client in range(k):
        np.testing.assert_array_equal(t[0, :, client], biases[client])


# ----------------------------------------------------------------------- schedule
# docs/notes/fedceo.md §2.6 (derived there from thr(t) = ϑ^{t/I}/(2λ), T = 300, K = 10), copied
# verbatim as strings so the comparison is at the notes' printed precision.
NOTES_TABLE = [
    # λ, ϑ, I, # smoothing rounds, thr(t=I), thr(300), thr(300)/K
    (70, 1.08, 30, 10, "0.007714", "0.015421", "0.001542"),
    (0.5, 1.04, 20, 15, "1.04", "1.80094", "0.180094"),
    (0.03, 1.06, 20, 15, "17.6667", "39.9426", "3.99426"),
    (85, 1.03, 15, 20, "0.006059", "0.010624", "0.001062"),
    (10, 1.07, 10, 30, "0.0535", "0.380613", "0.038061"),
    (0.6, 1.04, 10, 30, "0.866667", "2.70283", "0.270283"),
]


def _matches_printed(value: float, printed: str) -> bool:
    decimals = len(printed.split(".")[1])
    return abs(value - float(printed)) <= 0.5 * 10.0**-decimals * (1 + 1e-9)


@pytest.mark.parametrize(
    ("lam", "theta", "interval", "n", "thr_i", "thr_t", "thr_k"), NOTES_TABLE
)
def test_threshold_schedule_reproduces_notes_table(
    lam: float, theta: float, interval: int, n: int, thr_i: str, thr_t: str, thr_k: str
) -> None:
    def thr(t: int) -> float:
        return smoothing_threshold(t, lam=lam, theta=theta, interval=interval)

    assert sum(is_smoothing_round(t, interval) for t in range(1, 301)) == n
    assert _matches_printed(thr(interval), thr_i)
    assert _matches_printed(thr(300), thr_t)
    assert _matches_printed(thr(300) / 10, thr_k)


def test_threshold_formula_and_ablation() -> None:
    thr = smoothing_threshold
    assert thr(0, lam=0.25, theta=1.5, interval=3) == pytest.approx(2.0)
    assert thr(6, lam=0.25, theta=1.5, interval=3) == pytest.approx(4.5)
    # Between smoothing rounds the exponent is fractional: 4^{3/2} / (2·0.25) = 16.
    assert thr(3, lam=0.25, theta=4.0, interval=2) == pytest.approx(16.0)
    # ϑ = 1: the constant threshold 1/(2λ) of the FedCEO (ϑ=1) ablation.
    assert {thr(t, lam=2.0, theta=1.0, interval=5) for t in (5, 50)} == {0.25}
    # Code form (1/(2λ))·ϑ^ceil((t−1)/I) agrees on smoothing rounds for I ≥ 2.
    for t in range(10, 301, 10):
        code = 1 / (2 * 0.6) * 1.04 ** math.ceil((t - 1) / 10)
        assert thr(t, lam=0.6, theta=1.04, interval=10) == pytest.approx(code)
    assert [is_smoothing_round(t, 3) for t in range(1, 7)] == [False, False, True] * 2


# --------------------------------------------------------------------- validation
@pytest.mark.parametrize("lam", [0.0, -1.0, float("nan"), float("inf"), True, "1"])
def test_rejects_bad_lambda(lam: object) -> None:
    with pytest.raises(ValueError, match="lam"):
        smoothing_threshold(10, lam=lam, theta=1.04, interval=10)  # type: ignore


@pytest.mark.parametrize("theta", [0.999, 0.5, 0.0, -2.0, float("nan")])
def test_rejects_bad_theta(theta: float) -> None:
    with pytest.raises(ValueError, match="theta"):
        smoothing_threshold(10, lam=0.6, theta=theta, interval=10)


@pytest.mark.parametrize("interval", [0, -3, 2.0, True])
def test_rejects_bad_interval(interval: object) -> None:
    with pytest.raises(ValueError, match="interval"):
        smoothing_threshold(10, lam=0.6, theta=1.04, interval=interval)  # type: ignore
    with pytest.raises(ValueError, match="interval"):
        is_smoothing_round(10, interval)  # type: ignore[arg-type]


def test_rejects_bad_round() -> None:
    with pytest.raises(ValueError, match="server_round"):
        smoothing_threshold(-1, lam=0.6, theta=1.04, interval=10)
    with pytest.raises(ValueError, match="server_round"):
        is_smoothing_round(-1, 10)


def test_rejects_ragged_shapes_across_clients(rng: np.random.Generator) -> None:
    with pytest.raises(ValueError, match=r"client 1 has shape \(4, 3\)"):
        stack_clients([np.zeros((3, 4)), np.zeros((4, 3))])
    ragged = [[np.zeros((3, 4)), np.zeros(3)], [np.zeros((3, 4)), np.zeros(4)]]
    with pytest.raises(ValueError, match="parameter 1: client 1"):
        smooth_client_models(ragged, 1.0)
    with pytest.raises(ValueError, match="parameter 1: client 1"):
        mean_model(ragged)
    with pytest.raises(ValueError, match="client 1 has 1 parameter tensors"):
        smooth_client_models([[np.zeros(3), np.zeros(3)], [np.zeros(3)]], 1.0)
    with pytest.raises(ValueError, match="at least one client"):
        smooth_client_models([], 1.0)
    with pytest.raises(ValueError, match="at least one client"):
        stack_clients([])


def test_rejects_bad_threshold_layers_and_tensors(rng: np.random.Generator) -> None:
    models = random_models(rng, 3, [(3, 2), (3,)])
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="threshold"):
            smooth_client_models(models, bad)
        with pytest.raises(ValueError, match="threshold"):
            tensor_svt(np.zeros((2, 2, 2)), bad)
    with pytest.raises(ValueError, match="layer index 2 out of range"):
        smooth_client_models(models, 1.0, layers=[2])
    with pytest.raises(ValueError, match="duplicates"):
        smooth_client_models(models, 1.0, layers=[0, 0])
    with pytest.raises(ValueError, match="shape"):
        tensor_svt(np.zeros((2, 2)), 1.0)
    with pytest.raises(TypeError, match="int64"):
        tensor_svt(np.zeros((2, 2, 2), dtype=np.int64), 1.0)
    with pytest.raises(ValueError, match="does not fold back"):
        unstack_clients(np.zeros((3, 4, 2)), (3, 4))
    with pytest.raises(ValueError, match="2-D"):
        svt_matrix(np.zeros((2, 2, 2)), 1.0)

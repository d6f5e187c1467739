"""The DLG harness of FedCEO's privacy experiment: it recovers a non-private one-image
update, and fails once the update is clipped and noised as UDP-FedAvg does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from experiments.fedceo.dlg_attack import (
    DLGLeNet,
    dlg_reconstruct,
    fedceo_smoothed_update,
    gradient_from_update,
    init_dlg_weights,
    local_update,
    psnr,
    udp_upload,
)

SHAPE = (1, 12, 12)
LR = 0.1


def _image() -> np.ndarray:
    yy, xx = np.mgrid[0:12, 0:12] / 11.0
    return (0.5 + 0.4 * np.sin(3 * xx) * np.cos(2 * yy)).astype(np.float32)[None]


def _setup(seed: int = 2):
    torch.set_num_threads(1)
    model = init_dlg_weights(DLGLeNet(SHAPE, 4), seed)
    image = _image()
    return model, image, local_update(model, torch.from_numpy(image), 2, LR)


def _attack(model, delta, seed: int = 2) -> float:
    x, _ = dlg_reconstruct(model, gradient_from_update(delta, LR), SHAPE, 4, iterations=15, seed=seed)
    return psnr(x.numpy(), _image())


def test_dlg_recovers_a_non_private_single_image_update():
    model, _, delta = _setup()
    assert _attack(model, delta) > 20.0  # measured: 30.6 dB (27-31 dB over init seeds 0-4)


def test_udp_noise_defeats_dlg():
    model, _, delta = _setup()
    noisy = udp_upload(delta, clip=1.0, sigma=1.0, shares=10, rng=np.random.default_rng(0))
    assert _attack(model, noisy) < 10.0  # measured: 5.4 dB; a mid-grey guess scores 14.9 dB here


def test_fedceo_smoothing_of_identical_uploads_keeps_the_mean_and_psnr_helpers():
    _, _, delta = _setup()
    w0 = [np.zeros_like(d) for d in delta]
    # K identical uploads: only the DC slice is non-zero; threshold 0 returns them unchanged
    out = fedceo_smoothed_update(w0, [delta] * 4, 1, 0.0)
    for a, b in zip(out, delta, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    image = _image()
    assert psnr(image, image) == float("inf")
    assert psnr(image + 0.1, image) == pytest.approx(20.0, abs=1e-3)  # MSE = 0.01

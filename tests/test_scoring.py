"""Metrics against reference implementations: skimage for PSNR/SSIM, a hand computation
of VBench's temporal_flickering formula."""

from __future__ import annotations

import numpy as np
import pytest

from pairflow.scoring import metric_spec, score


def clip(seed: int, f: int = 4, h: int = 48, w: int = 48) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, w)[None, None, :, None] * np.ones((f, h, w, 3))
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def test_temporal_flickering_matches_vbench_formula_by_hand() -> None:
    a = np.zeros((3, 2, 2, 3), np.uint8)
    a[1] = 10
    a[2] = 40
    # pairs: |10-0| = 10, |40-10| = 30; mean 20; (255 - 20) / 255
    assert score("temporal_flickering", a) == pytest.approx((255 - 20) / 255)
    assert score("temporal_flickering", np.zeros((5, 4, 4, 3), np.uint8)) == 1.0


def test_psnr_agrees_with_skimage() -> None:
    from skimage.metrics import peak_signal_noise_ratio

    x, y = clip(0), clip(1)
    ref = np.mean([peak_signal_noise_ratio(y[i], x[i], data_range=255) for i in range(len(x))])
    assert score("psnr", x, y) == pytest.approx(ref, abs=1e-4)


def test_ssim_agrees_with_skimage_on_luma() -> None:
    from skimage.metrics import structural_similarity

    x, y = clip(0), clip(1)

    def luma(a: np.ndarray) -> np.ndarray:  # pyiqa's default: YIQ's Y, rounded on a 0-255 scale
        a = a.astype(np.float64)
        return np.round(0.299 * a[..., 0] + 0.587 * a[..., 1] + 0.114 * a[..., 2])

    ref = np.mean([structural_similarity(luma(x[i]), luma(y[i]), data_range=255, gaussian_weights=True,
                                         sigma=1.5, use_sample_covariance=False) for i in range(len(x))])
    assert score("ssim", x, y) == pytest.approx(ref, abs=2e-3)


def test_metrics_are_deterministic_across_calls() -> None:
    x, y = clip(2), clip(3)
    for name in ("psnr", "ssim"):
        assert score(name, x, y) == score(name, x, y)
    assert score("temporal_flickering", x) == score("temporal_flickering", x)


def test_specs_come_from_pyiqa_table() -> None:
    assert metric_spec("psnr").kind == "FR" and metric_spec("psnr").higher_is_better
    assert metric_spec("ssim").range == "0, 1"
    assert metric_spec("temporal_flickering").kind == "NR"

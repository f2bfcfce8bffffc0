"""Metrics against reference implementations: skimage for PSNR/SSIM, a from-the-paper
MS-SSIM, a hand computation of VBench's temporal_flickering formula."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pairflow.layout import Layout
from pairflow.metrics import ScoreContext, metric_spec, score


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


def luma709(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    return 0.2126 * a[..., 0] + 0.7152 * a[..., 1] + 0.0722 * a[..., 2]


def clip_pairs(h: int = 48, w: int = 48) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Three kinds of (treatment, control) clips: highly correlated, unrelated noise, and
    negatively correlated (the control's photographic negative plus noise). The last two
    are where a clamp of negative contrast-structure values changes SSIM."""
    rng = np.random.default_rng(42)
    x = clip(0, 3, h, w)
    near = np.clip(x + rng.normal(0, 6, x.shape), 0, 255).astype(np.uint8)
    noise = rng.integers(0, 256, x.shape, dtype=np.uint8)
    negative = np.clip(255.0 - x + rng.normal(0, 20, x.shape), 0, 255).astype(np.uint8)
    return {"correlated": (near, x), "unrelated": (noise, x), "negative": (negative, x)}


def skimage_ssim(a: np.ndarray, b: np.ndarray) -> float:
    from skimage.metrics import structural_similarity

    return float(np.mean([structural_similarity(luma709(a[i]), luma709(b[i]), data_range=255, gaussian_weights=True,
                                                sigma=1.5, use_sample_covariance=False) for i in range(len(a))]))


@pytest.mark.parametrize("kind", ["correlated", "unrelated", "negative"])
def test_ssim_is_standard_ssim_of_skimage_on_bt709_luma(kind: str) -> None:
    a, b = clip_pairs()[kind]
    assert score("ssim", a, b) == pytest.approx(skimage_ssim(a, b), abs=1e-4)


def test_ssim_is_not_clamped() -> None:
    """Regression (issue 15): pyiqa's SSIM clamps negative contrast-structure values to 0,
    so unrelated noise read 0.08 and a negative image read above 0."""
    pairs = clip_pairs()
    assert abs(score("ssim", *pairs["unrelated"])) < 0.03
    assert score("ssim", *pairs["negative"]) < -0.2


def ms_ssim_reference(a: np.ndarray, b: np.ndarray) -> float:
    """MS-SSIM from Wang, Simoncelli and Bovik (2003), built from scipy/skimage pieces
    independently of pairflow: cs = mean over valid 11x11 windows of (2 s_xy + C2) /
    (s_x^2 + s_y^2 + C2) with scipy's Gaussian filter (sigma 1.5, border of 5 cropped), the
    last scale's SSIM from skimage, 2x2 means between scales, weights from the paper, and
    the sign kept for a negative factor (the convention PairFlow states)."""
    from scipy.ndimage import gaussian_filter
    from skimage.metrics import structural_similarity

    weights = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)
    c2 = (0.03 * 255) ** 2
    out = []
    for i in range(len(a)):
        x, y = luma709(a[i]), luma709(b[i])
        value = 1.0
        for j, w in enumerate(weights):
            if j == len(weights) - 1:
                f = structural_similarity(x, y, data_range=255, gaussian_weights=True, sigma=1.5,
                                          use_sample_covariance=False)
            else:
                def g(z: np.ndarray) -> np.ndarray:
                    return gaussian_filter(z, 1.5, truncate=3.5)[5:-5, 5:-5]
                mx, my = g(x), g(y)
                cs = (2 * (g(x * y) - mx * my) + c2) / (g(x * x) - mx * mx + g(y * y) - my * my + c2)
                f = float(cs.mean())
                h2, w2 = x.shape[0] // 2 * 2, x.shape[1] // 2 * 2
                x = x[:h2, :w2].reshape(h2 // 2, 2, w2 // 2, 2).mean(axis=(1, 3))
                y = y[:h2, :w2].reshape(h2 // 2, 2, w2 // 2, 2).mean(axis=(1, 3))
            value *= np.sign(f) * abs(f) ** w
        out.append(value)
    return float(np.mean(out))


@pytest.mark.parametrize("kind", ["correlated", "unrelated", "negative"])
def test_ms_ssim_matches_the_wang_2003_reference(kind: str) -> None:
    a, b = clip_pairs(176, 184)[kind]
    assert score("ms_ssim", a, b) == pytest.approx(ms_ssim_reference(a, b), abs=1e-4)


def test_psnr_of_identical_frames_is_the_documented_80_db_cap() -> None:
    from pairflow.metrics.fidelity import PSNR_CAP_DB

    x = clip(4)
    assert score("psnr", x, x) == pytest.approx(PSNR_CAP_DB, abs=1e-3)
    assert "80 dB" in metric_spec("psnr").source and "at most 80 (identical frames)" in metric_spec("psnr").range


def test_temporal_flickering_counts_darkening_as_much_as_brightening() -> None:
    """Regression (issue 15): without abs(), a frame that brightens then darkens back
    cancels to 'no flicker'."""
    a = np.zeros((3, 2, 2, 3), np.uint8)
    a[1] = 10  # +10 then -10: mean |diff| 10, signed mean 0
    assert score("temporal_flickering", a) == pytest.approx((255 - 10) / 255)


def test_metrics_are_deterministic_across_calls() -> None:
    x, y = clip(2), clip(3)
    for name in ("psnr", "ssim"):
        assert score(name, x, y) == score(name, x, y)
    assert score("temporal_flickering", x) == score("temporal_flickering", x)


def test_specs_come_from_pyiqa_table() -> None:
    assert metric_spec("psnr").kind == "FR" and metric_spec("psnr").higher_is_better
    assert metric_spec("ssim").range == "-1, 1" and "no clamp" in metric_spec("ssim").source
    assert metric_spec("temporal_flickering").kind == "NR"


# --- VBench dimensions: formulas by hand ---------------------------------------------


def test_consistency_formula_by_hand() -> None:
    from pairflow.metrics.subject_consistency import consistency

    assert consistency(np.ones((5, 8))) == pytest.approx(1.0)  # identical frames
    # t=1: cos(f1,f0)=0 twice -> 0; t=2: cos(f2,f1)=cos(f2,f0)=1/sqrt2 -> 1/sqrt2; mean over t
    f = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert consistency(f) == pytest.approx((0 + 2 ** -0.5) / 2)
    # negative similarity is clamped at 0 (VBench's max(0, cos)), and scale does not matter
    assert consistency(np.array([[1.0, 0.0], [-3.0, 0.0]])) == 0.0
    from pairflow.errors import ScoringError

    with pytest.raises(ScoringError, match="at least 2 frames"):
        consistency(np.ones((1, 4)))


def test_motion_smoothness_proxy_by_hand() -> None:
    ramp = (np.arange(5)[:, None, None, None] * 10 * np.ones((5, 2, 2, 3))).astype(np.uint8)
    assert score("motion_smoothness_proxy", ramp) == 1.0  # linear motion is reconstructed exactly
    a = np.zeros((3, 2, 2, 3), np.uint8)
    a[1] = 30  # odd frame 30, neighbours 0 and 0 -> reconstruction 0, error 30
    assert score("motion_smoothness_proxy", a) == pytest.approx((255 - 30) / 255)
    assert "PROXY" in metric_spec("motion_smoothness_proxy").source


def test_dynamic_degree_rule_follows_vbench() -> None:
    import torch

    from pairflow.metrics.dynamic_degree import is_dynamic, pad8, sample_indices, top5_mean

    assert sample_indices(9, 8) == list(range(9)) and sample_indices(9, 16) == [0, 2, 4, 6, 8]
    assert sample_indices(10, 24) == [0, 3, 6, 9]  # round(24/8) = 3
    # threshold 6 * 128/256 = 3; 9 sampled frames need round(4*9/16) = 2 moving pairs
    assert is_dynamic([3.5, 0.0, 3.1], 128, 9) and not is_dynamic([3.5, 0.0, 2.9], 128, 9)
    flow = torch.zeros(1, 2, 10, 10)
    flow[0, 0, :5, 0] = 4.0  # 5 of 100 pixels move by 4; top 5% = those 5
    assert float(top5_mean(flow)[0]) == pytest.approx(4.0)
    assert pad8(torch.zeros(1, 3, 60, 62)).shape[-2:] == (64, 64)


def test_fidelity_refuses_frames_too_small_for_ms_ssim() -> None:
    from pairflow.errors import ScoringError

    with pytest.raises(ScoringError, match="at least 176 px"):
        score("ms_ssim", clip(0), clip(1))
    big0, big1 = clip(0, 2, 176, 176), clip(1, 2, 176, 176)
    assert 0 < score("ms_ssim", big0, big1) < 1 and score("ms_ssim", big0, big0) == pytest.approx(1.0)


def test_registry_matches_schema_and_pyiqa_table() -> None:
    import yaml

    from pairflow.metrics import METRICS
    from pairflow.plan.config import SCHEMA_PATH, _schema

    # the schema file holds no copy of the list: the config's schema takes it from the registry
    assert "enum" not in yaml.safe_load(SCHEMA_PATH.read_text())["properties"]["scorers"]["items"]
    assert _schema()["properties"]["scorers"]["items"]["enum"] == list(METRICS)
    assert len(METRICS) >= 11 and list(METRICS) == sorted(METRICS)
    for name in METRICS:
        s = metric_spec(name)
        assert s.kind in ("NR", "FR", "prompt") and s.range and s.source and s.version
    assert metric_spec("lpips").kind == "FR" and not metric_spec("lpips").higher_is_better  # pyiqa: lower_better
    assert metric_spec("ms_ssim").kind == "FR"
    assert metric_spec("subject_consistency").needs == ("dino_vitb16",)
    spec = metric_spec("lpips").asdict({"torch/hub/checkpoints/alexnet-owt-7be5be79.pth": "xxh3_128:ab"})
    assert spec["weights"][0] == ["torch/hub/checkpoints/alexnet-owt-7be5be79.pth", "xxh3_128:ab"]


# --- weight-based metrics: random-init mirror, real loading path -----------------------

WEIGHTED = {  # metric: frames (F, H, W) small enough for CI; dynamic_degree's RAFT needs 128 px
    "subject_consistency": (3, 32, 32),
    "background_consistency": (3, 32, 32),
    "aesthetic_quality": (1, 32, 32),
    "imaging_quality": (1, 32, 32),
    "dynamic_degree": (2, 128, 128),
    "lpips": (3, 32, 32),
}


def test_every_metric_registers_itself_with_the_decorator() -> None:
    """Each name in METRICS is registered by ``@metric`` in a module of the metrics
    package, found by the registry, and its spec says that name."""
    from pairflow.metrics import _REGISTERED, METRICS

    for name in METRICS:
        assert metric_spec(name).name == name
        assert _REGISTERED[name][1].__module__.startswith("pairflow.metrics.")
    assert sorted(_REGISTERED) == sorted(METRICS)


def test_a_new_metric_module_is_found_by_the_registry(tmp_path: Path) -> None:
    """Extension by discovery: a module dropped into the metrics package (here a copy of the
    package with one more module, in a fresh interpreter) is registered, listed in METRICS
    and accepted by the config schema, with no table edited."""
    import shutil
    import subprocess
    import sys

    workflow = Path(__file__).resolve().parents[1] / "workflow"
    copy = tmp_path / "pairflow"
    shutil.copytree(workflow / "pairflow", copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(workflow / "schemas", tmp_path / "schemas")
    (copy / "metrics" / "brightness.py").write_text(
        "import numpy as np\n"
        "from . import MetricSpec, metric\n"
        "SPEC = MetricSpec(name='brightness', version='1', kind='NR', higher_is_better=True, range='0, 1',\n"
        "                  source='test')\n"
        "@metric('brightness', spec=SPEC)\n"
        "def brightness(name, frames, reference, ctx):\n"
        "    return float(np.mean(frames) / 255)\n")
    code = ("from pairflow.metrics import METRICS, score; from pairflow.plan.config import _schema; import numpy as np; "
            "print('brightness' in METRICS, 'brightness' in _schema()['properties']['scorers']['items']['enum'], "
            "score('brightness', np.full((2, 8, 8, 3), 51, np.uint8)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert out.stdout.split() == ["True", "True", "0.2"], out.stderr[-3000:]


def test_a_metric_registered_outside_the_package_or_twice_is_refused() -> None:
    from pairflow.errors import ConfigError
    from pairflow.metrics import metric

    def elsewhere(name: str, frames: np.ndarray, reference: np.ndarray | None, ctx: object) -> float:
        return 0.0

    with pytest.raises(ConfigError, match=r"'psnr' is registered in tests?\.?.*outside pairflow\.metrics"):
        metric("psnr", spec=metric_spec("psnr"))(elsewhere)  # type: ignore[arg-type]
    elsewhere.__module__ = "pairflow.metrics.other"
    with pytest.raises(ConfigError, match=r"'psnr' is registered twice: in pairflow\.metrics\.fidelity and in "
                                          r"pairflow\.metrics\.other"):
        metric("psnr", spec=metric_spec("psnr"))(elsewhere)  # type: ignore[arg-type]


def test_every_metric_has_its_row_in_the_config_docs_and_no_row_is_stale() -> None:
    """docs/metrics-and-verdicts.md's Scorers table has one row per registered metric, and none more."""
    from pairflow.metrics import METRICS

    docs = (Path(__file__).resolve().parents[1] / "docs" / "metrics-and-verdicts.md").read_text()
    table = docs.split("\n## Scorers\n", 1)[1].split("\n## ", 1)[0].split("| name | kind |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert sorted(rows) == sorted(METRICS)


def test_fr_metric_refuses_videos_of_different_shapes() -> None:
    from pairflow.errors import PairingError

    a = np.zeros((4, 32, 32, 3), np.uint8)
    with pytest.raises(PairingError, match=r"psnr: cannot compare videos of shapes \(4, 32, 32, 3\) and \(3, 32, 32, 3\)"):
        score("psnr", a, a[:3])


@pytest.mark.parametrize("name", sorted(WEIGHTED))
def test_weighted_metric_loads_from_mirror_once_and_is_deterministic(name: str, test_mirror) -> None:  # type: ignore[no-untyped-def]
    from pairflow.metrics import ScoreContext
    from pairflow.metrics.models import LOAD_COUNTS

    f, h, w = WEIGHTED[name]
    x, y = clip(4, f, h, w), clip(5, f, h, w)
    ctx = ScoreContext(mirror=test_mirror, batch=2)
    first = score(name, x, y, ctx)
    loads = dict(LOAD_COUNTS)
    assert np.isfinite(first)
    assert score(name, x, y, ctx) == first  # bit-identical on a second run
    assert dict(LOAD_COUNTS) == loads  # the scorer was built once and reused


def test_consistency_of_a_still_video_is_one(test_mirror) -> None:  # type: ignore[no-untyped-def]
    from pairflow.metrics import ScoreContext

    still = np.repeat(clip(6, 1, 32, 32), 3, axis=0)
    ctx = ScoreContext(mirror=test_mirror)
    assert score("subject_consistency", still, None, ctx) == pytest.approx(1.0, abs=1e-6)
    assert score("lpips", still, still, ctx) == pytest.approx(0.0, abs=1e-6)


def test_every_weight_free_metric_is_deterministic() -> None:
    x, y = clip(7, 3, 176, 176), clip(8, 3, 176, 176)
    for name in ("temporal_flickering", "motion_smoothness_proxy", "psnr", "ssim", "ms_ssim"):
        assert score(name, x, y) == score(name, x, y), name


def score_arrays_task(payload: dict[str, Any]) -> dict[str, Any]:
    """Parsl task (workers import this module: PYTHONPATH below): score the frames in
    ``payload['npz']`` (``frames``, ``reference``) with the production ``metrics.score``
    for every metric named, and say which worker process ran it and what it loaded."""
    import torch

    from pairflow.metrics import ScoreContext, score
    from pairflow.metrics.models import LOAD_COUNTS

    torch.set_num_threads(1)
    data = np.load(payload["npz"])
    ctx = ScoreContext(mirror=Path(payload["mirror"]), batch=int(payload["batch"]), fps=8)
    scores = {n: score(n, data["frames"], data["reference"], ctx) for n in payload["metrics"]}
    return {"scores": scores, "pid": os.getpid(), "loads": dict(LOAD_COUNTS)}


def test_scores_do_not_depend_on_worker_count_or_task_order(tmp_path, test_mirror, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The estimand is per video: the same videos scored through Parsl with 1 worker and
    with 3 workers (tasks in reverse order) give identical numbers."""
    from pairflow.fleet.pool import Grant, run_tasks
    from pairflow.plan.config import FleetSpec

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                     os.environ.get("PYTHONPATH")])))
    metrics = ["temporal_flickering", "psnr", "ssim", "lpips"]
    payloads = []
    for i in range(4):
        path = tmp_path / f"v{i}.npz"
        np.savez(path, frames=clip(10 + i, 2, 32, 32), reference=clip(20 + i, 2, 32, 32))
        payloads.append({"npz": str(path), "metrics": metrics, "mirror": str(test_mirror), "batch": 2})
    one = run_tasks(score_arrays_task, payloads, tmp_path / "r1", FleetSpec(cpu_workers=1, retries=0), Grant(),
                    "one worker")
    three = run_tasks(score_arrays_task, payloads[::-1], tmp_path / "r3", FleetSpec(cpu_workers=3, retries=0),
                      Grant(), "three workers")[::-1]
    assert [r["scores"] for r in one] == [r["scores"] for r in three]
    assert len({r["pid"] for r in one}) == 1
    # each worker process built LPIPS (AlexNet from the mirror) once however many videos it scored
    assert all(r["loads"].get("lpips") == 1 for r in one + three)


def test_score_record_says_what_scored_it_and_on_which_frames(tmp_path, test_mirror) -> None:  # type: ignore[no-untyped-def]
    """score_task (run in-process here) writes each metric's spec with its weight files'
    digests, the scorer build, the compared frames and the static-filter policy; on a
    lossless encode the FR metrics see the generated frames bit for bit."""
    from conftest import small_config

    from pairflow.generation.provenance import arm_record
    from pairflow.media.video import encode
    from pairflow.metrics.weights import verify
    from pairflow.plan.candidates import candidates, panel_dir, video_path
    from pairflow.plan.config import study_from_raw
    from pairflow.plan.context import write_context
    from pairflow.records.store import read_record
    from pairflow.stages.generation import candidate_fields
    from pairflow.stages.scoring import score_task, scorer_build, study_weights

    cfg = small_config(tmp_path, tmp_path / "model", weights={"mirror": str(test_mirror)}, encoder={"lossless": True},
                       scorers=["temporal_flickering", "motion_smoothness_proxy", "psnr", "lpips"])
    study = study_from_raw(cfg, tmp_path)
    ctrl_c, treat_c = [c for c in candidates(study, study.panels[0]) if c.key.prompt_id == "a1"]
    raw = {ctrl_c.arm.name: clip(30, 5, 32, 32), treat_c.arm.name: clip(31, 5, 32, 32)}

    def generation_record(c):  # type: ignore[no-untyped-def]
        path = video_path(Layout(study.scratch), c)
        info = encode(raw[c.arm.name], path, study.encoder, study.generation.fps)
        return {"candidate": candidate_fields(c), "arm": arm_record(c.arm),
                "video": {**info.asdict(), "path": path.relative_to(panel_dir(Layout(study.scratch), c.key.panel)).as_posix()},
                "record_digest": "xxh3_128:" + "0" * 32}

    ctrl, treat = generation_record(ctrl_c), generation_record(treat_c)
    build = scorer_build(study)
    out = tmp_path / "score.json"
    ref = write_context(study.scratch, {"study": study, "scorer": build,
                                        "weight_digests": verify(study.weights.mirror, study_weights(study))})
    from pairflow.stages import scoring as stage

    stage._FRAMES.clear()
    before = dict(stage.DECODES)
    score_task({"context": ref, "record": ctrl, "control": ctrl, "out": str(tmp_path / "c.json"), "candidate": ctrl_c})
    score_task({"context": ref, "record": treat, "control": ctrl, "out": str(out), "candidate": treat_c})
    # issue 25 item 4: the control is decoded once, for its own scores and as the treatment's reference
    assert stage.DECODES["decoded"] - before["decoded"] == 2 and stage.DECODES["reused"] - before["reused"] == 1
    rec = read_record(out)
    assert rec["memory"]["score"]["peak_rss_mb"] > 0 and rec["memory"]["score"]["peak_device_mb"] is None
    assert sorted(rec["scores"]) == ["lpips", "motion_smoothness_proxy", "psnr", "temporal_flickering"]
    lpips = rec["scores"]["lpips"]["spec"]
    assert lpips["kind"] == "FR" and lpips["higher_is_better"] is False
    assert [w[0] for w in lpips["weights"]] == ["torch/hub/checkpoints/alexnet-owt-7be5be79.pth",
                                                "torch/hub/pyiqa/LPIPS_v0.1_alex-df73285e.pth"]
    assert all(w[1].startswith("xxh3_128:") for w in lpips["weights"])
    assert rec["scorer"] == build and build["weights_origin"] == "random-init"
    assert "bit-identical" in rec["compared_frames"] and rec["static_filter"]["temporal_flickering"] == "none"
    assert rec["scores"]["psnr"]["value"] == pytest.approx(score("psnr", raw[treat_c.arm.name], raw[ctrl_c.arm.name]))


def bt601_flicker_from_planes(path, spec, f: int, h: int, w: int) -> float:  # type: ignore[no-untyped-def]
    """VBench's temporal_flickering on frames decoded as OpenCV 4.x decodes them, computed
    here from the video's raw YUV 4:4:4 planes with the BT.601 limited-range formula
    (R = 1.164(Y-16) + 1.596(V-128), G = 1.164(Y-16) - 0.392(U-128) - 0.813(V-128),
    B = 1.164(Y-16) + 2.017(U-128); rounded, clipped), then (255 - mean |diff|) / 255."""
    import subprocess

    from pairflow.media.video import ffmpeg_binary

    raw = subprocess.run([ffmpeg_binary(spec), "-hide_banner", "-loglevel", "error", "-i", str(path), "-f", "rawvideo",
                          "-pix_fmt", "yuv444p", "pipe:"], capture_output=True, check=True).stdout
    y, u, v = np.frombuffer(raw, np.uint8).reshape(f, 3, h, w).astype(np.float64).transpose(1, 0, 2, 3)
    yy = 255 / 219 * (y - 16)
    r = yy + 255 / 224 * 1.402 * (v - 128)
    g = yy - 255 / 224 * (1.772 * 0.114 / 0.587) * (u - 128) - 255 / 224 * (1.402 * 0.299 / 0.587) * (v - 128)
    b = yy + 255 / 224 * 1.772 * (u - 128)
    rgb = np.clip(np.rint(np.stack([r, g, b], -1)), 0, 255).astype(np.int16)
    return float((255 - np.abs(rgb[1:] - rgb[:-1]).mean()) / 255)


def test_vbench_decoding_makes_temporal_flickering_equal_vbench_s(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Under scoring/decode: vbench, temporal_flickering sees frames decoded with BT.601 (as
    VBench does through OpenCV 4.x) and equals the value computed from the raw planes with
    the BT.601 formula within 1e-4; under the default bt709 it does not (the known offset),
    FR metrics stay on BT.709 either way, and every score says how it was decoded."""
    from conftest import small_config

    from pairflow.generation.provenance import arm_record
    from pairflow.media.video import encode
    from pairflow.plan.candidates import candidates, panel_dir, video_path
    from pairflow.plan.config import study_from_raw
    from pairflow.plan.context import write_context
    from pairflow.records.store import read_record
    from pairflow.stages.generation import candidate_fields
    from pairflow.stages.scoring import score_task, scorer_build

    values = {}
    for mode in ("bt709", "vbench"):
        cfg = small_config(tmp_path / mode, tmp_path / "model", encoder={"pix_fmt": "yuv444p"},
                           scoring={"decode": mode}, scorers=["temporal_flickering", "psnr"])
        study = study_from_raw(cfg, tmp_path / mode)
        ctrl_c, treat_c = [c for c in candidates(study, study.panels[0]) if c.key.prompt_id == "a1"]
        rng = np.random.default_rng(5)
        base = clip(40, 9, 48, 64).astype(np.float64)
        base[..., 0] = base[..., 0][:, :, ::-1]  # colour, so the matrices disagree
        drift = np.arange(9)[:, None, None, None] * np.array([6.0, -3.0, 4.0])
        raw = {ctrl_c.arm.name: np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8),
               treat_c.arm.name: np.clip(base + drift + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)}
        recs = {}
        for c in (ctrl_c, treat_c):
            path = video_path(Layout(study.scratch), c)
            info = encode(raw[c.arm.name], path, study.encoder, study.generation.fps)
            recs[c.arm.name] = {"candidate": candidate_fields(c), "arm": arm_record(c.arm),
                                "video": {**info.asdict(),
                                          "path": path.relative_to(panel_dir(Layout(study.scratch), c.key.panel)).as_posix()},
                                "record_digest": "xxh3_128:" + "0" * 32}
        out = tmp_path / mode / "score.json"
        build = scorer_build(study)
        assert build["decode"] == mode  # a change of decoding is a different scorer build: rescored
        ref = write_context(study.scratch, {"study": study, "scorer": build, "weight_digests": {}})
        score_task({"context": ref, "record": recs[treat_c.arm.name], "control": recs[ctrl_c.arm.name],
                    "out": str(out), "candidate": treat_c})
        rec = read_record(out)
        values[mode] = rec["scores"]
        expected = bt601_flicker_from_planes(video_path(Layout(study.scratch), treat_c), study.encoder, 9, 48, 64)
    assert values["vbench"]["temporal_flickering"]["decoded_with"] == "bt601"
    assert values["vbench"]["temporal_flickering"]["value"] == pytest.approx(expected, abs=1e-4)
    assert values["bt709"]["temporal_flickering"]["decoded_with"] == "bt709"
    assert abs(values["bt709"]["temporal_flickering"]["value"] - expected) > 2e-4  # the offset is real
    assert values["vbench"]["psnr"]["decoded_with"] == values["bt709"]["psnr"]["decoded_with"] == "bt709"
    assert values["vbench"]["psnr"]["value"] == values["bt709"]["psnr"]["value"]


def test_metric_specs_come_from_pyiqas_table_without_importing_torch() -> None:
    """The scoring driver reads directions and modes from pyiqa's table, not through a
    torch import (seconds per job); a worker that imported pyiqa sees the same table."""
    import subprocess
    import sys

    code = ("import sys, json; from pairflow.metrics import METRICS, metric_spec; "
            "specs = {n: metric_spec(n).asdict({}) for n in METRICS}; "
            "assert 'torch' not in sys.modules and 'pyiqa' not in sys.modules; print(json.dumps(specs))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import json

    from pairflow.metrics import METRICS, _pyiqa_table, metric_spec

    _pyiqa_table.cache_clear()
    import pyiqa  # noqa: F401 - now the worker's path: the imported table

    assert json.loads(out.stdout) == {n: metric_spec(n).asdict({}) for n in METRICS}


# --- scoring.decode: vbench decodes each dimension as VBench 0.1.5 reads it ---------------

VBENCH_DIMENSIONS = {"subject_consistency": "decord", "background_consistency": "decord",
                     "aesthetic_quality": "decord", "imaging_quality": "decord", "dynamic_degree": "opencv",
                     "motion_smoothness_proxy": "opencv", "temporal_flickering": "opencv"}
DECODE_DATA = Path(__file__).parent / "data" / "vbench_decode"


def test_each_dimension_declares_the_reader_vbench_uses() -> None:
    from pairflow.metrics import METRICS, metric_spec

    assert {n: metric_spec(n).vbench_reader for n in METRICS if metric_spec(n).vbench_reader} == VBENCH_DIMENSIONS
    assert all(metric_spec(n).vbench_reader == "" for n in METRICS if metric_spec(n).kind == "FR")


@pytest.mark.parametrize("mode", ["bt709", "vbench"])
def test_vbench_mode_gives_each_dimension_the_frames_vbench_s_reader_gives(tmp_path: Path, encoder_spec, mode: str) -> None:  # type: ignore[no-untyped-def]
    """Against independent decodes, fixed: the frames OpenCV 4.10 and decord 0.6.0 return
    for the same file (tests/data/vbench_decode/README.md). Under ``vbench`` every dimension
    sees its own reader's frames exactly; under ``bt709`` every metric sees decord's
    (the declared matrix), so only the OpenCV dimensions differ from VBench."""
    from conftest import small_config

    from pairflow.media.video import read_video
    from pairflow.plan.config import study_from_raw
    from pairflow.stages.scoring import metric_decoding

    expected = np.load(DECODE_DATA / "expected.npz")
    reference = {"decord": expected["decord_0_6_0"], "opencv": expected["opencv_4_10_0"]}
    study = study_from_raw(small_config(tmp_path, tmp_path / "model", scoring={"decode": mode}), tmp_path)
    for name, reader in {**VBENCH_DIMENSIONS, "psnr": "decord", "lpips": "decord"}.items():
        frames = read_video(DECODE_DATA / "clip.mp4", encoder_spec, frames=9, height=48, width=64, fps=8,
                            matrix=metric_decoding(study, name))
        want = reference[reader if mode == "vbench" else "decord"]
        assert np.array_equal(frames, want), (name, mode, np.abs(frames.astype(int) - want).max())
    assert np.abs(reference["decord"].astype(int) - reference["opencv"]).max() > 20  # the readers really differ


def test_live_readers_match_when_installed(encoder_spec) -> None:  # type: ignore[no-untyped-def]
    """The same check against OpenCV 4.x / decord themselves, where installed."""
    from pairflow.media.video import read_video

    checked = 0
    try:
        import cv2
    except ImportError:
        cv2 = None
    if cv2 is not None and cv2.__version__.startswith("4."):
        cap, frames = cv2.VideoCapture(str(DECODE_DATA / "clip.mp4")), []
        while (got := cap.read())[0]:
            frames.append(got[1][..., ::-1])
        bt601 = read_video(DECODE_DATA / "clip.mp4", encoder_spec, frames=9, height=48, width=64, fps=8, matrix="bt601")
        assert np.array_equal(np.stack(frames), bt601)
        checked += 1
    try:
        import decord
    except ImportError:
        decord = None
    if decord is not None:
        vr = decord.VideoReader(str(DECODE_DATA / "clip.mp4"))
        bt709 = read_video(DECODE_DATA / "clip.mp4", encoder_spec, frames=9, height=48, width=64, fps=8)
        assert np.array_equal(vr.get_batch(list(range(len(vr)))).asnumpy(), bt709)
        checked += 1
    if not checked:
        pytest.skip("neither OpenCV 4.x nor decord is installed (the environment's OpenCV 5 decodes by the tags); "
                    "the fixed frames of tests/data/vbench_decode stand in")


def bicubic_1d(src: np.ndarray, out_len: int, scale: float) -> np.ndarray:
    """PyTorch's bicubic sampling along axis 0 (A = -0.75, half-pixel centres, edges
    clamped), at source positions (i + 0.5) / scale - 0.5: a reference written from the
    kernel's definition."""
    a = -0.75

    def w(t: float) -> float:
        t = abs(t)
        return ((a + 2) * t - (a + 3)) * t * t + 1 if t <= 1 else (((t - 5) * t + 8) * t - 4) * a if t < 2 else 0.0

    out = np.zeros((out_len, *src.shape[1:]))
    for i in range(out_len):
        x = (i + 0.5) / scale - 0.5
        x0 = int(np.floor(x))
        for k in range(x0 - 1, x0 + 3):
            out[i] += w(x - k) * src[min(max(k, 0), src.shape[0] - 1)]
    return out


def test_dino_position_embedding_is_interpolated_the_dino_way() -> None:
    """Square grids keep the table; a non-square grid gets DINO's scale-factor resampling
    (checked against a bicubic reference written from the kernel), which differs from
    timm's size-based one."""
    import torch
    from timm.layers import resample_abs_pos_embed

    from pairflow.metrics.models import dino_pos_embed

    g = torch.Generator().manual_seed(0)
    table = torch.randn(1, 1 + 14 * 14, 8, generator=g)
    assert dino_pos_embed(table, 14, 14) is table
    rows, cols = 14, 24  # a 224x398 frame (16:9 resized to a 224 short side)
    ours = dino_pos_embed(table, rows, cols)
    grid = table[0, 1:].reshape(14, 14, 8).double().numpy()
    ref = bicubic_1d(bicubic_1d(grid, rows, (rows + 0.1) / 14).transpose(1, 0, 2), cols, (cols + 0.1) / 14)
    assert torch.equal(ours[:, :1], table[:, :1])
    assert np.allclose(ours[0, 1:].reshape(rows, cols, 8).numpy(), ref.transpose(1, 0, 2), atol=1e-5)
    timm_way = resample_abs_pos_embed(table, new_size=[rows, cols], old_size=[14, 14], num_prefix_tokens=1)
    rel = float((timm_way - ours).norm() / ours.norm())
    assert rel > 0.01, rel


def test_dino_model_uses_dino_interpolation_on_non_square_frames(test_mirror) -> None:  # type: ignore[no-untyped-def]
    import torch

    from pairflow.metrics import models

    model = models.load("dino", str(test_mirror))
    x = torch.randn(1, 3, 224, 384, generator=torch.Generator().manual_seed(0))
    tokens = model.patch_embed(x)  # (1, 14, 24, D)
    expected = torch.cat([model.cls_token, tokens.reshape(1, -1, tokens.shape[-1])], 1) + \
        models.dino_pos_embed(model.pos_embed, 14, 24)
    with torch.inference_mode():
        assert torch.equal(model._pos_embed(tokens), expected)
        assert model(x).shape == (1, 768)


def test_clip_precision_is_selectable_and_enters_the_scorer_build(tmp_path: Path, test_mirror) -> None:  # type: ignore[no-untyped-def]
    """fp16 is VBench's CLIP on GPUs (half weights and activations, float32 layer norms);
    fp32 the CPU default; the choice is in the build digest, so a change rescores."""
    import torch
    from conftest import small_config

    from pairflow.errors import ConfigError
    from pairflow.metrics import models
    from pairflow.plan.config import study_from_raw
    from pairflow.stages.scoring import clip_precision, scorer_build

    half = models.load("clip_b32", str(test_mirror), "fp16")
    assert half.visual.conv1.weight.dtype == torch.float16 and half.visual.ln_post.weight.dtype == torch.float32
    assert models.load("clip_b32", str(test_mirror)).visual.conv1.weight.dtype == torch.float32
    with pytest.raises(ConfigError, match="only the CLIP towers"):
        models.load("dino", str(test_mirror), "fp16")
    x = clip(9, 3, 48, 64)
    ctx = ScoreContext(mirror=test_mirror, batch=2)
    full, halved = (score("background_consistency", x, None, dataclasses.replace(ctx, clip_precision=p))
                    for p in ("fp32", "fp16"))
    assert full == pytest.approx(halved, abs=5e-3)
    builds = {}
    for p in ("auto", "fp32", "fp16"):
        study = study_from_raw(small_config(tmp_path / p, tmp_path / "model", weights={"mirror": str(test_mirror)},
                                            scoring={"clip_precision": p},
                                            scorers=["background_consistency"]), tmp_path / p)
        builds[p] = scorer_build(study)
        assert clip_precision(study, "cuda") == ("fp32" if p == "fp32" else "fp16")
    assert builds["auto"]["digest"] == builds["fp32"]["digest"] != builds["fp16"]["digest"]
    assert builds["fp16"]["precision"].endswith("CLIP image towers fp16")


# --- the slot's device (issue 25 item 1) --------------------------------------------------

def test_a_gpu_slot_scores_on_cuda_and_the_device_enters_the_build(tmp_path: Path, test_mirror) -> None:  # type: ignore[no-untyped-def]
    """A job granted GPUs scores on them: its build says cuda (and VBench's fp16 CLIP under
    auto) and its digest differs from the CPU build's, so a change of device rescores,
    and one build covers both arms of every pair of the job."""
    from conftest import small_config

    from pairflow.fleet.pool import Grant
    from pairflow.plan.config import study_from_raw
    from pairflow.stages.scoring import scorer_build, scoring_device

    study = study_from_raw(small_config(tmp_path, tmp_path / "model", weights={"mirror": str(test_mirror)},
                                        scorers=["background_consistency", "psnr"]), tmp_path)
    cpu, gpu = scorer_build(study, Grant()), scorer_build(study, Grant(accelerators=("0", "1")), cuda=True)
    assert scoring_device(Grant()) == "cpu" and scoring_device(None) == "cpu"
    # Granted GPUs torch cannot use (Slurm gres on a node without CUDA, as in CI): the CPU.
    assert scoring_device(Grant(accelerators=("0",)), cuda=False) == "cpu"
    assert scorer_build(study, Grant(accelerators=("0", "1")), cuda=False)["device"] == "cpu"
    assert cpu["device"] == "cpu" and gpu["device"] == "cuda"
    assert gpu["precision"].endswith("CLIP image towers fp16") and cpu["precision"].endswith("fp32")
    assert "run on the slot GPU (cuda)" in gpu["layout"] and cpu["digest"] != gpu["digest"]
    assert scorer_build(study, Grant(accelerators=("2", "3")), cuda=True)["digest"] == gpu["digest"]  # which GPUs: not


def test_a_score_jobs_warm_up_pins_cuda_settings_on_a_cuda_slot(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Audit of issue 25, defect 2: score-only jobs never pinned TF32/cuDNN (torch's
    default lets cuDNN convolutions run in TF32), so they scored in TF32 what a combined
    job scored in float32 under one scorer digest. The scoring warm-up pins on a CUDA
    slot (and a score task again, should its warm-up have failed); the build's digest names
    the settings. Only the device decision and our own pin and warm functions are
    replaced, never torch."""
    from conftest import small_config

    from pairflow.fleet.pool import Grant
    from pairflow.generation.generate import CUDA_SETTINGS
    from pairflow.plan.config import study_from_raw
    from pairflow.stages import scoring

    study = study_from_raw(small_config(tmp_path, tmp_path / "model", scorers=["temporal_flickering", "psnr"]),
                           tmp_path)
    gpu = scoring.scorer_build(study, Grant(accelerators=("0",)), cuda=True)  # the device decision: a CUDA slot
    cpu = scoring.scorer_build(study, Grant(accelerators=("0",)), cuda=False)
    assert gpu["cuda_settings"] == CUDA_SETTINGS and gpu["cuda_settings"]["cudnn_tf32"] is False
    assert "cuda_settings" not in cpu  # a CPU build's digest is what it was
    pins: list[str] = []
    warmed: list[tuple[list[str], str, list[str]]] = []
    monkeypatch.setattr(scoring, "pin_cuda", lambda: pins.append("pinned"))
    monkeypatch.setattr(scoring, "warm", lambda names, ctx, weights: warmed.append((names, ctx.device, weights))
                        or {"import_s": 0.0, "load_s": 0.0})
    out = scoring.warm_scoring(scoring.scorer_warm_payload(study, gpu))
    assert pins == ["pinned"] and warmed == [(["temporal_flickering", "psnr"], "cuda", [])]
    assert set(out) >= {"import_s", "load_s"}
    scoring.warm_scoring(scoring.scorer_warm_payload(study, cpu))
    assert pins == ["pinned"] and warmed[-1][1] == "cpu"  # a CPU slot pins nothing


def test_the_scoring_warm_up_loads_the_studys_scorer_models_so_the_first_task_does_not(
        tmp_path: Path, test_mirror) -> None:  # type: ignore[no-untyped-def]
    """Audit of issue 25, defect 3: the warm-up imported only pairflow.metrics, so the
    metric modules, their libraries and every model load ran inside the first score task
    (booked as task work). The warm-up now imports the study's metric modules and builds
    their models (RAFT for the static filter too) on the slot's device in the cache the
    tasks read; weight-free metrics load nothing; a missing weight raises as scoring does."""
    from conftest import small_config

    from pairflow.errors import WeightsError
    from pairflow.metrics import ScoreContext, models, warm
    from pairflow.plan.config import study_from_raw
    from pairflow.stages import scoring

    study = study_from_raw(small_config(tmp_path, tmp_path / "model", weights={"mirror": str(test_mirror)},
                                        scorers=["subject_consistency", "temporal_flickering", "psnr"],
                                        scoring={"static_filter": "intersection"}), tmp_path)
    models.clear_cache()
    before = dict(models.LOAD_COUNTS)
    out = scoring.warm_scoring(scoring.scorer_warm_payload(study, scoring.scorer_build(study)))
    assert out["load_s"] > 0 and out["import_s"] > 0
    built = {k: v - before.get(k, 0) for k, v in models.LOAD_COUNTS.items() if v != before.get(k, 0)}
    assert built == {"dino": 1, "raft_large": 1}  # the static filter's RAFT too; flicker and PSNR load nothing
    x = clip(4, 3, 32, 32)
    score("subject_consistency", x, None, ScoreContext(mirror=test_mirror, batch=2))
    assert {k: v - before.get(k, 0) for k, v in models.LOAD_COUNTS.items() if v != before.get(k, 0)} == built
    assert warm(["temporal_flickering", "ssim"], ScoreContext())["load_s"] < 0.01  # weight-free: nothing to load
    with pytest.raises(WeightsError):
        warm(["subject_consistency"], ScoreContext(mirror=tmp_path / "no-mirror"))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA: the refusal is for one without")
def test_a_cuda_build_in_a_worker_without_cuda_is_refused_naming_the_fix() -> None:
    from pairflow.errors import ScoringError

    with pytest.raises(ScoringError, match=r"scoring device 'cuda': this worker's torch .* sees no CUDA device"):
        score("temporal_flickering", clip(1), None, ScoreContext(device="cuda"))
    with pytest.raises(ScoringError, match="'tpu' is not one PairFlow scores on"):
        score("temporal_flickering", clip(1), None, ScoreContext(device="tpu"))


def test_models_are_built_on_the_context_device_and_cached_per_device(test_mirror) -> None:  # type: ignore[no-untyped-def]
    """The plumbing on CPU: the model a metric loads sits on the device it was asked for,
    the frames are moved there once as uint8, and the cache keys on the device (a CUDA
    slot never gets the CPU copy)."""
    import torch

    from pairflow.metrics import models

    model = models.load("dino", str(test_mirror), device="cpu")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    # one model however the call is spelt: a warm-up's positional call serves a metric's keyword call
    assert models.load("dino", str(test_mirror), "fp32", "cpu") is model
    x = models.float_frames(clip(3, 2, 8, 8), "cpu")
    assert x.dtype == torch.float32 and x.shape == (2, 3, 8, 8) and x.device.type == "cpu"


def test_a_video_is_moved_to_the_device_once_for_all_its_metrics() -> None:
    """Off the CPU every metric's float_frames of one decoded video slices one uint8 copy
    on the device (torch's meta device stands in for a GPU: same code path, no data); a
    pair's two videos stay, a third displaces the oldest, a freed array frees its copy."""
    import gc

    from pairflow.metrics import models

    a, b, c = clip(1, 2, 8, 8), clip(2, 2, 8, 8), clip(3, 2, 8, 8)
    first = models.on_device(a, "meta")
    assert first.device.type == "meta" and first.dtype == __import__("torch").uint8
    assert models.on_device(a, "meta") is first and models.on_device(b, "meta") is models.on_device(b, "meta")
    x = models.float_frames(a, "meta")
    assert x.shape == (2, 3, 8, 8) and x.dtype == __import__("torch").float32
    models.on_device(c, "meta")
    assert models.on_device(a, "meta") is not first  # displaced by c (two kept), moved again
    del a, b, c, first, x
    gc.collect()
    models.on_device(clip(4, 2, 8, 8), "meta")
    assert len(models._ON_DEVICE) <= models.ON_DEVICE_KEPT
    models.release_frames()  # a score task's end: nothing stays on the device for the next task
    assert models._ON_DEVICE == []


CUDA = pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device (a GPU slot)")


@CUDA
@pytest.mark.parametrize("name", sorted(WEIGHTED) + ["psnr", "ssim", "ms_ssim"])
def test_every_metric_scores_on_cuda_as_on_cpu(name: str, test_mirror) -> None:  # type: ignore[no-untyped-def]
    """On a GPU slot every metric runs on CUDA (models and frames there) and agrees with
    its CPU score to float32 tolerance. TF32 off is the scoring warm-up's doing (defect 2
    of the issue 25 audit: the test pinned by itself and hid that score jobs never did),
    so torch's defaults are restored first and only the production warm-up pins."""
    import torch

    from pairflow.metrics import models, needed_weights
    from pairflow.stages.scoring import warm_scoring

    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = True, False  # torch's defaults
    warm_scoring({"scorers": [name], "weights": needed_weights([name]), "mirror": str(test_mirror),
                  "device": "cuda", "clip_precision": "fp32"})
    assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.deterministic is True
    f, h, w = WEIGHTED.get(name, (3, 176, 176))
    x, y = clip(4, f, h, w), clip(5, f, h, w)
    on = {d: score(name, x, y, ScoreContext(mirror=test_mirror, batch=2, device=d)) for d in ("cpu", "cuda")}
    assert on["cuda"] == pytest.approx(on["cpu"], rel=1e-3, abs=1e-4)
    if name in WEIGHTED and name not in ("lpips",):
        key = {"subject_consistency": "dino", "background_consistency": "clip_b32", "aesthetic_quality": "clip_l14",
               "imaging_quality": "musiq_spaq", "dynamic_degree": "raft_large"}[name]
        model = models.load(key, str(test_mirror), "fp32", "cuda")
        assert {p.device.type for p in model.parameters()} == {"cuda"}
    assert torch.cuda.max_memory_allocated() > 0

"""The offline weight mirror: lock, verification before use, and the errors a scoring
job stops with (no mirror, missing file, altered file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pairflow.errors import IntegrityError, WeightDigestError, WeightsError
from pairflow.metrics.weights import LOCK_NAME, WEIGHTS, build_test_mirror, read_lock, verify


def small_mirror(dest: Path) -> Path:
    build_test_mirror(dest, keys=["laion_aes_linear", "lpips_alex_v01"])
    return dest


def test_lock_lists_every_file_with_its_xxh3_digest(tmp_path: Path) -> None:
    lock = read_lock(small_mirror(tmp_path))
    assert lock.origin == "random-init"
    assert set(lock.files) == {WEIGHTS["laion_aes_linear"].path, WEIGHTS["lpips_alex_v01"].path}
    assert all(d.startswith("xxh3_128:") for d in lock.files.values())
    assert verify(tmp_path, ["laion_aes_linear"]) == {WEIGHTS["laion_aes_linear"].path:
                                                      lock.files[WEIGHTS["laion_aes_linear"].path]}


def test_no_mirror_fails_naming_the_mirror_command() -> None:
    with pytest.raises(WeightsError, match=r"no weight mirror is configured.*pairflow mirror --dest"):
        verify(None, ["dino_vitb16"], needed_by="subject_consistency")


def test_mirror_without_lock_fails_naming_the_command(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=rf"no {LOCK_NAME}.*pairflow mirror --dest {tmp_path}"):
        verify(tmp_path, ["dino_vitb16"])


def test_missing_file_is_named(tmp_path: Path) -> None:
    small_mirror(tmp_path)
    (tmp_path / WEIGHTS["laion_aes_linear"].path).unlink()
    with pytest.raises(WeightsError, match=r"sa_0_4_vit_l_14_linear.pth .*is missing.*pairflow mirror --dest"):
        verify(tmp_path, ["laion_aes_linear"])
    with pytest.raises(WeightsError, match=r"dino_vitbase16_pretrain.pth .*is not in"):
        verify(tmp_path, ["dino_vitb16"])


def test_altered_file_fails_naming_the_file_and_both_digests(tmp_path: Path) -> None:
    small_mirror(tmp_path)
    path = tmp_path / WEIGHTS["lpips_alex_v01"].path
    expected = read_lock(tmp_path).files[WEIGHTS["lpips_alex_v01"].path]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(WeightDigestError) as e:
        verify(tmp_path, ["lpips_alex_v01"])
    msg = str(e.value)
    from pairflow.identity import digest_file

    assert str(path) in msg and expected in msg and digest_file(path) in msg and "pairflow mirror --dest" in msg
    assert isinstance(e.value, IntegrityError)


def test_lock_format_is_checked(tmp_path: Path) -> None:
    small_mirror(tmp_path)
    lock = json.loads((tmp_path / LOCK_NAME).read_text())
    lock["format"] = "something-else"
    (tmp_path / LOCK_NAME).write_text(json.dumps(lock))
    with pytest.raises(WeightsError, match="format"):
        read_lock(tmp_path)


def test_scoring_job_without_mirror_fails_before_any_worker(tmp_path: Path) -> None:
    """run_scoring checks the weights before reading records or starting Parsl."""
    from conftest import small_config

    from pairflow.fleet.pool import Grant
    from pairflow.plan.config import study_from_raw
    from pairflow.stages.scoring import run_scoring

    study = study_from_raw(small_config(tmp_path, tmp_path / "model",
                                        scorers=["temporal_flickering", "subject_consistency"]), tmp_path)
    with pytest.raises(WeightsError, match=r"no weight mirror is configured.*subject_consistency.*pairflow mirror"):
        run_scoring(study, "t", tmp_path / "scores.json", tmp_path / "run", Grant())
    assert not (tmp_path / "run").exists()


def test_scoring_job_with_altered_mirror_names_file_and_digests(tmp_path: Path) -> None:
    from conftest import small_config

    from pairflow.fleet.pool import Grant
    from pairflow.plan.config import study_from_raw
    from pairflow.stages.scoring import run_scoring

    mirror = small_mirror(tmp_path / "mirror")
    build_test_mirror(mirror, keys=["alexnet"])
    path = mirror / WEIGHTS["alexnet"].path
    with open(path, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00\x01\x02\x03")
    study = study_from_raw(small_config(tmp_path, tmp_path / "model", scorers=["psnr", "lpips"],
                                        weights={"mirror": str(mirror)}), tmp_path)
    with pytest.raises(WeightDigestError, match=rf"{path} does not match.*expected xxh3_128:\w+, found xxh3_128:\w+"):
        run_scoring(study, "t", tmp_path / "scores.json", tmp_path / "run", Grant())


def test_scorer_build_names_code_weights_device_and_layout(tmp_path: Path, test_mirror: Path) -> None:
    from conftest import small_config

    from pairflow.plan.config import study_from_raw
    from pairflow.stages.scoring import compared_frames, scorer_build

    study = study_from_raw(small_config(tmp_path, tmp_path / "model", scorers=["psnr", "lpips"],
                                        weights={"mirror": str(test_mirror)}), tmp_path)
    build = scorer_build(study)
    assert build["weights_lock"] == read_lock(test_mirror).digest and build["weights_origin"] == "random-init"
    assert build["device"] == "cpu" and build["precision"].startswith("float32") and build["workers"] == 1
    assert build["code_digest"].startswith("xxh3_128:") and build["packages"]["pyiqa"]
    assert build == scorer_build(study)  # deterministic: both arms get the same build
    assert "lossy" in compared_frames(study)
    lossless = study_from_raw(small_config(tmp_path, tmp_path / "model", encoder={"lossless": True}), tmp_path)
    assert "bit-identical" in compared_frames(lossless)

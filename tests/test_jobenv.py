from __future__ import annotations

from pathlib import Path

from pairflow.jobenv import cache_env


def test_every_cache_is_named_and_the_hub_is_offline(tmp_path: Path) -> None:
    env = cache_env(tmp_path, "generate_panel-smoke", 1)
    for key in ("HF_HOME", "HF_HUB_CACHE", "TORCH_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert env[key].startswith(str(tmp_path)), key
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"


def test_compiler_caches_are_scoped_to_job_and_retry(tmp_path: Path) -> None:
    a = cache_env(tmp_path, "generate_panel-smoke", 1)
    b = cache_env(tmp_path, "generate_panel-smoke", 2)
    c = cache_env(tmp_path, "generate_panel-motion", 1)
    for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert len({a[key], b[key], c[key]}) == 3
    assert a["HF_HOME"] == b["HF_HOME"] == c["HF_HOME"]  # read-mostly weights are shared


def test_weight_caches_point_at_the_mirror(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    env = cache_env(tmp_path / "scratch", "score_panel-smoke", 1, mirror)
    assert env["HF_HOME"] == str(mirror / "hf") and env["HF_HUB_CACHE"] == str(mirror / "hf" / "hub")
    assert env["TORCH_HOME"] == str(mirror / "torch")  # pyiqa's cache is $TORCH_HOME/hub/pyiqa
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["TRITON_CACHE_DIR"].startswith(str(tmp_path / "scratch"))  # compiler caches stay per job

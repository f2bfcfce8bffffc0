"""Shared fixtures: a tiny model built once per session, small configs, encoder specs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pairflow.config import EncoderSpec

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _private_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Processes the tests start (Snakemake, Parsl workers, ffmpeg) put their temporary
    files under pytest's own temp folder, not the system one: workers that a fault test
    kills leave multiprocessing's ``pymp-*`` folders behind, and pytest removes its own
    folder (``tmp_path_retention_policy``)."""
    import os

    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded tiny Wan pipeline, built once (shared with the default config if built)."""
    from pairflow.tinymodel import build_tiny_model

    out = tmp_path_factory.mktemp("model") / "tiny-wan"
    return build_tiny_model(out)


@pytest.fixture
def encoder_spec() -> EncoderSpec:
    return EncoderSpec(ffmpeg="", codec="libx264", crf=18, preset="medium", pix_fmt="yuv420p",
                       gop=9, threads=1, lossless=False, fail_on_flat=False)


def small_config(tmp: Path, model: Path, **over: object) -> dict:
    """A study config for tests: one panel of 2 prompts x 1 seed, control + 1 treatment."""
    sheet = tmp / "config" / "panels" / "t.tsv"
    sheet.parent.mkdir(parents=True, exist_ok=True)
    sheet.write_text("prompt_id\tprompt\na1\ta red fox in snow\na2\twaves on a beach\n")
    cfg = {
        "study": "test",
        "storage": {"scratch": str(tmp / "results" / "scratch"), "work": str(tmp / "results" / "work")},
        "model": {"kind": "embedded-tiny", "path": str(model)},
        "arms": {"control": {"cache": None},
                 "pab": {"cache": {"class": "PyramidAttentionBroadcastConfig",
                                   "params": {"spatial_attention_block_skip_range": 2,
                                              "spatial_attention_timestep_skip_range": [-1, 1000]}}}},
        "panels": {"t": {"sheet": str(sheet), "seeds": [0]}},
        "generation": {"frames": 5, "height": 32, "width": 32, "steps": 3},
        "fleet": {"cpu_workers": 1, "retries": 1},
        "stats": {"resamples": 200},
    }
    cfg.update(over)
    return cfg


def write_config(tmp: Path, cfg: dict) -> Path:
    path = tmp / "config" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def copy_project(dest: Path) -> Path:
    """Copy the workflow files (not results, not config) into ``dest`` for a test run."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "envs", "profiles"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dest / name)
    return dest


@pytest.fixture(scope="session")
def test_mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weight mirror with random-initialised weights for every declared architecture
    (the real layout and lock; built once per session, about 2 GB and 20 s)."""
    from pairflow.weights import build_test_mirror

    out = tmp_path_factory.mktemp("mirror")
    build_test_mirror(out)
    return out

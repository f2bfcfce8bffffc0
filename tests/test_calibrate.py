"""calibrate: the frozen table measured in a fresh worker (seconds and peak memory per
phase and arm), named by its key's digest; packing from its peaks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import small_config

from pairflow.calibrate import calibrate, key, load_table, packing, read_table, table_path
from pairflow.config import study_from_raw
from pairflow.errors import CalibrationError

PHASES = ("load", "denoise", "decode", "encode", "score:read", "score:temporal_flickering", "score:psnr")


def _study(tmp: Path, model: Path, **over: object):
    cfg = small_config(tmp, model, scorers=["temporal_flickering", "psnr"], **over)
    return study_from_raw(copy.deepcopy(cfg), tmp, source="test")


@pytest.fixture(scope="module")
def calibrated(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("calibrate")
    study = _study(tmp, tiny_model)
    return study, calibrate(study)


def test_every_arm_and_phase_is_measured_in_a_fresh_worker(calibrated):
    study, table = calibrated
    assert table["device"] == "cpu" and table["key"] == key(study, "cpu")
    assert table["import"]["s"] > 0.5  # a fresh process imports torch and diffusers
    assert table["worker_pid"] != table["made"]["pid"]  # measured in its own process, not the caller's
    assert set(table["arms"]) == {"control", "pab"}
    for arm in table["arms"].values():
        assert set(arm["phases"]) == set(PHASES)
        assert arm["phases"]["denoise"]["s"] > 0 and arm["phases"]["encode"]["s"] > 0
        assert all(p["peak_rss_mb"] > 100 and p["peak_device_mb"] is None for p in arm["phases"].values())
        assert arm["generate_s"] > arm["phases"]["encode"]["s"] and arm["warmup_s"] > 0
    assert read_table(study, "cpu") == json.loads(table_path(study, "cpu").read_text())


def test_the_table_is_frozen_and_a_changed_key_names_another_file(calibrated, tiny_model, tmp_path):
    study, table = calibrated
    assert calibrate(study)["made"] == table["made"]  # read, not measured again
    other = _study(tmp_path, tiny_model, generation={"frames": 5, "height": 32, "width": 48, "steps": 3})
    assert key(other, "cpu") != key(study, "cpu") and table_path(other, "cpu") != table_path(study, "cpu")
    with pytest.raises(CalibrationError, match="no calibration table .*'pairflow calibrate'"):
        read_table(other, "cpu")
    assert key(study, "cuda") != key(study, "cpu")
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "telemetry"}')
    with pytest.raises(CalibrationError, match="not a calibration table"):
        load_table(bad)


def test_packing_fits_the_peak_plus_headroom_and_defaults_to_one():
    table = {"device": "cuda", "capacity": {"device_mb": 80_000.0, "host_mb": 500_000.0, "cpus": 32},
             "import": {"s": 1.0, "peak_rss_mb": 900.0, "peak_device_mb": None},
             "arms": {"control": {"phases": {"denoise": {"s": 5.0, "peak_rss_mb": 3000.0, "peak_device_mb": 30_000.0},
                                             "score:psnr": {"s": 1.0, "peak_rss_mb": 2000.0,
                                                            "peak_device_mb": 9_000.0}}}}}
    p = packing(table, 0.2)
    assert p["generate"]["workers"] == 2  # 80000 x 0.8 / 30000 = 2.13
    assert p["score"]["workers"] == 7  # 64000 / 9000 = 7.1
    assert p["combined"]["workers"] == 2
    no_device = {**table, "arms": {"control": {"phases": {"denoise": {"s": 5.0, "peak_rss_mb": 3000.0,
                                                                      "peak_device_mb": None}}}}}
    assert packing(no_device, 0.2)["generate"]["workers"] == 1  # nothing shows more fits
    cpu = {**table, "device": "cpu"}
    assert packing(cpu, 0.2, threads=4)["generate"]["workers"] == 8  # 32 CPUs / 4 threads, not 133 by memory


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device: the GPU branch (device memory, packing by it)")
def test_on_a_gpu_device_memory_is_measured_and_packing_uses_it(tiny_model, tmp_path):
    study = _study(tmp_path, tiny_model)
    table = calibrate(study)
    assert table["device"] == "cuda" and table["capacity"]["device_mb"] > 1000 and table["capacity"]["device_name"]
    for arm in table["arms"].values():
        assert arm["phases"]["denoise"]["peak_device_mb"] > 0 and arm["phases"]["decode"]["peak_device_mb"] > 0
    p = table["packing"]
    assert p["basis"] == "device memory" and p["generate"]["workers"] >= 1
    assert p["generate"]["capacity_mb"] == table["capacity"]["device_mb"]

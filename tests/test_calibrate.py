"""calibrate: the frozen table measured in a fresh worker (seconds and peak memory per
phase and arm), named by its key's digest; packing from its peaks."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import pytest
from conftest import small_config

from pairflow.budget.calibrate import FORMAT, calibrate, key, load_table, packing, read_table, table_path, workers_for
from pairflow.errors import CalibrationError
from pairflow.fleet.pool import TaskHooks, run_tasks
from pairflow.fleet.sites import AllocationInfo, Grant
from pairflow.plan.config import study_from_raw

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
    assert table["measured_in"] == "fresh worker"  # not by a run's preparing job (calibworker.prepare)
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


# --- the choice a job takes (workers_for) -------------------------------------------------------

def _fake_table(study, device: str, peak_mb: float, capacity_mb: float, cpus: int = 64) -> Path:
    """A frozen table at this study's key for ``device`` whose every phase peaks at ``peak_mb``."""
    field = "peak_device_mb" if device == "cuda" else "peak_rss_mb"
    phase = {"s": 1.0, "peak_rss_mb": peak_mb, "peak_device_mb": None, field: peak_mb}
    capacity = {"host_mb": capacity_mb, "cpus": cpus, **({"device_mb": capacity_mb} if device == "cuda" else {})}
    table = {"kind": "calibration", "format": FORMAT, "key": key(study, device), "device": device,
             "capacity": capacity, "import": dict(phase),
             "arms": {a.name: {"phases": {"denoise": dict(phase), "score:psnr": dict(phase)}} for a in study.arms}}
    path = table_path(study, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table))
    return path


def _packing_study(tmp: Path, model: Path, **fleet: object):
    return _study(tmp, model, generation={"frames": 5, "height": 32, "width": 32, "steps": 3, "threads": 1},
                  fleet={"cpu_workers": 2, "retries": 0, **fleet})


GPUS = Grant(accelerators=("0", "1"))


def test_a_job_packs_gpus_by_the_calibrated_peak_plus_headroom(tiny_model, tmp_path):
    study = _packing_study(tmp_path, tiny_model)
    none = workers_for(study, ("generate",), GPUS)
    assert none.per_gpu == 1 and none.record["source"].startswith(
        f"default: no calibration table for this study planned on cuda ({table_path(study, 'cuda').name})")
    _fake_table(study, "cuda", peak_mb=30_000.0, capacity_mb=80_000.0)
    two = workers_for(study, ("generate", "score"), GPUS)  # 80000 x (1 - 0.2) / 30000 = 2.13
    assert two.per_gpu == 2 and two.record["source"] == f"calibration {key(study, 'cuda')}"
    assert two.record["headroom"] == 0.2 and two.per_node(study.fleet, GPUS) == 4
    tight = _packing_study(tmp_path, tiny_model, packing_headroom=0.7)  # 80000 x 0.3 / 30000 = 0.8: one
    assert key(tight, "cuda") == key(study, "cuda") and workers_for(tight, ("generate",), GPUS).per_gpu == 1
    one = _packing_study(tmp_path, tiny_model, packing="one")
    assert workers_for(one, ("generate",), GPUS).per_gpu == 1
    assert workers_for(one, ("generate",), GPUS).record["source"] == "fleet.packing: one"


def test_a_combined_job_takes_the_fewer_workers_of_its_stages(tiny_model, tmp_path):
    study = _packing_study(tmp_path, tiny_model)
    path = _fake_table(study, "cuda", peak_mb=30_000.0, capacity_mb=80_000.0)
    table = json.loads(path.read_text())
    table["import"]["peak_device_mb"] = None  # importing touches no device
    for a in table["arms"].values():
        a["phases"]["score:psnr"]["peak_device_mb"] = 9_000.0  # scoring alone: 64000 / 9000 = 7
    path.write_text(json.dumps(table))
    assert workers_for(study, ("score",), GPUS).per_gpu == 7
    assert workers_for(study, ("generate",), GPUS).per_gpu == 2
    assert workers_for(study, ("generate", "score"), GPUS).per_gpu == 2


def test_a_stale_or_foreign_table_means_the_default(tiny_model, tmp_path):
    study = _packing_study(tmp_path, tiny_model)
    path = _fake_table(study, "cuda", peak_mb=10_000.0, capacity_mb=80_000.0)
    table = json.loads(path.read_text())
    path.write_text(json.dumps({**table, "key": "xxh3_128:0"}))  # made for another key
    stale = workers_for(study, ("generate",), GPUS)
    assert stale.per_gpu == 1 and stale.record["source"].startswith("default: calibration table not usable")
    path.write_text(json.dumps({**table, "device": "cpu"}))  # planned on cuda, measured on CPU
    assert workers_for(study, ("generate",), GPUS).per_gpu == 1
    assert "measured on cpu" in workers_for(study, ("generate",), GPUS).record["source"]
    path.unlink()
    # Planned on a login node without a GPU (the table's name says cpu), measured on the GPU job's device: used.
    planned_cpu = table_path(study, "cpu")
    planned_cpu.write_text(json.dumps({**table, "key": key(study, "cpu")}))
    assert workers_for(study, ("generate",), GPUS).per_gpu == 6  # 80000 x 0.8 / 10000
    planned_cpu.unlink()
    _fake_table(study, "cuda", peak_mb=10_000.0, capacity_mb=80_000.0)
    changed = _study(tmp_path, tiny_model, generation={"frames": 5, "height": 32, "width": 32, "steps": 4,
                                                       "threads": 1})
    assert workers_for(changed, ("generate",), GPUS).per_gpu == 1  # another key: the table is not read


def test_cpu_workers_never_exceed_the_users_cap_nor_the_cores(tiny_model, tmp_path):
    study = _packing_study(tmp_path, tiny_model)  # fleet.cpu_workers 2
    cpu = Grant()
    assert workers_for(study, ("generate",), cpu).cpu_workers == 2  # no table: fleet.cpu_workers, as before
    _fake_table(study, "cpu", peak_mb=100.0, capacity_mb=1_000_000.0)  # memory would fit thousands
    assert workers_for(study, ("generate",), cpu).per_node(study.fleet, cpu) == min(2, os.cpu_count() or 1)
    slurm = Grant(allocation=AllocationInfo("1", 1, "n1", 1, (), None))  # one core on the node
    assert workers_for(study, ("generate",), slurm).cpu_workers == 1
    _fake_table(study, "cpu", peak_mb=600.0, capacity_mb=1000.0)  # 1000 x 0.8 / 600: one fits
    assert workers_for(study, ("generate",), cpu).cpu_workers == 1


def _pid(p: dict) -> dict:
    time.sleep(0.5)
    return {"pid": os.getpid()}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two CPU workers need two cores")
def test_a_real_pool_starts_the_calibrated_cpu_workers_and_records_them(tiny_model, tmp_path, monkeypatch):
    # Parsl workers unpickle the task by module name: let them import this test module.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                   os.environ.get("PYTHONPATH")])))
    study = _packing_study(tmp_path, tiny_model)
    seen = {}
    for peak in (600.0, 100.0):  # 1000 MiB x 0.8: one worker fits, then two (the cap)
        _fake_table(study, "cpu", peak_mb=peak, capacity_mb=1000.0)
        packing_ = workers_for(study, ("generate", "score"), Grant())
        tel = tmp_path / f"tel-{peak:.0f}.json"
        out = run_tasks(_pid, [{}] * 6, tmp_path / f"run-{peak:.0f}", study.fleet, Grant(), "pack",
                        TaskHooks(tel), packing_)
        t = json.loads(tel.read_text())
        seen[peak] = (t["packing"]["workers_per_node"], len(t["slots"]), len({r["pid"] for r in out}))
        assert t["packing"]["source"] == f"calibration {key(study, 'cpu')}" and t["packing"]["headroom"] == 0.2
        assert f"max_workers_per_node={seen[peak][0]}" in t["parsl_config"]
    assert seen[600.0][:2] == (1, 1) and seen[600.0][2] == 1
    assert seen[100.0][:2] == (2, 2) and seen[100.0][2] == 2

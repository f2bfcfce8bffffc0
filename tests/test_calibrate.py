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

from pairflow.budget.calibrate import (
    FORMAT,
    calibrate,
    job_device,
    key,
    key_fields,
    load_table,
    packing,
    read_table,
    table_path,
    take_prepared,
    workers_for,
)
from pairflow.errors import CalibrationError
from pairflow.fleet.pool import TaskHooks, run_tasks
from pairflow.fleet.sites import AllocationInfo, Grant
from pairflow.layout import Layout
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
    assert table["device"] == "cpu" and table["key"] == key(study)
    assert table["import"]["s"] > 0.5  # a fresh process imports torch and diffusers
    assert table["worker_pid"] != table["made"]["pid"]  # measured in its own process, not the caller's
    assert table["measured_in"] == "fresh worker"  # not by a run's preparing job (calibworker.prepare)
    assert set(table["arms"]) == {"control", "pab"}
    for arm in table["arms"].values():
        assert set(arm["phases"]) == set(PHASES)
        assert arm["phases"]["denoise"]["s"] > 0 and arm["phases"]["encode"]["s"] > 0
        assert all(p["peak_rss_mb"] > 100 and p["peak_device_mb"] is None for p in arm["phases"].values())
        assert arm["generate_s"] > arm["phases"]["encode"]["s"] and arm["warmup_s"] > 0
    assert read_table(study) == json.loads(table_path(study).read_text())


def test_the_table_is_frozen_and_a_changed_key_names_another_file(calibrated, tiny_model, tmp_path):
    study, table = calibrated
    assert calibrate(study)["made"] == table["made"]  # read, not measured again
    other = _study(tmp_path, tiny_model, generation={"frames": 5, "height": 32, "width": 48, "steps": 3})
    assert key(other) != key(study) and table_path(other) != table_path(study)
    with pytest.raises(CalibrationError, match="no calibration table .*'pairflow calibrate'"):
        read_table(other)
    # Not keyed by the planning machine's device (a login node without a GPU plans for GPU
    # jobs): the table records the device kind it was measured on instead.
    assert "device" not in key_fields(study) and table["device"] == "cpu"
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
    """A frozen table at this study's key measured on ``device`` whose every phase peaks at ``peak_mb``."""
    field = "peak_device_mb" if device == "cuda" else "peak_rss_mb"
    phase = {"s": 1.0, "peak_rss_mb": peak_mb, "peak_device_mb": None, field: peak_mb}
    capacity = {"host_mb": capacity_mb, "cpus": cpus, **({"device_mb": capacity_mb} if device == "cuda" else {})}
    table = {"kind": "calibration", "format": FORMAT, "key": key(study), "device": device,
             "measured_in": "fresh worker", "made": {"host": "n1"}, "capacity": capacity, "import": dict(phase),
             "arms": {a.name: {"phases": {"denoise": dict(phase), "score:psnr": dict(phase)}} for a in study.arms}}
    path = table_path(study)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table))
    return path


def _packing_study(tmp: Path, model: Path, **fleet: object):
    return _study(tmp, model, generation={"frames": 5, "height": 32, "width": 32, "steps": 3, "threads": 1},
                  fleet={"cpu_workers": 2, "retries": 0, **fleet})


GPUS = Grant(accelerators=("0", "1"))


def test_a_job_packs_gpus_by_the_calibrated_peak_plus_headroom(tiny_model, tmp_path):
    study = _packing_study(tmp_path, tiny_model)
    none = workers_for(study, ("generate",), GPUS, device="cuda")
    assert none.per_gpu == 1 and none.record["source"].startswith(
        f"default: no calibration table {table_path(study)} for this study's key")
    _fake_table(study, "cuda", peak_mb=30_000.0, capacity_mb=80_000.0)
    two = workers_for(study, ("generate", "score"), GPUS, device="cuda")  # 80000 x (1 - 0.2) / 30000 = 2.13
    assert two.per_gpu == 2 and two.record["source"] == f"calibration {key(study)}"
    assert two.record["headroom"] == 0.2 and two.per_node(study.fleet, GPUS) == 4
    assert two.record["device"] == "cuda" and two.record["measured_in"] == "fresh worker"
    tight = _packing_study(tmp_path, tiny_model, packing_headroom=0.7)  # 80000 x 0.3 / 30000 = 0.8: one
    assert key(tight) == key(study) and workers_for(tight, ("generate",), GPUS, device="cuda").per_gpu == 1
    one = _packing_study(tmp_path, tiny_model, packing="one")
    assert workers_for(one, ("generate",), GPUS, device="cuda").per_gpu == 1
    assert workers_for(one, ("generate",), GPUS, device="cuda").record["source"] == "fleet.packing: one"


def test_a_combined_job_takes_the_fewer_workers_of_its_stages(tiny_model, tmp_path):
    study = _packing_study(tmp_path, tiny_model)
    path = _fake_table(study, "cuda", peak_mb=30_000.0, capacity_mb=80_000.0)
    table = json.loads(path.read_text())
    table["import"]["peak_device_mb"] = None  # importing touches no device
    for a in table["arms"].values():
        a["phases"]["score:psnr"]["peak_device_mb"] = 9_000.0  # scoring alone: 64000 / 9000 = 7
    path.write_text(json.dumps(table))
    assert workers_for(study, ("score",), GPUS, device="cuda").per_gpu == 7
    assert workers_for(study, ("generate",), GPUS, device="cuda").per_gpu == 2
    assert workers_for(study, ("generate", "score"), GPUS, device="cuda").per_gpu == 2


def test_a_stale_table_or_one_of_another_device_kind_means_the_default_with_one_warning(tiny_model, tmp_path,
                                                                                      caplog):
    study = _packing_study(tmp_path, tiny_model, calibrate=True)
    path = _fake_table(study, "cuda", peak_mb=10_000.0, capacity_mb=80_000.0)
    table = json.loads(path.read_text())
    path.write_text(json.dumps({**table, "key": "xxh3_128:0"}))  # made for another key
    stale = workers_for(study, ("generate",), GPUS, device="cuda")
    assert stale.per_gpu == 1 and stale.record["source"].startswith("default: calibration table not usable")
    # Measured on the login node's CPU, the job runs on a GPU: the default, and one warning in
    # the job's log naming the table, its device kind, the job's and the fix.
    path.write_text(json.dumps({**table, "device": "cpu", "measured_in": "build_tiny_model"}))
    caplog.clear()
    with caplog.at_level("WARNING", logger="pairflow.budget.calibrate"):
        foreign = workers_for(study, ("generate",), GPUS, device="cuda")
    assert foreign.per_gpu == 1 and "measured on cpu" in foreign.record["source"]
    [warning] = [r.getMessage() for r in caplog.records]
    assert f"calibration table {path} was measured on cpu (build_tiny_model, host n1), this job runs on cuda" \
        in warning
    assert "'snakemake --forcerun calibrate' with the profile that runs them" in warning
    assert "one worker per granted GPU" in warning
    path.write_text(json.dumps(table))  # measured on the job's own device kind: used, no warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="pairflow.budget.calibrate"):
        assert workers_for(study, ("generate",), GPUS, device="cuda").per_gpu == 6  # 80000 x 0.8 / 10000
    assert not caplog.records
    changed = _study(tmp_path, tiny_model, generation={"frames": 5, "height": 32, "width": 32, "steps": 4,
                                                       "threads": 1})
    assert workers_for(changed, ("generate",), GPUS, device="cuda").per_gpu == 1  # another key: not read


def test_granted_slots_without_cuda_are_a_cpu_job_and_share_the_cpu_table(tiny_model, tmp_path, monkeypatch):
    """The CI cluster's fake gres: Slurm sets CUDA_VISIBLE_DEVICES, torch sees no CUDA. The
    job computes on the CPU, as rule calibrate's worker did on such a node: the CPU table is
    used, its node-wide CPU workers shared over the granted slots."""
    monkeypatch.setattr("pairflow.budget.calibrate.device_kind", lambda: "cpu")
    assert job_device(GPUS) == "cpu" and job_device(Grant()) == "cpu"
    monkeypatch.setattr("pairflow.budget.calibrate.device_kind", lambda: "cuda")
    assert job_device(GPUS) == "cuda" and job_device(Grant()) == "cpu"  # no GPU granted: CPU workers
    monkeypatch.setattr("pairflow.budget.calibrate.device_kind", lambda: "cpu")
    study = _packing_study(tmp_path, tiny_model, cpu_workers=4)
    _fake_table(study, "cpu", peak_mb=100.0, capacity_mb=1_000_000.0)
    slurm = AllocationInfo("1", 1, "n1", 4, ("0", "1"), None)  # 4 cores: 4 CPU workers fit
    two_slots = workers_for(study, ("generate", "score"), Grant(accelerators=("0", "1"), allocation=slurm))
    assert two_slots.per_gpu == 2 and two_slots.record["source"] == f"calibration {key(study)}"  # 4 over 2 slots
    assert two_slots.record["device"] == "cpu" and "2 granted slot(s) without CUDA" in two_slots.record["why"]["slots"]
    one_slot = workers_for(study, ("generate",), Grant(accelerators=("0",), allocation=slurm))
    assert one_slot.per_gpu == 4 and one_slot.per_node(study.fleet, Grant(accelerators=("0",))) == 4


def test_rule_calibrate_takes_the_prepared_table_only_from_its_own_host_and_device_kind(tiny_model, tmp_path):
    """The preparing job runs where Snakemake runs (a localrule): on the local site that is
    where the panel jobs run; under a scheduler it is the login node, whose table rule
    calibrate (on the panel jobs' partition) measures again instead of copying."""
    study = _packing_study(tmp_path, tiny_model)
    cached = Layout(study.scratch).prepared_calibration(key(study))
    cached.parent.mkdir(parents=True, exist_ok=True)
    prepared = {"kind": "calibration", "format": FORMAT, "key": key(study), "device": "cpu",
                "measured_in": "build_tiny_model", "made": {"host": "login"}}
    cached.write_text(json.dumps(prepared))
    out = tmp_path / "table.json"
    assert not take_prepared(study, out, key(study), device="cuda", host="login")  # the login node's CPU
    assert not take_prepared(study, out, key(study), device="cpu", host="gpu-node-7")  # another machine
    assert not out.exists() and cached.exists()
    assert take_prepared(study, out, key(study), device="cpu", host="login")
    assert json.loads(out.read_text()) == prepared and not cached.exists()


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
        assert t["packing"]["source"] == f"calibration {key(study)}" and t["packing"]["headroom"] == 0.2
        assert f"max_workers_per_node={seen[peak][0]}" in t["parsl_config"]
    assert seen[600.0][:2] == (1, 1) and seen[600.0][2] == 1
    assert seen[100.0][:2] == (2, 2) and seen[100.0][2] == 2


def _fake_ffmpeg(tmp: Path, body: str) -> Path:
    """An ffmpeg that answers ``-version`` as the real one (the recipe's fingerprint) and
    otherwise runs ``body`` (shell)."""
    from pairflow.media.video import ffmpeg_binary
    from pairflow.plan.config import EncoderSpec

    real = ffmpeg_binary(EncoderSpec("", "libx264", 18, "medium", "yuv420p", 9, 1, False, False))
    fake = tmp / "fake-ffmpeg"
    fake.write_text(f'#!/bin/sh\ncase " $* " in *" -version "*) exec {real} "$@";; esac\n{body}\n')
    fake.chmod(0o755)
    return fake


def test_a_hung_ffmpeg_in_the_calibration_worker_is_ended_by_the_stall_rule(tiny_model, tmp_path):
    """Issue 40: in rule calibrate a hung ffmpeg was bounded only by its own 120 s
    timeout. The worker is watched as a fan-out's are: no progress for
    fleet.stall_timeout_s (here 10 s, the least allowed) ends it, its ffmpeg with it, and StalledError names
    the limit and what it last did."""
    import psutil

    from pairflow.errors import StalledError

    marker = tmp_path / "hung.pid"
    fake = _fake_ffmpeg(tmp_path, f"echo $$ > {marker}\nexec sleep 600")
    study = _study(tmp_path, tiny_model, encoder={"ffmpeg": str(fake)},
                   fleet={"cpu_workers": 1, "calibrate": True, "stall_timeout_s": 10})
    with pytest.raises(StalledError) as e:
        calibrate(study)
    ended = time.time()
    assert str(e.value).startswith("the calibration worker: stalled: no progress for ")
    assert "(fleet/stall_timeout_s: 10); it last reported: fake-ffmpeg: consumed " in str(e.value)
    # the stall rule (10 s), not ffmpeg's own 120 s timeout: half that bound leaves room for a
    # loaded machine's worker teardown without confusing the two
    assert ended - marker.stat().st_mtime < 60
    assert not psutil.pid_exists(int(marker.read_text())) or psutil.Process(
        int(marker.read_text())).status() == psutil.STATUS_ZOMBIE  # the hung ffmpeg went with its worker


def test_a_failed_calibration_worker_is_headed_by_its_exception_not_by_warnings(tiny_model, tmp_path, monkeypatch):
    """Issue 40: the failure's headline was an unrelated kernels/Hub warning quoted as if
    it were the stderr tail. The worker's stderr here starts with real warnings (a
    sitecustomize on its path emits a FutureWarning and a library WARNING log line);
    the message is headed by the exception that ended it and quotes its traceback only."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import logging, warnings\n"
        "warnings.warn('kernels: the Hub kernel cache is not configured', FutureWarning)\n"
        "logging.basicConfig()\n"
        "logging.getLogger('bitsandbytes').warning('compiled without GPU support')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    fake = _fake_ffmpeg(tmp_path, "echo 'broken encoder' >&2\nexit 1")
    study = _study(tmp_path, tiny_model, encoder={"ffmpeg": str(fake)}, fleet={"cpu_workers": 1, "calibrate": True})
    with pytest.raises(CalibrationError) as e:
        calibrate(study)
    text = str(e.value)
    assert text.startswith("the calibration worker failed (exit 1): EncodeError: "), text[:500]
    assert "broken encoder" in text.split("its stderr ends (warnings left out)")[0]  # the exception, ffmpeg's words
    assert "kernels" not in text and "bitsandbytes" not in text and "Warning" not in text
    assert "its stderr ends (warnings left out):\nTraceback (most recent call last):" in text


def test_the_quoted_tail_keeps_the_last_traceback_without_warning_lines():
    from pairflow.budget.calibrate import quoted_tail

    stderr = ("/x/kernels/hub.py:12: FutureWarning: kernels cache\n  warnings.warn(\n"
              "WARNING:bitsandbytes:compiled without GPU support\n"
              "Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n"
              "/y/z.py:3: UserWarning: from another thread\n"
              "pairflow.errors.EncodeError: ffmpeg failed\n")
    assert quoted_tail(stderr) == ("Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n"
                                   "pairflow.errors.EncodeError: ffmpeg failed")
    assert quoted_tail("FutureWarning: x\nreal line\n") == "real line"

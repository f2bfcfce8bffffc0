"""telemetry: busy share from spans, the NVML sampler's CSV and summary, utilisation."""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from pathlib import Path

import pytest
import torch

from pairflow.fleet.telemetry import NVML_FIELDS, Sampler, busy_share, nvml_reader, utilisation, write_telemetry


def span(rank: int, started: float, finished: float, host: str = "n1", gpu: str | None = None) -> dict:
    return {"host": host, "rank": rank, "gpu_index": gpu, "queued": 0.0, "started": started, "finished": finished}


def test_busy_share_clips_to_the_window_and_lists_idle_slots():
    spans = [span(0, 1.0, 4.0), span(0, 5.0, 7.0), span(1, -1.0, 2.0, gpu="3")]
    b = busy_share(spans, (0.0, 10.0), ["n1/cpu0", "n1/gpu3", "n1/gpu5"])
    assert b["n1/cpu0"]["busy_s"] == pytest.approx(5.0) and b["n1/cpu0"]["share"] == pytest.approx(0.5)
    assert b["n1/gpu3"]["busy_s"] == pytest.approx(2.0)  # the part before the window does not count
    assert b["n1/gpu5"] == {"busy_s": 0.0, "tasks": 0, "window_s": 10.0, "share": 0.0}  # allocated, never used


def test_failed_tasks_have_no_busy_time():
    b = busy_share([{"queued": 0.0, "started": None, "finished": 3.0, "failure": "other"}], (0.0, 4.0))
    assert b == {}


class Counter:
    """A reader with the NVML reader's shape: one row per GPU per call."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> list[dict]:
        self.calls += 1
        return [{"time": time.time(), "index": i, "uuid": f"GPU-{i}", "memory_used_mb": 100.0 * self.calls,
                 "memory_total_mb": 1000.0, "utilization_gpu_pct": 50 + i, "power_w": 100.0 + self.calls,
                 "temperature_c": 40 + self.calls} for i in range(2)]


def test_sampler_writes_csv_and_summary(tmp_path):
    reader = Counter()
    with Sampler(reader, interval_s=0.05) as s:
        time.sleep(0.3)
    assert reader.calls >= 4  # at start, every interval, at stop
    rows = list(csv.DictReader(io.StringIO(s.csv_text())))
    assert tuple(rows[0]) == NVML_FIELDS and len(rows) == 2 * reader.calls
    summ = s.summary()
    assert summ["GPU-0"]["memory_used_mb_max"] == 100.0 * reader.calls
    assert summ["GPU-1"]["utilization_gpu_pct_mean"] == 51
    out = tmp_path / "generate.json"
    rec = write_telemetry(out, "generate t", (0.0, 1.0), [], ["n1/gpu0"], s, "NVML 2 GPU(s)", {})
    assert rec["nvml"]["csv"] == "generate.nvml.csv" and (tmp_path / "generate.nvml.csv").exists()
    assert json.loads(out.read_text())["nvml"]["summary"] == summ


def test_sampler_stops_sampling_when_the_reader_fails():
    def broken() -> list[dict]:
        raise RuntimeError("GPU fell off the bus")

    with Sampler(broken, interval_s=0.05) as s:
        time.sleep(0.1)
    assert s.rows == [] and s.read is None and "GPU fell off the bus" in s.stopped


def test_nvml_reader_answers_with_a_reason_or_a_reader():
    read, status = nvml_reader()
    assert status
    if read is None:  # this machine: no NVIDIA driver
        assert "NVML" in status or "nvidia-ml-py" in status
    else:
        assert {r["uuid"] for r in read()}


def test_utilisation_is_task_work_over_whole_job_slot_seconds():
    """Issue 25 item 3: the study's busy share is task work over slot time from the job's
    start to its end; warm-up, start-up, idle and failed time are beside it, never in it.
    The Parsl-window share (warm-up busy, start-up outside) is kept, named as such."""
    from pairflow.fleet.telemetry import honest_share

    spans = [{**span(0, 4.0, 6.0), "kind": "warm-up"}, span(0, 6.0, 14.0), span(1, 5.0, 9.0),
             {**span(1, 9.0, 10.0), "failure": "other"}]
    window = (4.0, 14.0)
    rec = {"label": "generate t", "window": {"start": window[0], "end": window[1]}, "nvml": {"status": "none"},
           "spans": spans, "slots": busy_share(spans, window),
           "job": honest_share(spans, (0.0, 15.0), ["n1/cpu0", "n1/cpu1"])}
    u = utilisation({"generate:t": rec})
    assert u["slot_s"] == 30.0 and u["work_s"] == 12.0 and u["warmup_s"] == 2.0 and u["failed_s"] == 1.0
    assert u["startup_s"] == 4.0 + 5.0  # job start to each slot's first span
    assert u["idle_s"] == pytest.approx(30.0 - 12.0 - 2.0 - 1.0 - 9.0)
    assert u["busy_share"] == pytest.approx(12.0 / 30.0)
    assert u["window_busy_share"] == pytest.approx(15.0 / 20.0)  # the flattering figure, kept by its name
    assert u["jobs"][0]["slots"]["n1/cpu0"]["share"] == pytest.approx(1.0)


def test_packed_workers_on_one_gpu_never_make_a_share_above_one() -> None:
    """Audit of issue 25, defect 1: two workers packed on one GPU share its slot, and two
    concurrent 10 s task spans there read busy_share 2.0. A slot's busy time is the union
    of its task spans ("the device had work"); the summed worker-seconds are kept beside
    it under their own name; warm-up and failed time stay out and are each counted once."""
    from pairflow.fleet.telemetry import honest_share

    gpu = [{**span(0, 0.0, 10.0, gpu="0")}, {**span(1, 0.0, 10.0, gpu="0")}]
    whole = honest_share(gpu, (0.0, 10.0), ["n1/gpu0"])
    assert whole["busy_share"] == pytest.approx(1.0) and whole["work_s"] == pytest.approx(10.0)
    assert whole["worker_work_s"] == pytest.approx(20.0) and whole["idle_s"] == 0.0
    assert busy_share(gpu, (0.0, 10.0), ["n1/gpu0"])["n1/gpu0"]["share"] == pytest.approx(1.0)

    spans = [{**span(0, 1.0, 3.0, gpu="0"), "kind": "warm-up"}, {**span(1, 1.0, 4.0, gpu="0"), "kind": "warm-up"},
             span(0, 3.0, 13.0, gpu="0"), span(1, 4.0, 14.0, gpu="0"),  # the device had work 3-14: 11 s
             {**span(1, 14.0, 16.0, gpu="0"), "failure": "other"}, {**span(0, 13.0, 15.0, gpu="0"), "failure": "retried"}]
    h = honest_share(spans, (0.0, 20.0), ["n1/gpu0"])
    assert h["work_s"] == pytest.approx(11.0) and h["worker_work_s"] == pytest.approx(20.0)
    assert h["warmup_s"] == pytest.approx(2.0)  # 1-3 (3-4 is work on the other worker)
    assert h["failed_s"] == pytest.approx(2.0) and h["retried_s"] == pytest.approx(0.0)  # 14-16; 13-14 was work
    assert h["startup_s"] == pytest.approx(1.0) and h["idle_s"] == pytest.approx(4.0)
    assert sum(h[k] for k in ("work_s", "warmup_s", "failed_s", "retried_s", "startup_s", "idle_s")) == \
        pytest.approx(h["slot_s"]) == 20.0
    assert h["busy_share"] == pytest.approx(11.0 / 20.0)
    window = busy_share(spans, (0.0, 20.0))["n1/gpu0"]
    assert window["busy_s"] == pytest.approx(15.0) and window["tasks"] == 4  # 1-16, warm-up counted busy


def test_job_window_is_the_slurm_allocation_or_this_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import time

    from pairflow.fleet.telemetry import job_window, process_start

    start = process_start()
    assert 0 < time.time() - start < 3600  # this test process started within the hour
    assert job_window(None, 99.0)[1:] == (99.0, "job process start (/proc/self/stat)")
    slurm = (1700000000.0, "Slurm allocation start (scontrol show job: StartTime)")
    assert job_window(slurm, 1700000100.0) == (1700000000.0, 1700000100.0, slurm[1])
    why = "no allocation start from Slurm (no SLURM_JOB_START_TIME; scontrol not found)"
    assert job_window((None, why), 99.0) == (start, 99.0, f"job process start (/proc/self/stat): {why}")


def test_a_stage_closes_the_job_after_its_manifests(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Audit of issue 25, defect 4: the manifests' read-back after the fan-out is the
    job's time too: ``close_job`` moves the end and recomputes the accounting, and never
    touches a record an earlier job wrote."""
    from pairflow.fleet.telemetry import close_job

    out = tmp_path / "tel.json"
    spans = [span(0, 2.0, 6.0)]
    write_telemetry(out, "score t", (1.0, 6.0), spans, ["n1/cpu0"], Sampler(None, 1.0), "none", {},
                    (0.0, 8.0, "job process start (/proc/self/stat)"))
    assert close_job(out, since=2.0, end=20.0) is None  # its window opened before this job: not this job's
    assert json.loads(out.read_text())["job"]["end"] == 8.0
    rec = close_job(out, since=1.0, end=20.0)
    assert rec is not None and json.loads(out.read_text()) == rec
    assert rec["job"]["end"] == 20.0 and rec["job"]["end_is"] == "after the job's manifests were read back and written"
    assert rec["job"]["busy_share"] == pytest.approx(4.0 / 20.0) and rec["job"]["idle_s"] == pytest.approx(14.0)
    assert rec["job"]["start_is"] == "job process start (/proc/self/stat)"
    assert close_job(tmp_path / "none.json", since=0.0) is None and close_job(None, since=0.0) is None


def test_progress_line_gives_done_rate_and_time_left() -> None:
    from pairflow.fleet.telemetry import progress_line

    assert progress_line("generate smoke", 3, 12, 6.0) == "generate smoke: 3/12 done (25%), 30.0/min, ~18s left"
    assert progress_line("generate smoke", 1, 400, 30.0) == "generate smoke: 1/400 done (0%), 2.0/min, ~3h19m left"
    assert progress_line("timed pass", 0, 5, 0.0) == "timed pass: 0/5 done (0%), 0.0/min, time left unknown"


def test_rate_counts_work_only_not_warm_up() -> None:
    """Regression (issue 26): the first ETA read '~11295s left' because the rate's clock
    started before 5 min 43 s of warm-up; it now starts with the first task's work."""
    from pairflow.fleet.telemetry import progress_line, work_elapsed

    job_start, warm_end = 1000.0, 1343.0
    spans = [{"kind": "warm-up", "started": 1001.0, "finished": warm_end},
             {"started": warm_end + 1, "finished": warm_end + 11}, {"started": warm_end + 2, "finished": warm_end + 12}]
    elapsed = work_elapsed(spans, warm_end + 12, job_start)
    assert elapsed == 11.0
    assert progress_line("generate smoke", 2, 56, elapsed).endswith("~4m57s left")
    assert work_elapsed([], 1010.0, job_start) == 10.0


def test_phase_watch_logs_each_workers_start_up_phase_and_ready(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    from pairflow.fleet.telemetry import PhaseWatch, write_phase

    folder = tmp_path / "phases"
    with caplog.at_level(logging.INFO, logger="pairflow.fleet.telemetry"):
        with PhaseWatch(folder, "generate and score smoke", 1, period_s=0.05) as watch:
            assert "starting 1 worker(s)" in caplog.text  # the job's first second already says something
            write_phase(folder, "importing torch and diffusers")
            assert not watch.poll()
            write_phase(folder, "ready", import_s=3.25, load_s=1.5)
            assert watch.poll()
    text = caplog.text
    assert "importing torch and diffusers" in text and "ready (import_s 3.2s, load_s 1.5s)" in text
    assert "workers ready 1/1" in text


def test_phase_memory_resets_the_host_peak_per_phase() -> None:
    """Issue 25 item 5: a phase's peak RSS is its own, not the process's: a 200 MiB
    allocation in one phase shows in that phase and not in the next."""
    import mmap

    from pairflow.fleet.telemetry import PhaseMemory

    mem = PhaseMemory(cuda=False)
    mem.start("big")
    block = mmap.mmap(-1, 200 * 2**20)  # fresh pages (a heap allocation may reuse resident free memory)
    for i in range(0, len(block), 4096):
        block[i] = 1  # touched: resident
    mem.stop("big")
    block.close()
    mem.start("small")
    mem.stop("small")
    peaks = mem.asdict()
    assert peaks["big"]["host_scope"] == peaks["small"]["host_scope"] == "phase"
    assert peaks["big"]["peak_rss_mb"] - peaks["small"]["peak_rss_mb"] > 150
    assert peaks["big"]["peak_device_mb"] is None  # no CUDA in this phase tracker


def test_gpu_idle_is_never_reported_as_throttling_and_mig_uuids_are_tried() -> None:
    from pairflow.fleet.telemetry import ThrottleWatch, throttled_during, uuid_names

    assert throttled_during([{"throttle_reasons": ["gpu_idle"]}, {"throttle_reasons": ["sw_power_cap", "gpu_idle"]},
                             {"unavailable": "no NVML"}]) == ["sw_power_cap"]
    assert uuid_names("1b2c") == ["1b2c", "GPU-1b2c", "MIG-1b2c"]
    assert uuid_names("MIG-1b2c") == ["MIG-1b2c", "GPU-1b2c"]
    with ThrottleWatch(None) as w:  # no device: a no-op that says why
        pass
    assert w.reasons == [] and w.status.startswith("unavailable")


def test_a_timed_run_above_the_temperature_limit_or_throttled_is_flagged():
    """Issue 28 item 5: a timed run taken hot (above timing/max_temperature_c) or while the
    GPU throttled is flagged; nothing watched (CPU, no NVML) is not a clean bill of health."""
    from pairflow.fleet.telemetry import thermal_flag

    watched = {"status": "watched", "reasons": [], "polls": 20}
    assert thermal_flag({**watched, "max_temperature_c": 70.0}, 78.0)["flagged"] is False
    hot = thermal_flag({**watched, "max_temperature_c": 83.0}, 78.0)
    assert hot["flagged"] is True and hot["why"] == "83 C > 78 C"
    slow = thermal_flag({**watched, "max_temperature_c": 60.0, "reasons": ["sw_thermal_slowdown"]}, 78.0)
    assert slow["flagged"] is True and "sw_thermal_slowdown" in slow["why"]
    assert thermal_flag(None, 78.0)["flagged"] is None
    assert thermal_flag({"status": "unavailable: no NVML"}, 78.0)["flagged"] is None


def test_the_nvml_summary_counts_the_share_of_samples_a_gpu_was_active():
    s = Sampler(None, 1.0)
    base = {**{k: 0 for k in NVML_FIELDS}, "tensor_active_pct": None}  # a GPU without GPM
    s.rows = [{**base, "uuid": "GPU-a", "utilization_gpu_pct": u} for u in (0, 4, 5, 90)]
    summary = s.summary()["GPU-a"]
    assert summary["active_share"] == 0.5 and summary["tensor_active"].startswith("unavailable")
    s.rows = [{**base, "uuid": "GPU-b", "utilization_gpu_pct": 50, "tensor_active_pct": t} for t in (None, 20.0, 40.0)]
    assert s.summary()["GPU-b"]["tensor_active"] == 30.0  # the first read has no interval yet


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: NVML GPM tensor activity")
def test_nvml_samples_carry_tensor_activity_or_say_why_not():
    read, status = nvml_reader()
    assert read is not None, status
    rows = read() + read()
    assert all("tensor_active_pct" in r for r in rows)
    values = [r["tensor_active_pct"] for r in rows]
    assert all(v is None or 0.0 <= v <= 100.0 for v in values)


# --- NVML through a fake pynvml (tests/fake_pynvml.py): MIG, per-field failures, throttle watch ---------------


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Install a fake pynvml made by ``fake_pynvml.make(**options)``; returns the installer."""
    import functools

    import fake_pynvml

    return functools.partial(fake_pynvml.install, monkeypatch)


def test_a_mig_gpu_is_sampled_per_mig_device_keyed_by_its_mig_uuid(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    """Audit r6 item 1: under MIG, NVML has no utilisation; the reader used to raise on it
    and the sampler stopped with 0 rows while status said 'NVML 1 GPU(s)'. Now each MIG
    device present is a row keyed by its MIG UUID (the slot's), with its own memory and
    the GPU's power and temperature; utilisation is None and the status says why."""
    import fake_pynvml

    from pairflow.fleet.telemetry import gpu_state, uuid_names

    fake_nvml(mig=True)
    read, status = nvml_reader()
    assert read is not None and "2 MIG device(s)" in status and "utilisation unavailable under MIG" in status
    with Sampler(read, interval_s=0.05) as s:
        time.sleep(0.12)
    assert s.rows and not s.stopped
    assert {r["uuid"] for r in s.rows} == set(fake_pynvml.MIG_UUIDS.values())  # empty slot 1 skipped
    row = s.rows[0]
    assert row["utilization_gpu_pct"] is None and row["memory_total_mb"] == 18 * 1024 and row["power_w"] == 250.0
    summ = s.summary()[fake_pynvml.MIG_UUIDS[0]]
    assert summ["samples"] >= 2 and summ["memory_used_mb_max"] == 1024.0 and summ["temperature_c_max"] == 55.0
    assert summ["utilization_gpu_pct_mean"] is None and summ["active_share"] is None
    assert summ["tensor_active"].startswith("unavailable (not read for a MIG device")
    # torch names a MIG slot by its bare UUID: the slot's spellings include the row's key
    bare = fake_pynvml.MIG_UUIDS[2].removeprefix("MIG-")
    assert fake_pynvml.MIG_UUIDS[2] in uuid_names(bare)
    state = gpu_state(bare, 1)
    assert state["mig"] is True and state["memory_used_mb"] == 1024.0 and state["sm_clock_mhz"] == 1980


def test_one_unsupported_nvml_field_is_none_and_the_rest_is_kept(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    """Audit r6 items 1 and 7: power, the max clock or the process list unsupported used to
    blank the whole sample (the sampler stopped) or the whole gpu_state."""
    import fake_pynvml

    from pairflow.fleet.telemetry import gpu_state

    fake_nvml(unsupported=frozenset({"GetPowerUsage", "GetMaxClockInfo", "GetComputeRunningProcesses"}))
    read, status = nvml_reader()
    assert read is not None and status == "NVML 1 GPU(s)"
    rows = read()
    assert rows[0]["power_w"] is None and rows[0]["utilization_gpu_pct"] == 40 and rows[0]["uuid"] == fake_pynvml.GPU_UUID
    s = Sampler(read, 1.0)
    s.rows = rows + read()
    summ = s.summary()[fake_pynvml.GPU_UUID]
    assert summ["power_w_mean"] is None and summ["utilization_gpu_pct_mean"] == 40.0 and summ["active_share"] == 1.0
    assert summ["tensor_active"] == "unavailable (this GPU has no GPM (NVML GPU Performance Monitoring: Hopper and later))"
    state = gpu_state(fake_pynvml.GPU_UUID, 1)
    assert "unavailable" not in state and state["sm_clock_mhz"] == 1980 and state["temperature_c"] == 55
    assert state["unsupported"] == ["max_sm_clock_mhz", "other_processes", "power_w"]
    assert "power_w" not in state and state["throttle_reasons"] == ["gpu_idle"]
    # an error that is not 'cannot answer' (a lost GPU) is still an error: sampling stops and says why
    lost = fake_nvml()

    def gone(h):  # type: ignore[no-untyped-def]
        raise fake_pynvml.NVMLError(fake_pynvml.GPU_IS_LOST)

    read, _ = nvml_reader()
    lost.nvmlDeviceGetMemoryInfo = gone
    with Sampler(read, interval_s=10.0) as s:
        pass
    assert s.rows == [] and "GPU is lost" in s.stopped


def test_a_failed_gpm_metric_is_not_a_zero_reading(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    """Audit r6 item 13: NVML fills each metric's nvmlReturn; a failed one read as 0 %."""
    import fake_pynvml

    fake_nvml(gpm_return=3)
    read, _ = nvml_reader()
    s = Sampler(read, 1.0)
    s.rows = read() + read() + read()
    assert all(r["tensor_active_pct"] is None for r in s.rows)
    assert s.summary()[fake_pynvml.GPU_UUID]["tensor_active"] == "unavailable (NVML GPM tensor metric failed (nvmlReturn 3))"
    fake_nvml(gpm_return=0)
    read, _ = nvml_reader()
    assert [r["tensor_active_pct"] for r in read() + read()] == [None, 0.0]  # a real 0 % after the first interval


def test_throttle_watch_prefers_clock_event_reasons_and_says_not_watched_when_no_poll_answers(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    """Audit r6 item 6: a reasons call that failed at every poll left polls 0, status
    'watched' and the report 'none'. Now: the clock-event call first, the deprecated
    throttle call where the driver or binding lacks it, and 0 polls is 'not watched'."""
    import fake_pynvml

    from pairflow.fleet.telemetry import ThrottleWatch, thermal_flag

    fake_nvml(absent=frozenset({"GetCurrentClocksEventReasons"}), reasons=0x1 | 0x20)
    with ThrottleWatch(fake_pynvml.GPU_UUID, interval_s=0.01) as w:
        time.sleep(0.05)
    assert w.status == "watched" and w.polls >= 2 and w.reasons == ["sw_thermal_slowdown"]
    assert w.max_temperature_c == 55.0
    fake_nvml(unsupported=frozenset({"GetCurrentClocksEventReasons", "GetCurrentClocksThrottleReasons"}))
    with ThrottleWatch(fake_pynvml.GPU_UUID, interval_s=0.01) as w:
        time.sleep(0.03)
    assert w.polls == 0 and w.status.startswith("not watched") and w.reasons == []
    flag = thermal_flag({"status": w.status, "polls": w.polls, "reasons": w.reasons}, 78.0)
    assert flag["flagged"] is None and flag["why"].startswith("not watched")
    assert thermal_flag({"status": "watched", "polls": 0, "reasons": []}, 78.0)["flagged"] is None


def test_an_observer_s_own_cuda_context_is_not_another_process_on_the_device(fake_nvml, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """benchmarks/gpu_check.py reads the GPU's properties (a CUDA context of its own) and
    then watches the study: it names itself in PAIRFLOW_OBSERVER_PIDS, so a timed run does
    not report it as contention."""
    import fake_pynvml

    from pairflow.fleet.telemetry import OBSERVERS_VAR, gpu_state

    fake_nvml()
    assert [p["pid"] for p in gpu_state(fake_pynvml.GPU_UUID, 1)["other_processes"]] == [4242]
    monkeypatch.setenv(OBSERVERS_VAR, "17, 4242,x")
    assert gpu_state(fake_pynvml.GPU_UUID, 1)["other_processes"] == []

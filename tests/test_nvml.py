"""nvml: one NVML initialisation per process shared by telemetry and envinfo; a field the
device cannot answer is None, any other NVML error is raised (a fake pynvml: tests/fake_pynvml.py)."""

from __future__ import annotations

import fake_pynvml
import pytest

from pairflow import envinfo, nvml
from pairflow.fleet.telemetry import ThrottleWatch, gpu_state, nvml_reader


def test_nvml_is_initialised_once_per_process_for_telemetry_and_envinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit r6 item 11: envinfo ran its own nvmlInit/nvmlShutdown beside telemetry's."""
    fake = fake_pynvml.install(monkeypatch)
    assert envinfo._driver() == "580.65.06"
    nvml_reader()
    gpu_state(fake_pynvml.GPU_UUID, 1)
    with ThrottleWatch(fake_pynvml.GPU_UUID):
        pass
    assert envinfo._driver() == "580.65.06"
    assert fake.calls == {"init": 1, "shutdown": 0}
    nvml.shutdown()
    assert fake.calls == {"init": 1, "shutdown": 1} and nvml.loaded() is None


def test_a_field_the_device_cannot_answer_is_none_and_other_errors_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml.install(monkeypatch, unsupported=frozenset({"GetPowerUsage"}),
                               absent=frozenset({"GetCurrentClocksEventReasons"}))
    pynvml, why = nvml.start()
    assert pynvml is fake and why == ""
    assert nvml.optional(pynvml, "nvmlDeviceGetPowerUsage", "gpu0") is None  # NOT_SUPPORTED
    assert nvml.optional(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", "gpu0") is None  # not in this binding
    assert nvml.optional(pynvml, "nvmlDeviceGetTemperature", "gpu0", 0) == 55

    def lost(h: str) -> None:
        raise fake_pynvml.NVMLError(fake_pynvml.GPU_IS_LOST)

    fake.nvmlDeviceGetMemoryInfo = lost  # type: ignore[attr-defined]
    with pytest.raises(fake_pynvml.NVMLError):
        nvml.optional(pynvml, "nvmlDeviceGetMemoryInfo", "gpu0")


def test_without_a_driver_the_reason_is_returned_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml.install(monkeypatch)

    def no_driver() -> None:
        raise fake_pynvml.NVMLError(9)

    fake.nvmlInit = no_driver  # type: ignore[attr-defined]
    assert nvml.start() == (None, "NVML unavailable: 9")
    assert nvml_reader() == (None, "NVML unavailable: 9")
    assert envinfo._driver() is None
    assert gpu_state(fake_pynvml.GPU_UUID, 1) == {"unavailable": "NVML unavailable: 9"}

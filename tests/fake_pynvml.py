"""A fake ``pynvml`` (nvidia-ml-py) for CPU tests of the NVML readers: one GPU, optionally
MIG-enabled with MIG slots 0 and 2 present (slot 1 empty: NVML says NOT_FOUND), and any
field made unsupported. ``install(monkeypatch, **options)`` puts it under
``sys.modules["pynvml"]`` and gives ``pairflow.nvml`` a fresh state for the test."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from pairflow import nvml

NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, FUNCTION_NOT_FOUND, GPU_IS_LOST = 3, 4, 6, 13, 15
GPU, GPU_UUID = "gpu0", "GPU-11111111-2222-3333-4444-555555555555"
MIG_UUIDS = {0: "MIG-aaaaaaaa-0000-0000-0000-000000000000", 2: "MIG-cccccccc-0000-0000-0000-000000000002"}


class NVMLError(Exception):
    """pynvml's error: ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NOT_SUPPORTED: "Not Supported", NOT_FOUND: "Not Found", FUNCTION_NOT_FOUND: "Function Not Found",
                NO_PERMISSION: "Insufficient Permissions", GPU_IS_LOST: "GPU is lost"}.get(self.value, str(self.value))


def make(*, mig: bool = False, unsupported: frozenset[str] = frozenset(), absent: frozenset[str] = frozenset(),
         reasons: int = 0x1, gpm_return: int | None = None) -> types.ModuleType:
    """The fake module. ``unsupported``: function names (without ``nvmlDevice``) that raise
    NOT_SUPPORTED; ``absent``: function names the binding lacks; ``reasons``: the clock-event
    bits; ``gpm_return``: GPM's per-metric ``nvmlReturn`` (None: no GPM on this GPU)."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.calls = {"init": 0, "shutdown": 0}  # type: ignore[attr-defined]
    consts = {"NVML_TEMPERATURE_GPU": 0, "NVML_CLOCK_SM": 1, "NVML_CLOCK_MEM": 2, "NVML_DEVICE_MIG_ENABLE": 1,
              "NVML_GPM_METRICS_GET_VERSION": 1, "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5}
    for k, v in consts.items():
        setattr(m, k, v)

    def init() -> None:
        m.calls["init"] += 1  # type: ignore[attr-defined]

    def shutdown() -> None:
        m.calls["shutdown"] += 1  # type: ignore[attr-defined]

    def util(h: str) -> Any:
        if mig:  # a MIG-enabled GPU, and each MIG device, has no utilisation in NVML
            raise NVMLError(NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=40, memory=10)

    def mig_handle(h: str, j: int) -> str:
        if j not in MIG_UUIDS:
            raise NVMLError(NOT_FOUND)
        return f"mig{j}"

    def by_uuid(u: bytes) -> str:
        handles = {GPU_UUID: GPU, **{v: f"mig{j}" for j, v in MIG_UUIDS.items()}}
        if u.decode() not in handles:
            raise NVMLError(NOT_FOUND)
        return handles[u.decode()]

    class MetricsGet:
        def __init__(self) -> None:
            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=gpm_return or 0, value=0.0)]

    funcs: dict[str, Any] = {
        "Init": init, "Shutdown": shutdown,
        "SystemGetDriverVersion": lambda: "580.65.06",
        "DeviceGetCount": lambda: 1,
        "DeviceGetHandleByIndex": lambda i: GPU,
        "DeviceGetHandleByUUID": by_uuid,
        "DeviceGetUUID": lambda h: GPU_UUID if h == GPU else MIG_UUIDS[int(h[3:])],
        "DeviceGetMigMode": lambda h: [int(mig), int(mig)],
        "DeviceGetMaxMigDeviceCount": lambda h: 3,
        "DeviceGetMigDeviceHandleByIndex": mig_handle,
        "DeviceIsMigDeviceHandle": lambda h: h.startswith("mig"),
        "DeviceGetDeviceHandleFromMigDeviceHandle": lambda h: GPU,
        "DeviceGetMemoryInfo": lambda h: types.SimpleNamespace(used=(2 if h == GPU else 1) * 2**30,
                                                                total=(80 if h == GPU else 18) * 2**30),
        "DeviceGetUtilizationRates": util,
        "DeviceGetPowerUsage": lambda h: 250_000,
        "DeviceGetTemperature": lambda h, t: 55,
        "DeviceGetClockInfo": lambda h, c: 1980 if c == 1 else 2619,
        "DeviceGetMaxClockInfo": lambda h, c: 1980,
        "DeviceGetCurrentClocksEventReasons": lambda h: reasons,
        "DeviceGetCurrentClocksThrottleReasons": lambda h: reasons,
        "DeviceGetComputeRunningProcesses": lambda h: [types.SimpleNamespace(pid=4242, usedGpuMemory=2**30)],
        "GpmQueryDeviceSupport": lambda h: types.SimpleNamespace(isSupportedDevice=int(gpm_return is not None)),
        "GpmSampleAlloc": lambda: object(),
        "GpmSampleGet": lambda h, s: s,
        "GpmSampleFree": lambda s: None,
        "GpmMetricsGet": lambda get: get,
    }
    for name, fn in funcs.items():
        if name.removeprefix("Device") in absent or name in absent:
            continue
        if name.removeprefix("Device") in unsupported or name in unsupported:
            def fn(*a: Any, **k: Any) -> Any:
                raise NVMLError(NOT_SUPPORTED)
        setattr(m, f"nvml{name}", fn)
    m.c_nvmlGpmMetricsGet_t = MetricsGet  # type: ignore[attr-defined]
    return m


def install(monkeypatch: pytest.MonkeyPatch, **options: Any) -> types.ModuleType:
    """``make(**options)`` as ``pynvml`` for this test, with its own NVML state (no exit hook)."""
    module = make(**options)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(nvml, "_STATE", {"at_exit": True})
    return module

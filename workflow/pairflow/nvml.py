"""The one seam to NVIDIA's driver: NVML through nvidia-ml-py (``pynvml``).

``module()`` initialises NVML once per process and registers one ``nvmlShutdown`` at
exit (each ``nvmlInit`` takes a reference the driver keeps until a matching shutdown);
telemetry (samples, GPU state, throttle watch) and envinfo (the driver version) share it.
``optional()`` reads one field: a call the device, driver or binding cannot answer (not
supported, e.g. utilisation under MIG; no permission; a function the driver or
nvidia-ml-py lacks) gives None, so one missing field never blanks the others.

Imports without pynvml: it is imported on first use (optional, absent without NVIDIA's
library); tests put a fake module under ``sys.modules["pynvml"]`` and call ``reset()``.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, FUNCTION_NOT_FOUND, DEPRECATED = 3, 4, 6, 13, 26
"""NVML return codes (``NVML_ERROR_*``) the readers tell apart."""
UNANSWERABLE = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, DEPRECATED})
"""Codes that say this device, driver or user cannot answer the call: the field is absent,
the device is fine."""

_STATE: dict[str, Any] = {}
_LOCK = threading.Lock()


def module() -> Any:
    """The ``pynvml`` module, initialised once per process (thread-safe) and shut down at
    exit. Raises ImportError without nvidia-ml-py and ``pynvml.NVMLError`` without a
    driver (the next call tries again)."""
    with _LOCK:
        if "module" not in _STATE:
            # lazy: optional, absent on machines without NVIDIA's library
            import pynvml

            pynvml.nvmlInit()
            _STATE["module"] = pynvml
            if not _STATE.get("at_exit"):
                atexit.register(shutdown)
                _STATE["at_exit"] = True
        return _STATE["module"]


NOT_INSTALLED = "nvidia-ml-py is not installed"


def start() -> tuple[Any | None, str]:
    """(``module()``, "") or (None, why not): ``NOT_INSTALLED``, or ``NVML unavailable:
    <error>`` where the library or driver is missing (recorded by the callers, never raised)."""
    try:
        # lazy: optional, absent on machines without NVIDIA's library
        import pynvml
    except ImportError:
        return None, NOT_INSTALLED
    try:
        return module(), ""
    except pynvml.NVMLError as e:
        return None, f"NVML unavailable: {e}"


def loaded() -> Any | None:
    """The initialised ``pynvml`` module, or None before ``module()`` succeeded."""
    return _STATE.get("module")


def shutdown() -> None:
    """Release this process's NVML reference (at exit; a later ``module()`` initialises again)."""
    with _LOCK:
        pynvml = _STATE.pop("module", None)
    if pynvml is not None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def reset() -> None:
    """Forget the module without shutting it down (tests that swap in a fake pynvml)."""
    with _LOCK:
        _STATE.pop("module", None)


def code(error: BaseException) -> int | None:
    """The NVML return code of ``error`` (``NVMLError.value``), None for other errors."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def optional(nvml: Any, name: str, *args: Any) -> Any:
    """``nvml.<name>(*args)``, or None where this device, driver or nvidia-ml-py cannot
    answer it (``UNANSWERABLE`` codes, or a binding this nvidia-ml-py lacks). Other NVML
    errors (a lost GPU, an uninitialised library) are raised."""
    call = getattr(nvml, name, None)
    if call is None:
        return None
    try:
        return call(*args)
    except nvml.NVMLError as e:
        if code(e) in UNANSWERABLE:
            return None
        raise

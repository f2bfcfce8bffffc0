"""Kind ``overrides``: another number of steps, guidance scale or scheduler (a few-step
arm, a guidance sweep, a scheduler swap) on the same model.

Config: ``steps``, ``guidance``, ``scheduler: {class, params}``. ``steps`` and ``guidance``
change the arm's effective generation settings; the scheduler is built from the model's
scheduler config with the arm's params, swapped in for one generation and put back in
``finally``. Checked before any model loads: the scheduler class exists in the installed
diffusers and takes the params.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from ...errors import ConfigError
from ...specs import ArmSpec, GenerationSpec, ModelSpec
from ..base import ArmKind, ParseContext


def scheduler_class(arm: ArmSpec) -> Any:
    """The diffusers scheduler class an arm names. Raises ConfigError naming the arm, the
    class and the scheduler classes the installed diffusers has."""
    import diffusers  # heavy: only checks and workers import it, never planning
    from diffusers import SchedulerMixin

    cls = getattr(diffusers, arm.scheduler_class or "", None)
    if not (isinstance(cls, type) and issubclass(cls, SchedulerMixin)):
        known = sorted(n for n in dir(diffusers) if n.endswith("Scheduler") and isinstance(getattr(diffusers, n), type)
                       and issubclass(getattr(diffusers, n), SchedulerMixin))
        hint = difflib.get_close_matches(arm.scheduler_class or "", known, n=1)
        raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/scheduler/class' is {arm.scheduler_class!r}, which "
                          f"is not a scheduler of diffusers {diffusers.__version__}"
                          + (f"; did you mean {hint[0]!r}?" if hint else ".") + f" Schedulers: {known}")
    allowed = sorted(k for k in inspect.signature(cls.__init__).parameters if k != "self")
    for key in arm.scheduler_params:
        if key not in allowed:
            hint = difflib.get_close_matches(key, allowed, n=1)
            raise ConfigError(f"arm {arm.name!r}: key 'arms/{arm.name}/scheduler/params/{key}': {cls.__name__} has no "
                              f"such parameter" + (f"; did you mean {hint[0]!r}?" if hint else ".")
                              + f" Allowed: {allowed}")
    return cls


class Overrides(ArmKind):
    name = "overrides"
    rank = 20
    keys = ("steps", "guidance", "scheduler")
    attrs: ClassVar[Mapping[str, Any]] = {"scheduler": "scheduler_class"}
    docs = "another number of denoising steps, guidance scale or scheduler"
    order = 0
    schema: ClassVar[Mapping[str, Any]] = {
        "steps": {"type": "integer", "minimum": 1, "maximum": 1000,
                  "description": "denoising steps of this arm (a few-step arm); unset: generation/steps"},
        "guidance": {"type": "number", "minimum": 0,
                     "description": "guidance scale of this arm; unset: generation/guidance"},
        "scheduler": {
            "type": "object", "additionalProperties": False, "required": ["class"],
            "description": "another scheduler, built from the model's scheduler config with these params",
            "properties": {
                "class": {"type": "string", "description": "a diffusers scheduler class (e.g. "
                                                           "FlowMatchEulerDiscreteScheduler)"},
                "params": {"type": "object", "default": {}, "description": "scheduler config keys to override"}}}}
    record_schema: ClassVar[Mapping[str, Any]] = {
        "steps": {"type": "integer", "minimum": 1}, "guidance": {"type": "number"},
        "scheduler_class": {"type": "string"}, "scheduler_params": {"type": "object"}}

    def parse(self, raw: Mapping[str, Any], ctx: ParseContext) -> dict[str, Any]:
        sched = raw.get("scheduler") or {}
        return {"steps": raw.get("steps"), "guidance": raw.get("guidance"), "scheduler_class": sched.get("class"),
                "scheduler_params": dict(sched.get("params", {}))}

    def fields(self, arm: ArmSpec) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if arm.steps is not None:
            out["steps"] = arm.steps
        if arm.guidance is not None:
            out["guidance"] = arm.guidance
        if arm.scheduler_class is not None:
            out["scheduler_class"] = arm.scheduler_class
            out["scheduler_params"] = arm.scheduler_params
        return out

    def check(self, arm: ArmSpec, model: ModelSpec, device: str) -> None:
        if arm.scheduler_class is not None:
            scheduler_class(arm)

    def effective(self, arm: ArmSpec, gen: GenerationSpec) -> GenerationSpec:
        return dataclasses.replace(gen, steps=arm.steps if arm.steps is not None else gen.steps,
                                   guidance=arm.guidance if arm.guidance is not None else gen.guidance)

    @contextlib.contextmanager
    def apply(self, arm: ArmSpec, pipe: Any, device: str) -> Iterator[None]:
        scheduler = pipe.scheduler
        try:
            if arm.scheduler_class is not None:
                pipe.scheduler = scheduler_class(arm).from_config(scheduler.config, **arm.scheduler_params)
            yield
        finally:
            pipe.scheduler = scheduler


KIND = Overrides()

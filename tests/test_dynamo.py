"""The fixed cost of a worker: ``torch._dynamo`` stays unloaded unless an arm compiles
(``pairflow.arms.dynamo``), checked in a fresh process as a generation worker starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKFLOW = Path(__file__).resolve().parents[1] / "workflow"

WORKER = r"""
import json, sys
from pathlib import Path

import pytest
import pairflow.arms  # first, as generation.generate imports it
from pairflow.arms.dynamo import materialised
from pairflow.fleet.preload import MODULES
from pairflow.stages.jobs import timed_imports
from pairflow.generation import generate as g

timed_imports(MODULES)
after_imports = materialised()
g.index_imports(Path(sys.argv[1]))
after_pipeline_imports = materialised()
from diffusers import DiffusionPipeline
DiffusionPipeline.from_pretrained(sys.argv[1])
after_load = materialised()
import torch
f = torch.compile(lambda x: x * 2)
after_wrapping = materialised()
out = {"imports": after_imports, "pipeline_imports": after_pipeline_imports, "load": after_load,
       "compile_wrapped": after_wrapping}
if len(sys.argv) > 2:
    out["compiled"] = f(torch.ones(2)).tolist()
    out["after_compile"] = materialised()
print(json.dumps(out))
"""


def _run(model: Path, *extra: str, env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", WORKER, str(model), *extra], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(WORKFLOW), **(env or {})}, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_generation_worker_never_loads_dynamo(tiny_model: Path) -> None:
    """A non-compiling arm's worker: its imports (the fork server's, the pipeline's
    modules) and the model's load leave dynamo unloaded; wrapping a function in
    torch.compile does too, until its first call."""
    got = _run(tiny_model)
    assert got == {"imports": False, "pipeline_imports": False, "load": False, "compile_wrapped": False}


@pytest.mark.slow
def test_compiling_loads_dynamo_and_works(tiny_model: Path) -> None:
    """A compiled function's first call loads dynamo and compiles as without the guard;
    PAIRFLOW_DEFER_DYNAMO=0 turns the guard off (dynamo loads with diffusers)."""
    got = _run(tiny_model, "compile")
    assert got["compiled"] == [2.0, 2.0] and got["after_compile"] is True
    assert _run(tiny_model, env={"PAIRFLOW_DEFER_DYNAMO": "0"})["imports"] is True

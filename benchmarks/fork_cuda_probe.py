"""On a GPU machine: can a worker forked from PairFlow's fork server use CUDA?

``fleet.worker_start: auto`` spawns workers on GPU jobs because a process forked after
CUDA was initialised cannot use CUDA, and the fork server's imports (torch, diffusers,
pyiqa) reach CUDA on a GPU node unless ``preload.gpus_hidden`` keeps them from it. This
starts a multiprocessing fork server that preloads ``pairflow.fleet.preload`` as a pool's does
(``PAIRFLOW_PRELOAD=1``, the tiny model's folder in ``PAIRFLOW_PRELOAD_MODEL`` so its
pipeline modules are imported too), forks one worker from it and, in that worker, puts
a tensor on the GPU, asks what diffusers and transformers think the device is and loads
the tiny model's pipeline onto it. Its
JSON (stdout, and ``--out``) says whether forkserver can become the default on GPU jobs.

    python benchmarks/fork_cuda_probe.py [--out FILE]      (gpu_check.sh runs it)
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any


def worker(queue: Any) -> None:
    out: dict[str, Any] = {"pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                           "preloaded": sorted(m for m in ("torch", "diffusers", "pyiqa") if m in sys.modules)}
    try:
        import torch

        out["cuda_available"] = torch.cuda.is_available()
        x = torch.arange(1024, device="cuda", dtype=torch.float32)
        out["sum_on_gpu"] = float(x.sum().item())
        out["device_name"] = torch.cuda.get_device_name(0)
        from diffusers.utils.torch_utils import get_device

        out["diffusers_device"] = get_device()
        from transformers.utils import is_torch_cuda_available

        out["transformers_cuda"] = bool(is_torch_cuda_available())
        from pairflow.generation.generate import load_pipeline
        from pairflow.plan.config import ModelSpec

        pipe = load_pipeline(ModelSpec("embedded-tiny", Path(os.environ["PAIRFLOW_PRELOAD_MODEL"])), "bfloat16", 1)
        out["pipeline_device"] = str(pipe.transformer.device)
        out["ok"] = (out["sum_on_gpu"] == 523776.0 and out["diffusers_device"] == "cuda" and out["transformers_cuda"]
                     and out["pipeline_device"].startswith("cuda"))
    except Exception as e:  # the answer is the error: report it, do not raise
        out["ok"], out["error"] = False, f"{type(e).__name__}: {e}"[:2000]
    queue.put(out)


def main() -> None:
    import tempfile

    from pairflow.generation.tinymodel import build_tiny_model

    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
    if out is not None:  # a hang or a kill still leaves an answer
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"ok": False, "error": "started; no answer from the forked worker yet"}) + "\n")
    # as a pool's fork server is started: the job warms up, and the model's pipeline modules are named
    os.environ["PAIRFLOW_PRELOAD"] = "1"
    os.environ["PAIRFLOW_PRELOAD_MODEL"] = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["pairflow.fleet.preload"])
    queue = ctx.Queue()
    started = time.time()
    proc = ctx.Process(target=worker, args=(queue,))
    proc.start()
    try:
        result = queue.get(timeout=45)  # gpu_check.sh allows the probe 60 s in all
    except Exception as e:
        result = {"ok": False, "error": f"no answer from the forked worker: {type(e).__name__}: {e}"}
    proc.join(10)
    result["seconds"] = round(time.time() - started, 1)
    text = json.dumps(result, sort_keys=True)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()

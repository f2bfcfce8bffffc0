"""The ``records`` section of ``benchmarks/run.py``. Records: sealing, schema checks, writing
and reading a generation record; manifests."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .common import (
    ROOT,
    median_time,
)


def _sample_record() -> dict[str, Any]:
    """A generation record of the default study's shape and size (about 5 KB), for a tree
    that has no study run: every field its schema requires, digests of the right form."""
    from pairflow.identity import digest_obj

    d = [digest_obj(i) for i in range(16)]
    gen = {"frames": 9, "height": 64, "width": 64, "steps": 6, "guidance": 5.0, "fps": 8, "dtype": "float32",
           "threads": 1, "negative_prompt": "", "max_text_tokens": None}
    return {
        "kind": "generation",
        "candidate": {"study": "tiny-default", "panel": "smoke", "prompt_id": "p01", "prompt_digest": d[0], "seed": 0,
                      "arm": "fbcache", "arm_digest": d[1], "model_digest": d[2], "candidate_id": d[3],
                      "stream_seed": 3675252085612072994, "prompt": "a red fox trotting through fresh snow at dawn"},
        "arm": {"name": "fbcache", "kinds": ["cache"], "cache_class": "FirstBlockCacheConfig",
                "cache_params": {"threshold": 1.2}, "digest": d[1]},
        "generation": gen, "effective_generation": dict(gen),
        "pipeline": {"class": "WanPipeline", "family": "wan", "transformer": "WanTransformer3DModel",
                     "max_text_tokens": 64},
        "compute": {"attention_computed": 48, "attention_skipped": 0, "blocks_computed": 24, "blocks_skipped": 24,
                    "counter": "torch.utils.flop_counter.FlopCounterMode", "generations": 1,
                    "latent_shape": [16, 3, 8, 8], "total_flops": 124043776, "transformer_calls": 12,
                    "transformer_flops": 20888064, "verifier_flops": 0, "work_flops": 20888064},
        "video": {"path": "videos/fbcache/p01-s0.mp4", "digest": d[4], "bytes": 28792, "frames": 9, "height": 64,
                  "width": 64, "fps": "8/1", "pix_fmt": "yuv420p", "raw_digest": d[5]},
        "frames": {"mean": 138.2, "std": 56.7, "flags": []},
        "timing": {"pass": "bulk", "import_s": 0.0, "load_s": 0.0, "generate_s": 1.27, "encode_s": 0.034,
                   "peak_rss_mb": 1159.0},
        "worker": {"host": "vm", "pid": 1, "rank": "1", "slot": "1", "device": "cpu", "threads": 1,
                   "model_loads": {"resources/tiny-wan": 1}, "warm_up": {"import_s": 2.9, "load_s": 3.8}},
        "code": {"commit": "0" * 40, "dirty": False},
        "environment": {"packages": {f"package{i}": "1.0" for i in range(13)}, "python": "3.11.7"},
        "model": {"kind": "embedded-tiny", "id": "tiny-wan", "revision": None,
                  "weights": {f"part{i}/model.safetensors": d[6 + i] for i in range(10)}},
        "encoder": {"recipe": {"argv": ["-f", "rawvideo", "-pix_fmt", "rgb24"] * 12, "filter_graph": "scale"},
                    "recipe_digest": d[6], "fingerprint": {"version": "ffmpeg version n9.0.2", "digest": d[7]}},
        "config_digest": d[8], "site": {"model_path": "resources/tiny-wan", "scratch": "results/scratch"},
    }


def bench_records(runs: int, quick: bool = False) -> dict[str, Any]:
    """Per-candidate cost of sealing, validating (the kind's JSON Schema) and writing a
    generation record, of reading and verifying it, and of a 62-record manifest; the
    schema check's own share is measured alone."""
    from pairflow.records.store import build_manifest, check_schema, read_record, write_record

    found = sorted((ROOT / "results" / "scratch").glob("panels/*/records/*/*.json"))
    sample = json.loads(found[0].read_text()) if found else _sample_record()
    tmp = Path(tempfile.mkdtemp())
    w = median_time(lambda: [write_record(tmp / f"r{i}.json", sample) for i in range(62)], runs) / 62
    r = median_time(lambda: [read_record(tmp / f"r{i}.json") for i in range(62)], runs) / 62
    sealed = read_record(tmp / "r0.json")
    v = median_time(lambda: [check_schema(sealed, "r.json", "read") for _ in range(62)], runs) / 62
    m = median_time(lambda: build_manifest("panel-generation", tmp, [tmp / f"r{i}.json" for i in range(62)]),
                    runs) / 62
    shutil.rmtree(tmp)
    return {"write_record_ms": w * 1e3, "read_verify_record_ms": r * 1e3, "schema_check_ms": v * 1e3,
            "manifest_ms_per_record": m * 1e3, "sample": "results/scratch record" if found else "synthetic"}

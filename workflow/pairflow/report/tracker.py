"""Optional logging of a finished study to an experiment tracker (``report/tracker``;
MLflow only). Off by default, and never a dependency: the ``mlflow`` package (``pip
install mlflow-skinny``) is imported only when the config asks for it.

One MLflow run per ``track`` job, in the experiment named after the study:

- metrics: per treatment arm, the headline numbers of ``stats.json`` as the export's
  summary rows give them (``<arm>/speedup``, ``<arm>/compute_ratio``, ``<arm>/<metric>``:
  the difference from control, or the treatment's mean for a fidelity metric), each with
  ``_ci_low`` and ``_ci_high``;
- verdicts, beside the metrics: per (arm, metric) cell with a verdict, the p of the test that
  decided it as the metric ``<arm>/<metric>_p_verdict`` (the p every report prints) and the
  words as the tag ``pairflow.verdict.<arm>.<metric>`` (``verdicts.verdict_text``: the
  word, that p, its test and family); the artifact ``verdicts.json`` holds every cell's
  code, phrase, p, test, family, text and its pairs identical to control (left out of a
  fidelity mean), as the export's summary rows give them;
- videos: ``videos/index.json`` lists every video of the study (panel, prompt, seed, arm,
  its path under scratch, its digest, whether it is identical to control, and where it
  was logged in the run), and the videos themselves are logged under ``videos/<panel>/``
  up to ``VIDEO_BYTES`` in all (whole pairs, in the study's candidate order; the index
  says which, the tag ``pairflow.videos`` how many). A video whose bytes no longer match
  its record is refused (IntegrityError), not logged;
- artifacts: the study table (``table.md``, ``table.html``), ``stats.json``, the study
  manifest and the gallery page;
- tags: the study manifest's root digest, the digests of ``stats.json`` and the gallery,
  and the code commit, so every number resolves to the sealed record it came from.

The study manifest is re-verified first: a table or stats file edited after it was sealed
is refused (IntegrityError), not logged.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..errors import ConfigError, IntegrityError
from ..identity import digest_file
from ..plan.config import StudySpec
from ..records.store import verify_manifest

PACKAGE = "mlflow"
INSTALL = "pip install mlflow-skinny"
VIDEO_BYTES = 256 * 2**20
"""The study videos logged to one run, at most (256 MiB; the index lists every video)."""


def require(study: StudySpec, source: str = "config") -> None:
    """ConfigError when ``report/tracker`` names a tracker whose package is not installed
    in this Python (checked where Snakemake plans, before any job starts)."""
    if study.report.tracker == "mlflow" and importlib.util.find_spec(PACKAGE) is None:
        raise ConfigError(f"{source}: key 'report/tracker' is 'mlflow', but the {PACKAGE} package is not installed "
                          f"for {sys.executable}; install it with `{INSTALL}` or set report/tracker: none")


def headline(stats_json: Path) -> dict[str, float]:
    """Metric name → value for every (arm, number) summary row of ``stats_json`` that has
    a value (a metric with no estimate, e.g. too few pairs, is left out)."""
    # lazy: export imports numpy (through candidates and the metric registry); planning
    # imports this module for ``require`` and must stay free of it.
    from .export import summary_rows

    out: dict[str, float] = {}
    for row in summary_rows(Path(stats_json)):
        for suffix, key in (("", "estimate"), ("_ci_low", "ci_low"), ("_ci_high", "ci_high")):
            if row.get(key) is not None:
                out[f"{row['arm']}/{row['metric']}{suffix}"] = float(row[key])
    return out


def verdict_rows(stats_json: Path) -> list[dict[str, Any]]:
    """Every (arm, metric) cell of ``stats_json`` with its verdict (code, phrase, the
    deciding test's p, test and family, the text every report prints) and its pairs,
    identical ones among them: the export's summary columns."""
    # lazy: export imports numpy; planning imports this module for ``require`` (see headline)
    from .export import summary_rows

    keys = ("arm", "metric", "kind", "verdict_code", "verdict", "p_verdict", "p_verdict_test", "p_verdict_family",
            "verdict_text", "n_prompts", "n_pairs", "n_identical_pairs")
    return [{k: row.get(k) for k in keys} for row in summary_rows(Path(stats_json)) if "kind" in row]


def video_index(study: StudySpec) -> list[dict[str, Any]]:
    """Every video with a generation record, in the study's candidate order: panel, prompt
    id, seed, arm, its path under scratch, its digest (``xxh3_128:<hex>``) and whether it
    is identical to control (``records.identical_to_control``; empty for control)."""
    # lazy: export imports numpy; planning imports this module for ``require`` (see headline)
    from .export import candidate_rows

    return [{"panel": r["panel"], "prompt_id": r["prompt_id"], "seed": r["seed"], "arm": r["arm"],
             "path": f"panels/{r['panel']}/{r['video']}", "digest": r["video_digest"],
             "identical_to_control": r["identical_to_control"], "artifact": None} for r in candidate_rows(study)]


def _log_videos(client: Any, run_id: str, study: StudySpec, tmp: Path) -> str:
    """Log the videos (up to ``VIDEO_BYTES``, whole pairs) and ``videos/index.json``;
    returns the ``pairflow.videos`` tag. Raises IntegrityError for a video whose bytes
    differ from its record's digest."""
    index = video_index(study)
    pairs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for v in index:
        pairs.setdefault((v["panel"], v["prompt_id"], v["seed"]), []).append(v)
    used = 0
    for videos in pairs.values():
        paths = [Path(study.scratch) / v["path"] for v in videos]
        size = sum(p.stat().st_size for p in paths if p.is_file())
        if used + size > VIDEO_BYTES:
            break
        for v, path in zip(videos, paths, strict=True):
            actual = digest_file(path) if path.is_file() else "missing"
            if actual != v["digest"]:
                raise IntegrityError(f"{path}: the video is {actual}, its generation record says {v['digest']}; "
                                     "nothing more was logged to the tracker. Run `pairflow verify` on the results "
                                     "tree, then rerun `snakemake`")
            v["artifact"] = f"videos/{v['panel']}/{v['arm']}/{path.name}"
            client.log_artifact(run_id, str(path), str(Path(v["artifact"]).parent))
        used += size
    logged = sum(1 for v in index if v["artifact"])
    write_text(tmp / "index.json", json.dumps({"videos": index, "logged": logged, "cap_bytes": VIDEO_BYTES},
                                              indent=1) + "\n")
    client.log_artifact(run_id, str(tmp / "index.json"), "videos")
    return (f"{logged} of {len(index)} videos logged under videos/ ({used / 2**20:.1f} MiB, cap "
            f"{VIDEO_BYTES // 2**20} MiB); videos/index.json lists every one with its digest")


def log_study(study: StudySpec, stats_json: Path, table_md: Path, gallery: Path, manifest: Path,
              out: Path) -> dict[str, Any]:
    """Log the study to the configured tracker and write ``out`` (the run's id, the
    experiment, the tracking URI and the digests tagged). Returns what ``out`` holds."""
    # lazy: envinfo loads importlib.metadata, platform and subprocess (about 20 ms of CPU);
    # planning imports this module for ``require`` and its import time is kept as it was.
    from ..envinfo import code_version

    require(study)
    problems = verify_manifest(Path(manifest))
    if problems:
        raise IntegrityError(f"{manifest}: the study manifest does not match its files, so nothing was logged to "
                             f"the tracker: {problems[0]}; rerun `snakemake` to rebuild the study table")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=study.report.tracker_uri)
    found = client.get_experiment_by_name(study.study)
    experiment = found.experiment_id if found is not None else client.create_experiment(study.study)
    root = json.loads(Path(manifest).read_text())["root_digest"]
    code = code_version(str(study.root))
    tags = {"pairflow.study": study.study, "pairflow.study_manifest_root_digest": root,
            "pairflow.stats_digest": digest_file(Path(stats_json)),
            "pairflow.gallery_digest": digest_file(Path(gallery)),
            "pairflow.code_commit": str(code["commit"]), "pairflow.code_dirty": str(code["dirty"])}
    run = client.create_run(experiment, run_name=f"{study.study}-{root.split(':')[-1][:12]}", tags=tags)
    run_id = run.info.run_id
    try:
        for name, value in headline(Path(stats_json)).items():
            client.log_metric(run_id, name, value)
        verdicts = verdict_rows(Path(stats_json))
        for v in verdicts:
            if v["verdict_code"] is None:
                continue
            client.set_tag(run_id, f"pairflow.verdict.{v['arm']}.{v['metric']}", v["verdict_text"])
            if v["p_verdict"] is not None:
                client.log_metric(run_id, f"{v['arm']}/{v['metric']}_p_verdict", float(v["p_verdict"]))
        for f in (Path(table_md), Path(table_md).with_suffix(".html"), Path(stats_json), Path(manifest)):
            client.log_artifact(run_id, str(f), "study")
        client.log_artifact(run_id, str(gallery))
        with tempfile.TemporaryDirectory(prefix="pairflow-track-") as tmp:
            write_text(Path(tmp) / "verdicts.json", json.dumps({"verdicts": verdicts}, indent=1) + "\n")
            client.log_artifact(run_id, str(Path(tmp) / "verdicts.json"))
            client.set_tag(run_id, "pairflow.videos", _log_videos(client, run_id, study, Path(tmp)))
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id)
    record = {"tracker": "mlflow", "tracking_uri": client.tracking_uri, "experiment_id": experiment,
              "run_id": run_id, "tags": tags}
    write_text(Path(out), json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record

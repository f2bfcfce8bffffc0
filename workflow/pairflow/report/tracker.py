"""Optional logging of a finished study to an experiment tracker (``report/tracker``;
MLflow only). Off by default, and never a dependency: the ``mlflow`` package (``pip
install mlflow-skinny``) is imported only when the config asks for it.

One MLflow run per ``track`` job, in the experiment named after the study:

- metrics: per treatment arm, the headline numbers of ``stats.json`` as the export's
  summary rows give them (``<arm>/speedup``, ``<arm>/compute_ratio``, ``<arm>/<metric>``:
  the difference from control, or the treatment's mean for a fidelity metric), each with
  ``_ci_low`` and ``_ci_high``;
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
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..errors import ConfigError, IntegrityError
from ..identity import digest_file
from ..plan.config import StudySpec
from ..records.store import verify_manifest

PACKAGE = "mlflow"
INSTALL = "pip install mlflow-skinny"


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
        for f in (Path(table_md), Path(table_md).with_suffix(".html"), Path(stats_json), Path(manifest)):
            client.log_artifact(run_id, str(f), "study")
        client.log_artifact(run_id, str(gallery))
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id)
    record = {"tracker": "mlflow", "tracking_uri": client.tracking_uri, "experiment_id": experiment,
              "run_id": run_id, "tags": tags}
    write_text(Path(out), json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record

"""tracker: a finished study logged to a real local MLflow store, read back with MLflow's
client: metrics equal stats.json, the table and gallery are artifacts, and the run is
tagged with the study manifest's root digest; a config asking for a missing package is
refused naming the key, the package and the install command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import small_config, write_config

from pairflow.errors import ConfigError, IntegrityError
from pairflow.identity import digest_file
from pairflow.layout import Layout
from pairflow.plan.config import StudySpec, study_from_raw
from pairflow.records.store import build_manifest, write_manifest
from pairflow.report.tracker import headline, log_study, require

STATS = {"level": 0.95, "comparisons": [{
    "treatment": "pab", "n_prompts": 2, "n_pairs": 2, "speedup": {"geomean": 1.23, "ci": [1.1, 1.4]},
    "compute": {"ratio": 0.6, "ci": [0.55, 0.65]},
    "metrics": [{"metric": "temporal_flickering", "kind": "NR", "higher_is_better": True, "diff": -0.00365,
                 "ci": [-0.00458, -0.00272], "control_mean": 0.905, "treatment_mean": 0.901, "p_value": 0.01,
                 "verdict": "worse"},
                {"metric": "psnr", "kind": "FR", "higher_is_better": True, "diff": None, "ci": [30.0, 32.0],
                 "treatment_mean": 31.0}]}]}


@pytest.fixture
def finished(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[StudySpec, Layout]:
    """A study tree as rule study_stats and rule gallery leave it (stats.json, table.md and
    .html sealed by the study manifest; gallery.html), with report/tracker: mlflow at a
    local file store."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to use a file: store
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    cfg = small_config(tmp_path, tiny_model)
    cfg["report"] = {"tracker": "mlflow", "tracker_uri": (tmp_path / "mlruns").as_uri()}
    write_config(tmp_path, cfg)
    study = study_from_raw(cfg, tmp_path)
    layout = Layout(study.scratch)
    layout.study.mkdir(parents=True)
    layout.study_stats.write_text(json.dumps(STATS))
    layout.study_table().write_text("pab: 1.23x faster [1.1, 1.4]\n")
    layout.study_table(".html").write_text("<p>pab: 1.23x faster</p>\n")
    layout.gallery.write_text("<html><body>gallery</body></html>\n")
    files = [layout.study_stats, layout.study_table(), layout.study_table(".html")]
    write_manifest(layout.study_manifest, build_manifest("study", study.scratch, files, {"study": study.study},
                                                         base=".."))
    return study, layout


def test_run_holds_the_stats_numbers_the_artifacts_and_the_manifest_digest(finished: tuple[StudySpec, Layout]) -> None:
    from mlflow.tracking import MlflowClient

    study, layout = finished
    record = log_study(study, layout.study_stats, layout.study_table(), layout.gallery, layout.study_manifest,
                       layout.tracked)
    assert json.loads(layout.tracked.read_text()) == record
    client = MlflowClient(tracking_uri=study.report.tracker_uri)
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {
        "pab/speedup": 1.23, "pab/speedup_ci_low": 1.1, "pab/speedup_ci_high": 1.4,
        "pab/compute_ratio": 0.6, "pab/compute_ratio_ci_low": 0.55, "pab/compute_ratio_ci_high": 0.65,
        "pab/temporal_flickering": -0.00365, "pab/temporal_flickering_ci_low": -0.00458,
        "pab/temporal_flickering_ci_high": -0.00272,
        "pab/psnr": 31.0, "pab/psnr_ci_low": 30.0, "pab/psnr_ci_high": 32.0}  # FR: the mean, as the export
    tags = run.data.tags
    assert tags["pairflow.study_manifest_root_digest"] == json.loads(layout.study_manifest.read_text())["root_digest"]
    assert tags["pairflow.stats_digest"] == digest_file(layout.study_stats)
    assert tags["pairflow.gallery_digest"] == digest_file(layout.gallery)
    assert "pairflow.code_commit" in tags
    assert sorted(f.path for f in client.list_artifacts(run.info.run_id, "study")) == [
        "study/manifest.json", "study/stats.json", "study/table.html", "study/table.md"]
    assert [f.path for f in client.list_artifacts(run.info.run_id)] == ["gallery.html", "study", "verdicts.json",
                                                                         "videos"]
    local = Path(client.download_artifacts(run.info.run_id, "study/table.md"))
    assert local.read_text() == layout.study_table().read_text()


def test_an_edited_table_is_refused_and_nothing_is_logged(finished: tuple[StudySpec, Layout]) -> None:
    study, layout = finished
    layout.study_table().write_text("pab: 9.99x faster\n")
    with pytest.raises(IntegrityError, match="table.md"):
        log_study(study, layout.study_stats, layout.study_table(), layout.gallery, layout.study_manifest,
                  layout.tracked)
    assert not layout.tracked.exists()
    assert not (Path(str(study.report.tracker_uri).removeprefix("file://")) / "0").exists()


def test_headline_leaves_out_numbers_without_a_value(tmp_path: Path) -> None:
    stats = json.loads(json.dumps(STATS))
    del stats["comparisons"][0]["compute"]
    stats["comparisons"][0]["metrics"][0]["diff"] = None
    stats["comparisons"][0]["metrics"][0]["treatment_mean"] = None
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    assert sorted(headline(tmp_path / "stats.json")) == [
        "pab/psnr", "pab/psnr_ci_high", "pab/psnr_ci_low", "pab/speedup", "pab/speedup_ci_high",
        "pab/speedup_ci_low", "pab/temporal_flickering_ci_high", "pab/temporal_flickering_ci_low"]


def test_tracker_is_off_by_default_and_a_missing_package_names_key_package_and_fix(
        tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = small_config(tmp_path, tiny_model)
    study = study_from_raw(cfg, tmp_path)
    assert (study.report.tracker, study.report.tracker_uri) == ("none", None)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # find_spec answers None, as when not installed
    require(study)  # off: the package is never looked for
    cfg["report"] = {"tracker": "mlflow"}
    with pytest.raises(ConfigError) as e:
        require(study_from_raw(cfg, tmp_path), "config/config.yaml")
    msg = str(e.value)
    assert "config/config.yaml: key 'report/tracker' is 'mlflow'" in msg
    assert "mlflow package is not installed" in msg and "`pip install mlflow-skinny`" in msg


def test_check_config_refuses_the_tracker_without_its_package(tmp_path: Path, tiny_model: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from pairflow.cli import main

    cfg = small_config(tmp_path, tiny_model)
    cfg["report"] = {"tracker": "mlflow"}
    path = write_config(tmp_path, cfg)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert main(["check-config", str(path), "--directory", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "key 'report/tracker' is 'mlflow'" in err and "`pip install mlflow-skinny`" in err
    assert len(err.strip().splitlines()) == 1


def test_a_real_studys_run_carries_each_verdict_with_its_p_and_every_video_with_its_digest(
        finished_study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: the MLflow run carried the table, stats and digests but no videos and no
    verdicts. On the session's finished study (real Snakemake; an arm with pairs identical
    to control), logged to a real local MLflow file store."""
    pytest.importorskip("mlflow")
    from conftest import study_config
    from mlflow.tracking import MlflowClient

    from pairflow.analysis.verdicts import verdict_text

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    cfg = study_config(finished_study)
    cfg["report"] = {"tracker": "mlflow", "tracker_uri": (tmp_path / "mlruns").as_uri()}
    study = study_from_raw(cfg, finished_study)  # the study is only read; the run and its record go to tmp_path
    layout = Layout(study.scratch)
    record = log_study(study, layout.study_stats, layout.study_table(), layout.gallery, layout.study_manifest,
                       tmp_path / "tracked.json")
    client = MlflowClient(tracking_uri=study.report.tracker_uri)
    run = client.get_run(record["run_id"])
    stats = json.loads(layout.study_stats.read_text())
    cells = [(c["treatment"], m) for c in stats["comparisons"] for m in c["metrics"] if m["verdict_code"]]
    assert cells  # the study's NR cells carry verdicts
    for arm, m in cells:  # beside the metrics: the word, its p, test and family, as every report prints them
        assert run.data.tags[f"pairflow.verdict.{arm}.{m['metric']}"] == verdict_text(m)
        assert run.data.metrics[f"{arm}/{m['metric']}_p_verdict"] == m["p_verdict"]
        assert f"{arm}/{m['metric']}" in run.data.metrics
    dl = tmp_path / "dl"
    dl.mkdir()
    verdicts = json.loads(Path(client.download_artifacts(run.info.run_id, "verdicts.json", str(dl))).read_text())
    by = {(v["arm"], v["metric"]): v for v in verdicts["verdicts"]}
    assert len(by) == sum(len(c["metrics"]) for c in stats["comparisons"])
    assert (by[("best2", "psnr")]["n_identical_pairs"], by[("best2", "psnr")]["verdict_code"]) == (2, None)
    index = json.loads(Path(client.download_artifacts(run.info.run_id, "videos/index.json", str(dl))).read_text())
    videos = index["videos"]
    assert len(videos) == 6 * 5 and index["logged"] == 30  # six arms x five pairs, all under the cap
    assert run.data.tags["pairflow.videos"].startswith("30 of 30 videos logged under videos/")
    assert sum(1 for v in videos if v["identical_to_control"]) == 2
    assert {v["identical_to_control"] for v in videos if v["arm"] == "control"} == {None}
    for v in videos:  # each logged video is the recorded one, byte for byte
        got = Path(client.download_artifacts(run.info.run_id, v["artifact"], str(dl)))
        assert digest_file(got) == v["digest"] == digest_file(Path(study.scratch) / v["path"])

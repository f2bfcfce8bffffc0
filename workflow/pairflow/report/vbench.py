"""VBench's own result layout: each arm's scores as VBench's ``*_eval_results.json``, and
the total-score arithmetic of VBench's leaderboard script with its refusals.

Read from Vchitect/VBench at commit 45e79ec14e69a2187202c675d2dbce1a71843d53 (package
version 0.1.5; ``scripts/constant.py`` and ``scripts/cal_final_score.py`` unchanged since
884b25e, 2024-12-31): ``vbench/__init__.py`` (``VBench.evaluate`` saves
``{dimension: compute_<dimension>(...)}`` as ``<name>_eval_results.json``, indent 4),
``vbench/<dimension>.py`` (each returns ``(overall, [{"video_path", "video_results"}, ...])``),
``scripts/constant.py`` (``NORMALIZE_DIC``, ``DIM_WEIGHT``, ``QUALITY_LIST``,
``SEMANTIC_LIST``, ``QUALITY_WEIGHT`` 4, ``SEMANTIC_WEIGHT`` 1; retyped below as data, with
the dimension names underscored as in the result files) and ``scripts/cal_final_score.py``.

Per dimension, as the single-process ``compute_<dimension>`` forms it:

* subject_consistency, background_consistency: per video the mean over frames t > 0 (PairFlow's
  value); overall ``sum(video_sim) / sum(frames - 1)`` (frame pairs weighted, where PairFlow's
  own unit is the video; VBench run on several GPUs averages subject_consistency over videos
  instead, so its meaning changes with the GPU count: the single-process form is written);
  background's entries also carry ``video_sim`` and ``cnt_per_video``;
* temporal_flickering: per video PairFlow's value; overall their mean; a video flagged moving by
  ``scoring.static_filter: intersection`` is left out (VBench scores only static videos);
* dynamic_degree: per video a JSON boolean (PairFlow's 0.0/1.0); overall the share of True;
* aesthetic_quality: per video PairFlow's value (frames' LAION score / 10, as VBench); overall mean;
* imaging_quality: per video on MUSIQ's 0-100 scale (PairFlow's value x 100: VBench divides
  only the overall by 100); overall ``mean / 100``.

motion_smoothness is not written: PairFlow's ``motion_smoothness_proxy`` replaces AMT by linear
interpolation, so its numbers are not VBench's. The nine semantic dimensions have no PairFlow
metric. ``cal_final_score`` reads a missing dimension as 0; here a total whose dimensions are
not all present is not formed, and ``vbench_coverage`` / ``vbench_totals`` name what it lacks.
Values compare with published VBench numbers only under ``scoring.decode: vbench`` and on
VBench's own prompt suite; ``vbench_summary.json`` says per dimension whether frames were read as
VBench reads them. The summary lies beside ``vbench/``, not in it: ``cal_final_score`` reads every
JSON file of the zip it is given as ``{dimension: [overall, ...]}`` and fails on any other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..errors import ConfigError, IntegrityError, StatsError
from ..identity import digest_bytes
from ..layout import Layout
from ..metrics import metric_spec
from ..plan.candidates import candidates, record_path, score_path
from ..plan.config import StudySpec
from ..records.store import read_record

VBENCH_SOURCE = ("Vchitect/VBench 45e79ec14e69a2187202c675d2dbce1a71843d53 (0.1.5): vbench/__init__.py, "
                 "vbench/<dimension>.py, scripts/constant.py, scripts/cal_final_score.py")

NORMALIZE: dict[str, tuple[float, float]] = {  # scripts/constant.py NORMALIZE_DIC: (Min, Max)
    "subject_consistency": (0.1462, 1.0), "background_consistency": (0.2615, 1.0),
    "temporal_flickering": (0.6293, 1.0), "motion_smoothness": (0.706, 0.9975), "dynamic_degree": (0.0, 1.0),
    "aesthetic_quality": (0.0, 1.0), "imaging_quality": (0.0, 1.0), "object_class": (0.0, 1.0),
    "multiple_objects": (0.0, 1.0), "human_action": (0.0, 1.0), "color": (0.0, 1.0),
    "spatial_relationship": (0.0, 1.0), "scene": (0.0, 0.8222), "appearance_style": (0.0009, 0.2855),
    "temporal_style": (0.0, 0.364), "overall_consistency": (0.0, 0.364)}
DIM_WEIGHT: dict[str, float] = {d: 0.5 if d == "dynamic_degree" else 1.0 for d in NORMALIZE}  # DIM_WEIGHT
QUALITY = ("subject_consistency", "background_consistency", "temporal_flickering", "motion_smoothness",
           "aesthetic_quality", "imaging_quality", "dynamic_degree")  # QUALITY_LIST
SEMANTIC = ("object_class", "multiple_objects", "human_action", "color", "spatial_relationship", "scene",
            "appearance_style", "temporal_style", "overall_consistency")  # SEMANTIC_LIST
QUALITY_WEIGHT, SEMANTIC_WEIGHT = 4.0, 1.0
TOTALS: dict[str, tuple[str, ...]] = {"quality_score": QUALITY, "semantic_score": SEMANTIC,
                                      "total_score": QUALITY + SEMANTIC}
"""Each total of ``cal_final_score`` and the dimensions it needs."""

EXPORTED = ("subject_consistency", "background_consistency", "temporal_flickering", "dynamic_degree",
            "aesthetic_quality", "imaging_quality")
"""The VBench dimensions a PairFlow metric of the same name computes by VBench's procedure."""

SCALE_NOTES = {
    "imaging_quality": "per video x 100 (MUSIQ's 0-100, as VBench writes it); overall = mean / 100",
    "dynamic_degree": "per video a boolean (PairFlow's 0.0/1.0); overall = share of true",
    "subject_consistency": "overall weighted by frame pairs (sum of video_sim / sum of frames - 1), as VBench",
    "background_consistency": "overall weighted by frame pairs (sum of video_sim / sum of frames - 1), as VBench",
}


@dataclass(frozen=True)
class Coverage:
    """Which VBench dimensions a set of PairFlow metrics scores, and which totals follow.
    ``missing`` maps each dimension not scored to why; ``cannot_form`` each total that cannot
    be formed to the dimensions it lacks (in VBench's order)."""

    scored: tuple[str, ...]
    missing: dict[str, str] = field(default_factory=dict)
    formable: tuple[str, ...] = ()
    cannot_form: dict[str, tuple[str, ...]] = field(default_factory=dict)


def vbench_coverage(scored: Iterable[str]) -> Coverage:
    """The coverage of PairFlow metric names ``scored`` (a study's ``scorers``, or the
    dimensions an arm's records hold): the VBench dimensions among them, every other
    dimension with the reason it is missing, and the totals of ``cal_final_score`` that can
    and cannot be formed."""
    names = set(scored)
    have = tuple(d for d in QUALITY + SEMANTIC if d in names and d in EXPORTED)
    missing: dict[str, str] = {}
    for d in QUALITY + SEMANTIC:
        if d in have:
            continue
        if d == "motion_smoothness":
            missing[d] = ("PairFlow has only motion_smoothness_proxy (linear interpolation in place of AMT), "
                          "whose numbers are not VBench's" if "motion_smoothness_proxy" in names
                          else "no PairFlow metric (motion_smoothness_proxy is a proxy, not VBench's AMT procedure)")
        elif d in EXPORTED:
            missing[d] = "not scored (not among the scorers, or no video scored)"
        else:
            missing[d] = "no PairFlow metric computes this semantic dimension"
    lacking = {t: tuple(d for d in dims if d not in have) for t, dims in TOTALS.items()}
    return Coverage(scored=have, missing=missing, formable=tuple(t for t, m in lacking.items() if not m),
                    cannot_form={t: m for t, m in lacking.items() if m})


def vbench_totals(overall: Mapping[str, float]) -> dict[str, Any]:
    """``cal_final_score`` on per-dimension overall scores ``overall`` (VBench's scale, keys
    underscored): per dimension ``normalized`` = (score - Min) / (Max - Min) (not clipped, as
    VBench) and ``weighted`` = normalized x DIM_WEIGHT; Quality and Semantic Score = the sum of
    their dimensions' weighted values / the sum of their weights; Total Score = (4 Quality +
    1 Semantic) / 5. A total whose dimensions are not all present is None and listed in
    ``cannot_form`` with the dimensions it lacks (VBench's script would read them as 0).
    Raises ConfigError for a key that is not a VBench dimension."""
    unknown = sorted(set(overall) - set(NORMALIZE))
    if unknown:
        raise ConfigError(f"{unknown} are not VBench dimensions (scripts/constant.py NORMALIZE_DIC names "
                          f"{sorted(NORMALIZE)}); pass only VBench dimensions, underscored")
    dims = {}
    for d in QUALITY + SEMANTIC:
        if d in overall:
            lo, hi = NORMALIZE[d]
            norm = (float(overall[d]) - lo) / (hi - lo)
            dims[d] = {"score": float(overall[d]), "min": lo, "max": hi, "normalized": norm,
                       "weight": DIM_WEIGHT[d], "weighted": norm * DIM_WEIGHT[d]}
    lacking = {t: [d for d in need if d not in dims] for t, need in TOTALS.items()}

    def part(need: Sequence[str]) -> float | None:
        if any(d not in dims for d in need):
            return None
        return sum(dims[d]["weighted"] for d in need) / sum(DIM_WEIGHT[d] for d in need)

    quality, semantic = part(QUALITY), part(SEMANTIC)
    total = None if quality is None or semantic is None else (
        (quality * QUALITY_WEIGHT + semantic * SEMANTIC_WEIGHT) / (QUALITY_WEIGHT + SEMANTIC_WEIGHT))
    return {"dimensions": dims, "quality_score": quality, "semantic_score": semantic, "total_score": total,
            "cannot_form": {t: m for t, m in lacking.items() if m}}


@dataclass(frozen=True)
class VideoScore:
    """One video's value of one dimension, as PairFlow recorded it: ``path`` relative to
    the scratch directory, ``frames`` the video's frame count, ``static`` the static
    filter's flag (None without one), ``decoded_with`` how its frames were read."""

    path: str
    value: float
    frames: int
    static: bool | None = None
    decoded_with: str = ""


def dimension_result(dim: str, videos: Sequence[VideoScore]) -> list[Any]:
    """``[overall, [{"video_path", "video_results", ...}, ...]]`` for one VBench dimension
    from PairFlow's per-video values, on VBench's scale and formed as VBench's single-process
    ``compute_<dim>`` forms it (module docstring). ``videos`` must be non-empty (after the
    static filter for temporal_flickering). Raises IntegrityError for a dynamic_degree value
    other than 0 or 1, or a consistency video of fewer than 2 frames."""
    if dim == "temporal_flickering":
        videos = [v for v in videos if v.static is not False]
    if not videos:
        raise StatsError(f"{dim}: no video to form VBench's overall score from (every video left out, or none "
                         "scored); leave the dimension out of the layout")
    entries: list[dict[str, Any]] = []
    for v in videos:
        value: Any = v.value
        if dim == "dynamic_degree":
            if v.value not in (0.0, 1.0):
                raise IntegrityError(f"{v.path}: dynamic_degree {v.value!r} is not 0 or 1, as VBench's per-video "
                                     "value is; rescore the study with this PairFlow's dynamic_degree")
            value = v.value == 1.0
        elif dim == "imaging_quality":
            value = v.value * 100.0
        entry: dict[str, Any] = {"video_path": v.path, "video_results": value}
        if dim in ("subject_consistency", "background_consistency") and v.frames < 2:
            raise IntegrityError(f"{v.path}: {dim} needs at least 2 frames, the record says {v.frames}; "
                                 "the score record and its generation record disagree: rescore this video")
        if dim == "background_consistency":
            entry.update(video_sim=v.value * (v.frames - 1), cnt_per_video=v.frames - 1)
        entries.append(entry)
    if dim in ("subject_consistency", "background_consistency"):
        overall = sum(v.value * (v.frames - 1) for v in videos) / sum(v.frames - 1 for v in videos)
    elif dim == "imaging_quality":
        overall = sum(e["video_results"] for e in entries) / len(entries) / 100.0
    else:
        overall = sum(float(e["video_results"]) for e in entries) / len(entries)
    return [overall, entries]


def arm_videos(study: StudySpec) -> dict[str, dict[str, list[VideoScore]]]:
    """Per arm (in the study's order), per exported dimension, every scored video's value,
    read through ``read_record`` (an altered record is refused: IntegrityError)."""
    layout = Layout(study.scratch)
    out: dict[str, dict[str, list[VideoScore]]] = {arm.name: {} for arm in study.arms}
    for panel in study.panels:
        for c in candidates(study, panel):
            spath = score_path(layout, c)
            if not spath.is_file() or not record_path(layout, c).is_file():
                continue
            sc = read_record(spath, "score")
            gen = read_record(record_path(layout, c), "generation")
            video = (layout.panel(panel.name) / gen["video"]["path"]).relative_to(layout.scratch).as_posix()
            for dim in EXPORTED:
                entry = sc["scores"].get(dim)
                if entry is not None:
                    out[c.arm.name].setdefault(dim, []).append(VideoScore(
                        video, entry["value"], gen["video"]["frames"], entry.get("static"), entry["decoded_with"]))
    return out


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=4)  # as VBench's utils.save_json: indent 4, no final newline


def vbench_files(study: StudySpec) -> dict[str, str]:
    """The text of ``vbench/<arm>_eval_results.json`` for each arm with at least one VBench
    dimension scored, and of ``vbench_summary.json`` (source, constants, the study's coverage, per
    arm each dimension's raw and normalised score, the totals formed or why not, the scale
    changes and whether frames were read as VBench reads them), by path relative to the
    export folder. Raises IntegrityError on an altered record or a value VBench's layout
    cannot hold."""
    files: dict[str, str] = {}
    arms: dict[str, Any] = {}
    for arm, by_dim in arm_videos(study).items():
        results = {d: dimension_result(d, vs) for d, vs in by_dim.items()
                   if d != "temporal_flickering" or any(v.static is not False for v in vs)}
        if not results:
            continue
        name = f"vbench/{arm}_eval_results.json"
        files[name] = _json(results)
        arms[arm] = {"eval_results": name, "eval_results_digest": digest_bytes(files[name].encode()),
                     "videos": {d: len(r[1]) for d, r in results.items()},
                     **vbench_totals({d: r[0] for d, r in results.items()}),
                     "read_as_vbench": {d: _read_as_vbench(d, by_dim[d]) for d in results},
                     "scale": {d: SCALE_NOTES[d] for d in results if d in SCALE_NOTES}}
    cov = vbench_coverage(study.scorers)
    files["vbench_summary.json"] = _json({
        "kind": "vbench-summary", "source": VBENCH_SOURCE, "study": study.study,
        "constants": {"normalize": {d: {"min": lo, "max": hi} for d, (lo, hi) in NORMALIZE.items()},
                      "dim_weight": DIM_WEIGHT, "quality": list(QUALITY), "semantic": list(SEMANTIC),
                      "quality_weight": QUALITY_WEIGHT, "semantic_weight": SEMANTIC_WEIGHT},
        "coverage": {"scored": list(cov.scored), "missing": cov.missing, "formable": list(cov.formable),
                     "cannot_form": {t: list(m) for t, m in cov.cannot_form.items()}},
        "notes": ["video_path is relative to the scratch directory; each video's prompt, seed, arm and record "
                  "digests are its row of candidates.<fmt> (column video: the same file, relative to its panel)",
                  "cal_final_score takes one arm's file at a time (zip only vbench/<arm>_eval_results.json); it "
                  "counts a missing dimension as 0, so its totals for these files are not VBench totals",
                  "prompts are the study's, not VBench's prompt suite: a value compares with a published "
                  "VBench number only for the same prompts, seeds and frame reading (read_as_vbench)",
                  "temporal_flickering leaves out videos the static filter called moving; without "
                  "scoring.static_filter every video is in (VBench scores static videos only)"],
        "arms": arms})
    return files


def write_vbench(study: StudySpec, out: Path) -> list[Path]:
    """Write ``vbench_files`` under the export folder ``out`` (atomically, each arm's file
    before the summary); returns their paths."""
    files = vbench_files(study)
    for name, text in files.items():
        write_text(out / name, text)
    return [out / name for name in files]


def _read_as_vbench(dim: str, videos: Sequence[VideoScore]) -> bool:
    """Whether every video's frames were decoded as VBench 0.1.5 reads this dimension
    (decord follows the BT.709 tags; OpenCV reads BT.601): ``scoring.decode: vbench``."""
    want = "bt709" if metric_spec(dim).vbench_reader == "decord" else "bt601"
    return all(v.decoded_with == want for v in videos)

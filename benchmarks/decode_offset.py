"""temporal_flickering under PairFlow's decodes vs VBench's OpenCV reader, on every video of a finished default study.

Reads every video a finished run of the default study wrote (config/config.yaml: 7 prompts x
2 seeds x 4 arms = 56 videos, every arm, best2's search winners included), through the generation
records that name them, and compares, per video, temporal_flickering of ``read_video`` (bt709, and
bt601) with temporal_flickering of the frames OpenCV 4.x returns (VBench 0.1.5's reader for that
dimension). OpenCV 4.x is not in the project environment (pyiqa brings OpenCV 5, which follows the
tags); install it apart and name it:

    .venv/bin/snakemake --profile profiles/local          # the default study, if not run yet
    python -m pip install --no-deps --target /tmp/ocv4 opencv-python-headless==4.10.0.84
    python benchmarks/decode_offset.py --opencv /tmp/ocv4 [--project .]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import numpy as np

from pairflow.layout import Layout
from pairflow.media.video import read_video
from pairflow.metrics.flicker import temporal_flickering
from pairflow.plan.candidates import candidates, record_path
from pairflow.plan.config import load_study
from pairflow.records.store import read_record

ROOT = Path(__file__).resolve().parent.parent


def opencv_frames(cv2: object, path: Path) -> np.ndarray:
    cap, frames = cv2.VideoCapture(str(path)), []  # type: ignore[attr-defined]
    while (got := cap.read())[0]:
        frames.append(got[1][..., ::-1])  # BGR -> RGB
    return np.stack(frames)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opencv", type=Path, required=True, help="a folder holding opencv-python-headless 4.x")
    ap.add_argument("--project", type=Path, default=ROOT, help="a project where the default study has run")
    args = ap.parse_args()
    sys.path.insert(0, str(args.opencv))
    cv2 = importlib.import_module("cv2")
    if not cv2.__version__.startswith("4."):
        raise SystemExit(f"need OpenCV 4.x (VBench's), got {cv2.__version__} from {cv2.__file__}")
    study = load_study(args.project / "config" / "config.yaml", args.project)
    g = study.generation
    offsets: dict[str, list[float]] = {}
    exact = 0
    for panel in study.panels:
        for c in candidates(study, panel):
            rec = read_record(record_path(Layout(study.scratch), c), "generation")
            path = Layout(study.scratch).panel(panel.name) / rec["video"]["path"]  # relative to its panel
            shape = {"frames": g.frames, "height": g.height, "width": g.width, "fps": g.fps}
            vbench = temporal_flickering(opencv_frames(cv2, path))
            bt709 = temporal_flickering(read_video(path, study.encoder, **shape))
            exact += temporal_flickering(read_video(path, study.encoder, **shape, matrix="bt601")) == vbench
            offsets.setdefault(c.arm.name, []).append(bt709 - vbench)
    every = [x for v in offsets.values() for x in v]
    print(f"OpenCV {cv2.__version__}; {len(every)} videos; bt601 (scoring.decode: vbench) equal exactly on {exact}")
    print(f"bt709 - VBench: min {min(every):.5f} max {max(every):.5f} mean {np.mean(every):.5f}")
    for arm, v in offsets.items():
        print(f"  {arm}: {len(v)} videos, {min(v):.5f} to {max(v):.5f}")


if __name__ == "__main__":
    main()

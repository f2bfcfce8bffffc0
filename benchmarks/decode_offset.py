"""temporal_flickering under PairFlow's decodes vs VBench's OpenCV reader, on the default study's videos.

Generates the default study's control, fbcache and fewstep videos (config/config.yaml: 7 prompts x
2 seeds each; best2 is a seed search over the same generations) with the embedded tiny model, encodes
them with the recipe, and compares, per video, temporal_flickering of ``read_video`` (bt709, and
bt601) with temporal_flickering of the frames OpenCV 4.x returns (VBench 0.1.5's reader for that
dimension). OpenCV 4.x is not in the project environment (pyiqa brings OpenCV 5, which follows the
tags); install it apart and name it:

    python -m pip install --no-deps --target /tmp/ocv4 opencv-python-headless==4.10.0.84
    python benchmarks/decode_offset.py --opencv /tmp/ocv4 --out /tmp/decode-offset
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import numpy as np

from pairflow.generation.generate import generate, load_pipeline
from pairflow.generation.tinymodel import build_tiny_model
from pairflow.media.video import encode, prepare_frames, read_video
from pairflow.metrics.flicker import temporal_flickering
from pairflow.plan.candidates import candidates
from pairflow.plan.config import ModelSpec, load_study

ROOT = Path(__file__).resolve().parent.parent


def opencv_frames(cv2: object, path: Path) -> np.ndarray:
    cap, frames = cv2.VideoCapture(str(path)), []  # type: ignore[attr-defined]
    while (got := cap.read())[0]:
        frames.append(got[1][..., ::-1])  # BGR -> RGB
    return np.stack(frames)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opencv", type=Path, required=True, help="a folder holding opencv-python-headless 4.x")
    ap.add_argument("--out", type=Path, required=True, help="where the model and videos go")
    args = ap.parse_args()
    sys.path.insert(0, str(args.opencv))
    cv2 = importlib.import_module("cv2")
    if not cv2.__version__.startswith("4."):
        raise SystemExit(f"need OpenCV 4.x (VBench's), got {cv2.__version__} from {cv2.__file__}")
    study = load_study(ROOT / "config" / "config.yaml", ROOT)
    g = study.generation
    pipe = load_pipeline(ModelSpec("embedded-tiny", build_tiny_model(args.out / "tiny-wan")), g.dtype, g.threads)
    offsets: dict[str, list[float]] = {}
    exact = 0
    for panel in study.panels:
        for c in candidates(study, panel):
            if c.arm.search is not None:
                continue
            path = args.out / f"{c.key.candidate_id}.mp4"
            u8, _ = prepare_frames(generate(pipe, c.prompt.text, c.key.stream_seed, c.arm, g).frames, study.encoder)
            encode(u8, path, study.encoder, g.fps)
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

"""Video I/O: write guards, a corpus of bad inputs made with ffmpeg at test time, round trips."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pairflow import errors as E
from pairflow.media import frames, tools
from pairflow.media.video import FLOAT_TOLERANCE, encode, ffmpeg_binary, prepare_frames, probe, read_video

F, H, W, FPS = 9, 64, 64, 8


def smooth(dtype: str = "float32") -> np.ndarray:
    """A moving gradient in [0, 1], like a model's decoded output."""
    t = np.arange(F)[:, None, None, None] / F
    y = np.linspace(0, 1, H)[None, :, None, None]
    x = np.linspace(0, 1, W)[None, None, :, None]
    full = np.ones((F, H, W, 1))
    rgb = np.concatenate([(0.5 + 0.5 * np.sin(2 * np.pi * (x + t))) * full, y * full, 0.5 * (x + y) * full], axis=3)
    return rgb.astype(dtype)


# ---------------------------------------------------------------- write guards

def test_float_frames_are_scaled_not_cast(encoder_spec) -> None:  # type: ignore[no-untyped-def]
    u8, stats = prepare_frames(smooth(), encoder_spec)
    assert u8.dtype == np.uint8 and u8.shape == (F, H, W, 3)
    assert abs(stats.mean - smooth().mean() * 255) < 0.5
    assert stats.flags == ()


@pytest.mark.parametrize("layout", ["FHWC", "FCHW"])
def test_chunked_conversion_equals_the_whole_array_formula(encoder_spec, monkeypatch, layout: str) -> None:  # type: ignore[no-untyped-def]
    """Chunks that split frames mid-row-block give exactly rint(x * 255) clipped, computed whole."""

    rng = np.random.default_rng(3)
    arr = rng.uniform(-FLOAT_TOLERANCE, 1 + FLOAT_TOLERANCE, (3, 10, 6, 3)).astype(np.float32)
    arr[0, 0, 0] = [0.5 / 255, 1.5 / 255, 2.5 / 255]  # ties round to even, as np.rint does
    want = np.clip(np.rint(arr.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)
    monkeypatch.setattr(frames, "CONVERT_CHUNK_ELEMENTS", 37)  # 2 rows of 18 values per chunk
    got, _ = prepare_frames(arr if layout == "FHWC" else arr.transpose(0, 3, 1, 2), encoder_spec)
    assert np.array_equal(got, want)
    bad = arr.copy()
    bad[2, 9, 5, 2] = np.nan  # in the last chunk only
    with pytest.raises(E.FrameError, match="1 NaN"):
        prepare_frames(bad, encoder_spec)


def test_float_conversion_memory_is_bounded(encoder_spec) -> None:  # type: ignore[no-untyped-def]
    """Regression (issue 22): one 8192x8192 float32 frame peaked at 4x its size during
    conversion (float64 copies of the whole video). Now: its uint8 output plus one chunk."""
    import tracemalloc


    arr = np.random.default_rng(0).random((4, 1024, 1536, 3), dtype=np.float32)  # 72 MiB
    prepare_frames(smooth(), encoder_spec)  # its first call imports torch: not the conversion's memory
    tracemalloc.start()
    try:
        out, _ = prepare_frames(arr, encoder_spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    chunk = frames.CONVERT_CHUNK_ELEMENTS * 8  # one float64 block
    assert peak < out.nbytes + 2 * chunk, (peak, out.nbytes, chunk)
    assert peak < arr.nbytes  # before: about 4x arr.nbytes


@pytest.mark.parametrize("shape", [(9, 64, 64, 3), (3, 480, 832, 3), (2, 6, 10, 3)])
def test_the_frame_mean_equals_numpys_exactly(encoder_spec, shape: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    """The guard's integer-sum mean is numpy's mean to the last bit, bright frames included."""
    for arr in (np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8), np.full(shape, 255, np.uint8)):
        assert prepare_frames(arr, encoder_spec)[1].mean == float(arr.mean())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_all_float_dtypes_accepted_from_torch(encoder_spec, dtype: str) -> None:  # type: ignore[no-untyped-def]
    import torch

    t = torch.from_numpy(smooth()).to(getattr(torch, dtype))
    u8, _ = prepare_frames(t, encoder_spec)
    assert np.abs(u8.astype(int) - np.rint(smooth() * 255)).max() <= 2


@pytest.mark.parametrize("arr, match", [
    (smooth("float64"), "dtype float64; accepted"),
    (smooth().astype(np.int32), "dtype int32"),
    (smooth() * 2 - 1, r"span \[-1.*\[-1, 1\] model output"),
    (smooth() * 255, r"\[0, 255\] floats"),
    (smooth() + 0.01, "just outside"),
    (np.zeros((0, H, W, 3), np.float32), "empty video"),
    (np.zeros((F, H, W), np.float32), "4 dimensions"),
    (np.zeros((F, 3, 8, 3), np.float32), "both .F, H, W, C. and .F, C, H, W. fit"),
    (np.zeros((F, H, W, 4), np.float32), "no axis 1 or 3 of size 3"),
    (np.zeros((F, 63, 64, 3), np.float32), "4:2:0 needs even"),
])
def test_bad_frames_are_refused_with_the_fix(encoder_spec, arr, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(E.FrameError, match=match):
        prepare_frames(arr, encoder_spec)


def test_nan_and_inf_are_counted(encoder_spec) -> None:  # type: ignore[no-untyped-def]
    a = smooth()
    a[0, 0, 0, 0] = np.nan
    a[1, 0, 0, :] = np.inf
    with pytest.raises(E.FrameError, match="1 NaN and 3 inf"):
        prepare_frames(a, encoder_spec)


def test_tolerance_is_allowed_and_clipped(encoder_spec) -> None:  # type: ignore[no-untyped-def]
    a = smooth()
    a[0, 0, 0, 0] = 1 + FLOAT_TOLERANCE / 2
    u8, _ = prepare_frames(a, encoder_spec)
    assert u8[0, 0, 0, 0] == 255


def test_channels_first_is_detected_explicitly(encoder_spec) -> None:  # type: ignore[no-untyped-def]
    chw = smooth().transpose(0, 3, 1, 2).copy()
    a, _ = prepare_frames(chw, encoder_spec)
    b, _ = prepare_frames(smooth(), encoder_spec)
    assert np.array_equal(a, b)


def test_flat_and_black_videos_are_flagged_or_refused(encoder_spec) -> None:  # type: ignore[no-untyped-def]
    black = np.zeros((F, H, W, 3), np.float32)
    _, stats = prepare_frames(black, encoder_spec)
    assert set(stats.flags) == {"near-constant", "near-black"}
    with pytest.raises(E.FrameError, match="fail_on_flat"):
        prepare_frames(black, dataclasses.replace(encoder_spec, fail_on_flat=True))


# ---------------------------------------------------------------- round trips

def test_lossy_round_trip_keeps_mean_and_psnr(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Regression for the nearly-black bug: float frames must come back with their mean."""
    u8, _ = prepare_frames(smooth(), encoder_spec)
    info = encode(u8, tmp_path / "v.mp4", encoder_spec, FPS)
    back = read_video(tmp_path / "v.mp4", encoder_spec, frames=F, height=H, width=W, fps=FPS)
    assert back.shape == u8.shape
    assert abs(back.mean() - smooth().mean() * 255) < 2.0
    mse = np.mean((back.astype(float) - u8) ** 2)
    assert 10 * np.log10(255 ** 2 / mse) > 35.0  # stated bound for CRF 18 on smooth content
    assert info.frames == F and info.pix_fmt == "yuv420p"
    p = probe(tmp_path / "v.mp4")
    assert (p.color_primaries, p.color_trc, p.colorspace) == ("bt709", "bt709", "bt709")


def test_lossless_round_trip_is_bit_exact(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = dataclasses.replace(encoder_spec, lossless=True)
    u8, _ = prepare_frames(smooth(), spec)
    encode(u8, tmp_path / "v.mp4", spec, FPS)
    back = read_video(tmp_path / "v.mp4", spec, frames=F, height=H, width=W, fps=FPS)
    assert np.array_equal(back, u8)


def test_encoding_is_deterministic(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    u8, _ = prepare_frames(smooth(), encoder_spec)
    a = encode(u8, tmp_path / "a.mp4", encoder_spec, FPS)
    b = encode(u8, tmp_path / "b.mp4", encoder_spec, FPS)
    assert a.digest == b.digest


def hung_ffmpeg(tmp_path: Path, encoder_spec) -> Path:  # type: ignore[no-untyped-def]
    """A fake ffmpeg that answers ``-version`` like the real one, and otherwise hangs
    without reading its input (an encoder deadlocked on a bad GPU, a stuck mount)."""
    real = ffmpeg_binary(encoder_spec)
    fake = tmp_path / "hung-ffmpeg"
    fake.write_text(f'#!/bin/sh\ncase " $* " in *" -version "*) exec {real} "$@";; esac\n'
                    f'echo $$ > {tmp_path / "hung.pid"}\nexec sleep 600\n')
    fake.chmod(0o755)
    return fake


def test_a_hung_encoder_is_killed_after_a_timeout_derived_from_the_work(encoder_spec, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                         monkeypatch) -> None:
    """Regression (issue 22): ``encode`` gave ffmpeg no timeout, so a hung encoder hung the
    task for ever. The limit is a floor plus a per-pixel allowance (floor lowered here)."""
    import os
    import time


    spec = dataclasses.replace(encoder_spec, ffmpeg=str(hung_ffmpeg(tmp_path, encoder_spec)))
    assert tools.tool_timeout(F, H, W) == tools.TOOL_TIMEOUT_FLOOR_S + F * H * W * tools.TOOL_TIMEOUT_S_PER_PIXEL
    monkeypatch.setattr(tools, "TOOL_TIMEOUT_FLOOR_S", 2.0)
    u8, _ = prepare_frames(smooth(), spec)
    started = time.monotonic()
    with pytest.raises(E.ToolTimeoutError) as e:
        encode(u8, tmp_path / "v.mp4", spec, FPS)
    assert time.monotonic() - started < 15
    msg = str(e.value)
    assert str(tmp_path / "v.mp4") in msg and "hung-ffmpeg" in msg and "-progress pipe:1" in msg  # file, command
    assert "timeout" in msg and "encoder/ffmpeg" in msg  # why, and the fix
    assert not list(tmp_path.glob("v.mp4*")) and not list(tmp_path.glob(".tmp-*"))
    pid = int((tmp_path / "hung.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left running


def test_a_hung_encoder_outside_a_watched_task_is_bounded_by_the_stall_rule(encoder_spec,  # type: ignore[no-untyped-def]
                                                                           tmp_path: Path) -> None:
    """Issue 40: in a preparing job's calibration no watcher sees ffmpeg's progress, so a
    stall limit shorter than the work's timeout bounds ffmpeg, and the error says so."""
    import time

    spec = dataclasses.replace(encoder_spec, ffmpeg=str(hung_ffmpeg(tmp_path, encoder_spec)))
    assert tools.tool_timeout(F, H, W) > 3.0
    u8, _ = prepare_frames(smooth(), spec)
    started = time.monotonic()
    with pytest.raises(E.ToolTimeoutError, match=r"ran past its 3 s timeout \(fleet/stall_timeout_s: one encode"):
        encode(u8, tmp_path / "v.mp4", spec, FPS, stall_s=3.0)
    assert time.monotonic() - started < 15
    assert not list(tmp_path.glob("v.mp4*"))


def test_without_a_pidfd_a_write_succeeds_and_a_hung_encoder_is_still_killed(encoder_spec, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                             monkeypatch) -> None:
    """Where the OS gives no pidfd (another OS, a kernel before 5.3, a seccomp filter),
    ``run_tool`` waits on the tool's pipes instead: a write still verifies, and a hung
    encoder is still killed, reaped and reported."""
    import os
    import time


    monkeypatch.setattr(tools, "_pidfd", lambda pid: -1)
    u8, _ = prepare_frames(smooth(), encoder_spec)
    info = encode(u8, tmp_path / "ok.mp4", encoder_spec, FPS)
    assert info.frames == F and (tmp_path / "ok.mp4").is_file()
    spec = dataclasses.replace(encoder_spec, ffmpeg=str(hung_ffmpeg(tmp_path, encoder_spec)))
    monkeypatch.setattr(tools, "TOOL_TIMEOUT_FLOOR_S", 2.0)
    started = time.monotonic()
    with pytest.raises(E.ToolTimeoutError):
        encode(u8, tmp_path / "v.mp4", spec, FPS)
    assert time.monotonic() - started < 15
    assert not list(tmp_path.glob("v.mp4*"))
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "hung.pid").read_text()), 0)  # killed and reaped


def test_encode_reports_each_frame_as_progress(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The stall check sees an encode advance: ffmpeg's -progress lines and the frames it consumed."""
    from pairflow import progress

    notes: list[str] = []
    u8, _ = prepare_frames(smooth(), encoder_spec)
    with progress.reporting_to(notes.append):
        encode(u8, tmp_path / "v.mp4", encoder_spec, FPS)
    progress.report("after the block: goes nowhere")
    assert sum("consumed" in n for n in notes) == F  # one report per frame fed
    assert any(f"frame={F} of v.mp4" in n for n in notes), notes  # ffmpeg's own count, to the last frame
    assert "after the block" not in " ".join(notes)


def test_failed_encode_leaves_nothing_under_the_final_name(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    u8, _ = prepare_frames(smooth(), encoder_spec)
    bad = dataclasses.replace(encoder_spec, ffmpeg=str(tmp_path / "no-such-ffmpeg"))
    with pytest.raises(E.EncodeError):
        encode(u8, tmp_path / "v.mp4", bad, FPS)
    assert list(tmp_path.iterdir()) == []


def wrapped_ffmpeg(tmp_path: Path, encoder_spec, *, damage: bool, report_end: bool, code: int = 0) -> Path:  # type: ignore[no-untyped-def]
    """A stand-in ffmpeg (what a site's wrapper set as encoder/ffmpeg would be) that runs the
    real one, and after it has exited waits 0.2 s (the writer has checked the file by then
    when it saw the end report), then with ``damage`` flips 16 bytes inside the output's
    third frame, and exits ``code`` (or the real one's). Without ``report_end`` the real
    ffmpeg's progress lines (its end report) never reach the writer."""
    import sys

    script = tmp_path / "wrapped-ffmpeg"
    script.write_text(f"""#!{sys.executable}
import subprocess, sys, time
import av
argv = sys.argv[1:]
res = subprocess.run([{ffmpeg_binary(encoder_spec)!r}, *argv], stdout=None if {report_end} else subprocess.DEVNULL)
time.sleep(0.2)
if {damage}:
    out = next(a for a in argv if "/.tmp-" in a)
    with av.open(out) as c:
        third = [p for p in c.demux(c.streams.video[0]) if p.size][2]
        at = third.pos + third.size // 2
    with open(out, "r+b") as fh:
        fh.seek(at)
        data = fh.read(16)
        fh.seek(at)
        fh.write(bytes(b ^ 0xA5 for b in data))
sys.exit(res.returncode or {code})
""")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("report_end", [True, False], ids=["after-its-end-report", "no-end-report"])
def test_an_output_damaged_after_the_encoder_ends_is_refused(encoder_spec, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                             report_end: bool) -> None:
    """The writer checks the file while ffmpeg tears down (after its end report); bytes that
    change after that check (here: damaged once the encoder has exited) are checked again,
    and a damaged stream never reaches the final name. Without an end report the check runs
    after the exit."""
    spec = dataclasses.replace(encoder_spec, ffmpeg=str(wrapped_ffmpeg(tmp_path, encoder_spec, damage=True,
                                                                      report_end=report_end)))
    u8, _ = prepare_frames(smooth(), spec)
    with pytest.raises(E.CorruptVideoError, match="the stream is damaged"):
        encode(u8, tmp_path / "v.mp4", spec, FPS)
    assert not list(tmp_path.glob("v.mp4")) and not list(tmp_path.glob(".tmp-*"))
    # The same wrapper without the damage writes a video that verifies.
    spec = dataclasses.replace(encoder_spec, ffmpeg=str(wrapped_ffmpeg(tmp_path, encoder_spec, damage=False,
                                                                      report_end=report_end)))
    info = encode(u8, tmp_path / "v.mp4", spec, FPS)
    assert info.frames == F and info.digest == encode(u8, tmp_path / "w.mp4", encoder_spec, FPS).digest


def test_an_encoder_failing_after_its_end_report_is_an_encode_error(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """What the early check finds waits for the exit code: a failed encoder is an EncodeError."""
    spec = dataclasses.replace(encoder_spec, ffmpeg=str(wrapped_ffmpeg(tmp_path, encoder_spec, damage=True,
                                                                      report_end=True, code=3)))
    u8, _ = prepare_frames(smooth(), spec)
    with pytest.raises(E.EncodeError, match="exit 3"):
        encode(u8, tmp_path / "v.mp4", spec, FPS)
    assert not list(tmp_path.glob("v.mp4")) and not list(tmp_path.glob(".tmp-*"))


def test_a_write_reads_the_file_once_while_ffmpeg_ends_and_fsyncs_it_once(encoder_spec, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                        monkeypatch) -> None:
    """The decode-back check runs once, before ffmpeg's exit is seen (while it tears down),
    on the bytes it digests; one fsync on the file and one on the directory, no more; the
    file ffmpeg creates has the mode open() gives under the umask."""
    import os
    import stat

    from pairflow.media import video

    real_check, real_run, real_fsync = video._check_output, video.run_tool, os.fsync
    seen: list[str] = []
    state = {"running": False}

    def check(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append("during" if state["running"] else "after")
        return real_check(*args, **kwargs)

    def run(*args, **kwargs):  # type: ignore[no-untyped-def]
        state["running"] = True
        try:
            return real_run(*args, **kwargs)
        finally:
            state["running"] = False

    def fsync(fd: int) -> None:
        seen.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    monkeypatch.setattr(video, "_check_output", check)
    monkeypatch.setattr(video, "run_tool", run)
    monkeypatch.setattr(os, "fsync", fsync)
    u8, _ = prepare_frames(smooth(), encoder_spec)
    old = os.umask(0o027)
    try:
        info = encode(u8, tmp_path / "v.mp4", encoder_spec, FPS)
    finally:
        os.umask(old)
    assert seen == ["during", "fsync file", "fsync dir"]
    assert stat.S_IMODE((tmp_path / "v.mp4").stat().st_mode) == 0o640
    assert info.digest == video.digest_file(tmp_path / "v.mp4")
    assert info.bytes == (tmp_path / "v.mp4").stat().st_size
    data = (tmp_path / "v.mp4").read_bytes()
    with video._open(tmp_path / "v.mp4", data) as c:
        assert video._scan(c, tmp_path / "v.mp4", None)[0] == probe(tmp_path / "v.mp4")  # bytes == path


# ---------------------------------------------------------------- read guards on a bad corpus

def ff(spec, out: Path, *args: str) -> Path:  # type: ignore[no-untyped-def]
    subprocess.run([ffmpeg_binary(spec), "-hide_banner", "-loglevel", "error", "-y", *args, str(out)],
                   check=True, capture_output=True)
    return out


SRC = ["-f", "lavfi", "-i", f"testsrc2=size={W}x{H}:rate={FPS}", "-frames:v", str(F)]
CORPUS = {
    "hdr10_pq_10bit": (SRC + ["-vf", "setparams=color_primaries=bt2020:color_trc=smpte2084:colorspace=bt2020nc",
                              "-c:v", "libx265", "-x265-params", "log-level=error", "-pix_fmt", "yuv420p10le"],
                       E.HDRVideoError, "PQ"),
    "hlg_10bit": (SRC + ["-vf", "setparams=color_primaries=bt2020:color_trc=arib-std-b67:colorspace=bt2020nc",
                         "-c:v", "libx265", "-x265-params", "log-level=error", "-pix_fmt", "yuv420p10le"],
                  E.HDRVideoError, "HLG"),
    "sdr_10bit": (SRC + ["-vf", "setparams=color_primaries=bt709:color_trc=bt709:colorspace=bt709",
                         "-c:v", "libx264", "-pix_fmt", "yuv420p10le"], E.BitDepthError, "10-bit"),
    "bt2020_8bit": (SRC + ["-vf", "setparams=color_primaries=bt2020:color_trc=bt709:colorspace=bt2020nc",
                           "-c:v", "libx264", "-pix_fmt", "yuv420p"], E.GamutError, "BT.2020"),
    "yuv444": (SRC + ["-c:v", "libx264", "-pix_fmt", "yuv444p"], E.PixelFormatError, "yuv444p"),
    "odd_size": (["-f", "lavfi", "-i", f"testsrc=size=63x63:rate={FPS}", "-frames:v", str(F),
                  "-c:v", "ffv1", "-pix_fmt", "yuv444p"], E.GeometryError, "odd size 63x63"),
    "vfr": (SRC + ["-vf", "setpts='if(lt(N,4),N,N*3)/(8*TB)'", "-fps_mode", "vfr", "-c:v", "libx264",
                   "-pix_fmt", "yuv420p"], E.FrameRateError, "variable frame rate"),
    "audio_only": (["-f", "lavfi", "-i", "sine=duration=1", "-c:a", "aac"], E.MissingVideoError, "no video stream"),
    "short": (["-f", "lavfi", "-i", f"testsrc2=size={W}x{H}:rate={FPS}", "-frames:v", "5", "-vf",
               "setparams=color_primaries=bt709:color_trc=bt709:colorspace=bt709:range=tv", "-c:v", "libx264",
               "-pix_fmt", "yuv420p"], E.TruncatedVideoError, "5 frames decoded, 9 expected"),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_bad_corpus_is_rejected_with_its_own_error(encoder_spec, tmp_path: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    args, err, match = CORPUS[name]
    path = ff(encoder_spec, tmp_path / f"{name}.mkv" if name == "odd_size" else tmp_path / f"{name}.mp4", *args)
    with pytest.raises(err, match=match) as info:
        read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS)
    assert str(path) in str(info.value)


def test_zero_byte_and_absent_files(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "z.mp4").write_bytes(b"")
    with pytest.raises(E.MissingVideoError, match="zero bytes"):
        read_video(tmp_path / "z.mp4", encoder_spec, frames=F, height=H, width=W, fps=FPS)
    with pytest.raises(E.MissingVideoError, match="no such file"):
        read_video(tmp_path / "nope.mp4", encoder_spec, frames=F, height=H, width=W, fps=FPS)


def test_truncated_file_is_detected(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    u8, _ = prepare_frames(smooth(), encoder_spec)
    encode(u8, tmp_path / "v.mp4", encoder_spec, FPS)
    data = (tmp_path / "v.mp4").read_bytes()
    (tmp_path / "t.mp4").write_bytes(data[: len(data) // 2])
    with pytest.raises(E.TruncatedVideoError):
        read_video(tmp_path / "t.mp4", encoder_spec, frames=F, height=H, width=W, fps=FPS)


def test_a_byte_flip_in_the_containers_metadata_is_refused_as_corrupt(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Found by benchmarks/flip_rate.py (issue 40): a flip inside a metadata string (the
    ftyp box's major brand, which PyAV reads as container metadata) made PyAV raise a raw
    UnicodeDecodeError from av.open."""
    u8, _ = prepare_frames(smooth(), encoder_spec)
    encode(u8, tmp_path / "v.mp4", encoder_spec, FPS)
    data = bytearray((tmp_path / "v.mp4").read_bytes())
    assert data[4:8] == b"ftyp"
    data[9] = 0x9E  # the major brand's second byte: not UTF-8
    (tmp_path / "m.mp4").write_bytes(bytes(data))
    with pytest.raises(E.TruncatedVideoError, match="cannot be opened as a video .*'utf-8' codec can't decode"):
        read_video(tmp_path / "m.mp4", encoder_spec, frames=F, height=H, width=W, fps=FPS)


def test_size_and_rate_must_match_the_record(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    u8, _ = prepare_frames(smooth(), encoder_spec)
    encode(u8, tmp_path / "v.mp4", encoder_spec, FPS)
    with pytest.raises(E.GeometryError, match="size 64x64, expected 32x32"):
        read_video(tmp_path / "v.mp4", encoder_spec, frames=F, height=32, width=32, fps=FPS)
    with pytest.raises(E.FrameRateError, match="frame rate 8/1, expected 24/1"):
        read_video(tmp_path / "v.mp4", encoder_spec, frames=F, height=H, width=W, fps=24)


def test_tiny_pipeline_float_output_encodes_to_matching_mean(tiny_model: Path, encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pairflow.generation.generate import generate, load_pipeline
    from pairflow.plan.config import ArmSpec, GenerationSpec, ModelSpec

    pipe = load_pipeline(ModelSpec("embedded-tiny", tiny_model), "float32", 1)
    gen = GenerationSpec(frames=F, height=H, width=W, steps=3, guidance=5.0, fps=FPS, dtype="float32", threads=1)
    frames = generate(pipe, "a red fox", 0, ArmSpec("control", None), gen, 64).frames
    u8, _ = prepare_frames(frames, encoder_spec)
    encode(u8, tmp_path / "v.mp4", encoder_spec, FPS)
    back = read_video(tmp_path / "v.mp4", encoder_spec, frames=F, height=H, width=W, fps=FPS)
    assert abs(back.mean() - frames.mean() * 255) < 2.0, (back.mean(), frames.mean() * 255)


def test_empty_and_ragged_frame_lists_say_so(encoder_spec) -> None:  # type: ignore[no-untyped-def]
    """A list of frames (what some pipelines return) is checked as a list: an empty one is
    not "shape (0,)" and a ragged one is not numpy's bare ValueError."""
    with pytest.raises(E.FrameError, match="the frame list is empty"):
        prepare_frames([], encoder_spec)
    frames = [np.zeros((16, 16, 3), np.uint8)] * 3 + [np.zeros((16, 8, 3), np.uint8)]
    with pytest.raises(E.FrameError, match=r"ragged frame list: 4 frames of 2 different shapes.*\(16, 8, 3\) first at frame 3"):
        prepare_frames(frames, encoder_spec)
    out, _ = prepare_frames([np.full((16, 16, 3), 0.5, np.float32)] * 3, encoder_spec)
    assert out.shape == (3, 16, 16, 3) and out[0, 0, 0, 0] == 128


# ---------------------------------------------------------------- declared properties: the recipe's allow-list
#
# Each case starts from a video the recipe wrote and changes one declared property with
# ffmpeg (stream copy plus a bitstream filter or a container option where possible, so the
# coded pixels are the recipe's and only the declaration differs), or makes a clip with
# ffmpeg that differs from the recipe in that property alone.

TAGS = "setparams=color_primaries=bt709:color_trc=bt709:colorspace=bt709:range=tv"
LAVFI = ["-f", "lavfi", "-i", f"testsrc2=size={W}x{H}:rate={FPS}", "-frames:v", str(F)]
X264 = ["-c:v", "libx264", "-pix_fmt", "yuv420p"]


def bsf(option: str) -> tuple[list[str], list[str]]:
    return [], ["-c", "copy", "-bsf:v", f"h264_metadata={option}"]


DECLARED = {  # name: ((input options, output options), error, message fragment); input is the recipe's video
    "bt601_matrix": (bsf("matrix_coefficients=6"), E.ColourTagError, "colour matrix is 'smpte170m'"),
    "bt470bg_all_tags": (bsf("matrix_coefficients=5:colour_primaries=5:transfer_characteristics=6"),
                         E.ColourTagError, "colour matrix is 'bt470bg'"),
    "primaries_only": (bsf("colour_primaries=5"), E.ColourTagError, "colour primaries is 'bt470bg'"),
    "transfer_only": (bsf("transfer_characteristics=6"), E.ColourTagError, "transfer characteristics is 'smpte170m'"),
    "full_range_flag": (bsf("video_full_range_flag=1"), E.ColourTagError, "colour range is 'pc'"),
    "non_square_sar": (bsf("sample_aspect_ratio=4/3"), E.DisplayTransformError, "sample aspect ratio .* '4:3'"),
    "display_matrix_rotation": ((["-display_rotation", "90"], ["-c", "copy"]), E.DisplayTransformError,
                                "DISPLAYMATRIX"),
    "display_matrix_hflip": ((["-display_hflip"], ["-c", "copy"]), E.DisplayTransformError, "DISPLAYMATRIX"),
    "sei_display_orientation": (bsf("display_orientation=insert:rotate=90"), E.DisplayTransformError,
                                "DISPLAYMATRIX"),
    "sps_crop": (bsf("crop_right=16"), E.GeometryError, "size 48x64, expected 64x64"),
    "chroma_location_topleft": (bsf("chroma_sample_loc_type=2"), E.StreamPropertyError,
                                "chroma sample location .* is 'topleft'"),
    "chroma_location_center": (bsf("chroma_sample_loc_type=1"), E.StreamPropertyError, "is 'center'"),
    "edit_list": ((["-ss", "0.25"], ["-c", "copy"]), E.StreamPropertyError, "an edit list trims the stream"),
    "start_offset": ((["-itsoffset", "0.5"], ["-c", "copy"]), E.StreamPropertyError, "shown at 0.5 s, not 0"),
}
MADE = {  # name: (ffmpeg arguments, error, message fragment): clips made from a test source
    "untagged_ffmpeg_default": (LAVFI + X264, E.ColourTagError, r"colour matrix is none declared \(untagged\)"),
    "bt601_converted_and_tagged": (LAVFI + ["-vf", "scale=out_color_matrix=bt601:out_range=tv,setparams=color_primaries="
                                            "bt470bg:color_trc=smpte170m:colorspace=bt470bg:range=tv"] + X264,
                                   E.ColourTagError, "colour matrix is 'bt470bg'"),
    "full_range": (LAVFI + ["-vf", "scale=out_color_matrix=bt709:out_range=pc,setparams=color_primaries=bt709:"
                            "color_trc=bt709:colorspace=bt709:range=pc"] + X264, E.ColourTagError, "colour range is 'pc'"),
    "interlaced": (LAVFI + ["-vf", TAGS + ",setfield=tff", "-flags", "+ildct+ilme", "-x264-params",
                            "interlaced=1:tff=1"] + X264, E.StreamPropertyError, "field order"),
    "setsar": (LAVFI + ["-vf", TAGS + ",setsar=2/1"] + X264, E.DisplayTransformError, "'2:1'"),
    "hdr_metadata_on_sdr": (LAVFI + ["-vf", TAGS] + X264 + ["-x264-params", "mastering-display=G(13250,34500)"
                                                          "B(7500,3000)R(34000,16000)WP(15635,16450)L(10000000,1):cll=1000,400"],
                            E.ColourTagError, "CONTENT_LIGHT_LEVEL, MASTERING_DISPLAY_METADATA"),
    "stereo_frame_packing": (LAVFI + ["-vf", TAGS] + X264 + ["-x264-params", "frame-packing=3"],
                             E.DisplayTransformError, "STEREO3D"),
    "two_video_streams": (["-f", "lavfi", "-i", f"testsrc2=size={W}x{H}:rate={FPS}", "-f", "lavfi", "-i",
                           f"testsrc=size={W}x{H}:rate={FPS}", "-map", "0:v", "-map", "1:v", "-vf", TAGS,
                           "-frames:v", str(F)] + X264, E.StreamPropertyError, "streams is 'video, video'"),
    "audio_stream": (["-f", "lavfi", "-i", f"testsrc2=size={W}x{H}:rate={FPS}", "-f", "lavfi", "-i", "sine=duration=1",
                      "-map", "0:v", "-map", "1:a", "-vf", TAGS, "-frames:v", str(F), "-c:a", "aac"] + X264,
                     E.StreamPropertyError, "streams is 'video, audio'"),
}


@pytest.fixture
def recipe_video(tmp_path: Path, encoder_spec) -> Path:  # type: ignore[no-untyped-def]
    """A video the recipe wrote (the base every declared-property case alters)."""
    path = tmp_path / "recipe.mp4"
    u8, _ = prepare_frames(smooth(), encoder_spec)
    encode(u8, path, encoder_spec, FPS)
    return path


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_a_declared_property_the_recipe_does_not_write_is_refused(encoder_spec, recipe_video: Path, tmp_path: Path,
                                                                   name: str) -> None:  # type: ignore[no-untyped-def]
    (before, after), err, match = DECLARED[name]
    path = tmp_path / f"{name}.mp4"
    subprocess.run([ffmpeg_binary(encoder_spec), "-hide_banner", "-loglevel", "error", "-y", *before, "-i",
                    str(recipe_video), *after, str(path)], check=True, capture_output=True)
    with pytest.raises(err, match=match) as info:
        read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", sorted(MADE))
def test_a_clip_made_otherwise_than_the_recipe_is_refused(encoder_spec, tmp_path: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    args, err, match = MADE[name]
    path = ff(encoder_spec, tmp_path / f"{name}.mp4", *args)
    with pytest.raises(err, match=match) as info:
        read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS)
    assert str(path) in str(info.value) and "re-encode" in str(info.value).lower()


def test_untagged_input_names_the_retagging_fix(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = ff(encoder_spec, tmp_path / "u.mp4", *LAVFI, *X264)
    with pytest.raises(E.ColourTagError, match="h264_metadata=colour_primaries=1") as info:
        read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS)
    assert "never guesses an untagged matrix" in str(info.value)


def damaged(recipe_video: Path, tmp_path: Path) -> Path:
    """The recipe's video with 16 bytes flipped inside its third frame (size unchanged)."""
    import av

    with av.open(str(recipe_video)) as c:
        third = [p for p in c.demux(c.streams.video[0]) if p.size][2]
        at = third.pos + third.size // 2
    data = bytearray(recipe_video.read_bytes())
    data[at:at + 16] = bytes(b ^ 0xA5 for b in data[at:at + 16])
    (tmp_path / "d.mp4").write_bytes(bytes(data))
    return tmp_path / "d.mp4"


def test_a_stream_damaged_mid_file_is_refused_by_name_every_time(encoder_spec, recipe_video: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Regression: a few corrupted bytes mid-stream probed clean and decoded to different
    arrays on different reads. With error detection on, every read refuses it, alike."""
    path = damaged(recipe_video, tmp_path)
    messages = set()
    for _ in range(4):
        with pytest.raises(E.CorruptVideoError, match="the stream is damaged") as info:
            read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS)
        messages.add(str(info.value))
    assert len(messages) == 1 and str(path) in messages.pop()
    # ffmpeg with -xerror -err_detect explode refuses it too (the reference behaviour)
    res = subprocess.run([ffmpeg_binary(encoder_spec), "-hide_banner", "-loglevel", "error", "-xerror", "-err_detect",
                          "explode", "-i", str(path), "-f", "null", "-"], capture_output=True)
    assert res.returncode != 0


def test_decoding_is_in_process_exact_and_reproducible(encoder_spec, recipe_video: Path) -> None:  # type: ignore[no-untyped-def]
    """read_video's in-process decode equals the ffmpeg CLI's with the matrix and range stated
    explicitly, for both matrices, and two reads give the same bytes."""
    for matrix in ("bt709", "bt601"):
        out = subprocess.run([ffmpeg_binary(encoder_spec), "-hide_banner", "-loglevel", "error", "-i", str(recipe_video),
                              "-vf", f"scale=in_color_matrix={matrix}:in_range=tv", "-f", "rawvideo", "-pix_fmt", "rgb24",
                              "pipe:"], check=True, capture_output=True).stdout
        cli = np.frombuffer(out, np.uint8).reshape(F, H, W, 3)
        a = read_video(recipe_video, encoder_spec, frames=F, height=H, width=W, fps=FPS, matrix=matrix)
        b = read_video(recipe_video, encoder_spec, frames=F, height=H, width=W, fps=FPS, matrix=matrix)
        assert np.array_equal(a, cli) and np.array_equal(a, b), matrix
    bt709 = read_video(recipe_video, encoder_spec, frames=F, height=H, width=W, fps=FPS)
    bt601 = read_video(recipe_video, encoder_spec, frames=F, height=H, width=W, fps=FPS, matrix="bt601")
    assert np.abs(bt709.astype(int) - bt601).max() > 3  # the matrix really is applied


def test_the_recipe_declares_exactly_what_the_reader_allows(encoder_spec, recipe_video: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The allow-list is what the recipe writes: both the lossy and the lossless recipe's
    videos pass every declared property, with nothing unexplained."""
    from pairflow.media.video import recipe_declaration

    lossless = dataclasses.replace(encoder_spec, lossless=True)
    u8, _ = prepare_frames(smooth(), lossless)
    encode(u8, tmp_path / "l.mp4", lossless, FPS)
    for path, pix_fmt in ((recipe_video, "yuv420p"), (tmp_path / "l.mp4", "gbrp")):
        info, allowed = probe(path), recipe_declaration(pix_fmt)
        for name, values in allowed.items():
            seen = getattr(info, name)
            assert (set(seen) <= set(values)) if name == "side_data" else (
                tuple(seen) == values if name == "streams" else seen in values), (path, name, seen)
        assert info.corrupt == "" and info.rotation == 0 and info.frames == F


def test_declaring_what_the_recipe_implies_is_accepted(encoder_spec, recipe_video: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Stating H.264's defaults explicitly (chroma location left, SAR 1:1) changes no pixel,
    so the allow-list accepts it and the frames are the recipe video's."""
    path = tmp_path / "explicit.mp4"
    subprocess.run([ffmpeg_binary(encoder_spec), "-hide_banner", "-loglevel", "error", "-y", "-i", str(recipe_video),
                    "-c", "copy", "-bsf:v", "h264_metadata=chroma_sample_loc_type=0:sample_aspect_ratio=1/1", str(path)],
                   check=True, capture_output=True)
    info = probe(path)
    assert (info.chroma_location, info.sar) == ("left", "1:1")
    assert np.array_equal(read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS),
                          read_video(recipe_video, encoder_spec, frames=F, height=H, width=W, fps=FPS))


def test_a_stream_that_changes_size_mid_file_is_refused(encoder_spec, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two recipe-tagged H.264 streams of different sizes joined into one file (the second
    SPS in-band): refused by name, never reshaped."""
    parts = []
    for i, (size, n) in enumerate((("64x64", 5), ("64x48", 4))):
        parts.append(ff(encoder_spec, tmp_path / f"{i}.h264", "-f", "lavfi", "-i", f"testsrc2=size={size}:rate={FPS}",
                        "-frames:v", str(n), "-vf", TAGS, *X264, "-bsf:v", "h264_mp4toannexb", "-f", "h264"))
    (tmp_path / "joined.h264").write_bytes(b"".join(p.read_bytes() for p in parts))
    path = ff(encoder_spec, tmp_path / "joined.mp4", "-r", str(FPS), "-i", str(tmp_path / "joined.h264"), "-c", "copy")
    with pytest.raises(E.GeometryError, match="change size or pixel format mid-stream: 64x64 yuv420p from frame 0, "
                       r"64x48 yuv420p from frame \d"):
        read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS)


def test_another_container_is_refused(encoder_spec, recipe_video: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = ff(encoder_spec, tmp_path / "v.mkv", "-i", str(recipe_video), "-c", "copy")
    with pytest.raises(E.StreamPropertyError, match="container format is 'matroska,webm'"):
        read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS)


# ---------------------------------------------------------------- one reading of every colour tag
#
# An MP4 states its colour twice: in the H.264 stream (the SPS's VUI) and in the container
# (the sample entry's colr box). ffmpeg's decoder takes the stream's tag where it states one
# and the container's otherwise, so each case is checked by source. Every case starts from one
# untagged stream converted with the BT.709 limited-range matrix, then tags it by stream copy
# (the coded pixels stay the same): in the stream with h264_metadata, in the container with
# the -color_* options (the mov muxer writes them into colr; the bitstream filter does not).

BT709_STREAM = "h264_metadata=colour_primaries=1:transfer_characteristics=1:matrix_coefficients=1:video_full_range_flag="
BT709_BOX = ["-color_primaries", "bt709", "-color_trc", "bt709", "-colorspace", "bt709"]
SPS709 = {"primaries": {1}, "transfer": {1}, "matrix": {1}}
BOX709 = {"kind": "nclx", "primaries": 1, "transfer": 1, "matrix": 1}
SOURCES = {  # name: (stream copy options, what ffmpeg reads: (SPS fields, colr boxes), None or (error, message))
    "container_only": ([*BT709_BOX, "-color_range", "tv"], ({}, [{**BOX709, "full_range": 0}]), None),
    "stream_only": (["-bsf:v", BT709_STREAM + "0"], ({**SPS709, "full_range": {0}}, []), None),
    "both_agree": (["-bsf:v", BT709_STREAM + "0", *BT709_BOX, "-color_range", "tv"],
                   ({**SPS709, "full_range": {0}}, [{**BOX709, "full_range": 0}]), None),
    "range_disagrees": (["-bsf:v", BT709_STREAM + "0", *BT709_BOX, "-color_range", "pc"],
                        ({**SPS709, "full_range": {0}}, [{**BOX709, "full_range": 1}]),
                        (E.ColourTagError, "colour range is 'tv' and 'pc': the H.264 stream .* declares 'tv' and the "
                                           "MP4 container .* declares 'pc'.* The two disagree")),
    "matrix_disagrees": (["-bsf:v", BT709_STREAM + "0", *BT709_BOX[:4], "-colorspace", "smpte170m", "-color_range", "tv"],
                         ({**SPS709, "full_range": {0}}, [{**BOX709, "matrix": 6, "full_range": 0}]),
                         (E.ColourTagError, "colour matrix is 'bt709' and 'smpte170m': the H.264 stream .* declares "
                                            "'bt709' and the MP4 container .* declares 'smpte170m'.* The two disagree")),
    "container_full_range_stream_untagged": (  # the case: decoded as limited range, 20 levels off
        [*BT709_BOX, "-color_range", "pc"], ({}, [{**BOX709, "full_range": 1}]),
        (E.ColourTagError, "colour range is 'pc': the H.264 stream .* declares none and the MP4 container .* "
                           "declares 'pc'")),
    "container_bt601_stream_untagged": (
        [*BT709_BOX[:4], "-colorspace", "smpte170m", "-color_range", "tv"], ({}, [{**BOX709, "matrix": 6, "full_range": 0}]),
        (E.ColourTagError, "colour matrix is 'smpte170m': the H.264 stream .* declares none and the MP4 container .* "
                           "declares 'smpte170m'")),
    "container_only_pq": ([*BT709_BOX[:2], "-color_trc", "smpte2084", *BT709_BOX[4:], "-color_range", "tv"],
                          ({}, [{**BOX709, "transfer": 16, "full_range": 0}]),
                          (E.HDRVideoError, "HDR transfer PQ .*the MP4 container .*: 'smpte2084'")),
    "stream_only_full_range": (["-bsf:v", BT709_STREAM + "1"], ({**SPS709, "full_range": {1}}, []),
                               (E.ColourTagError, "colour range is 'pc': the H.264 stream .* declares 'pc' and the MP4 "
                                                  "container .* declares none")),
}


@pytest.fixture
def untagged_bt709(encoder_spec, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """An H.264 stream converted with the BT.709 limited-range matrix that states no colour
    anywhere (setparams clears the frames' tags, so neither the SPS nor a colr box has one)."""
    return ff(encoder_spec, tmp_path / "untagged.mp4", *LAVFI, "-vf", "scale=out_color_matrix=bt709:out_range=tv,"
              "setparams=color_primaries=unknown:color_trc=unknown:colorspace=unknown:range=unknown", *X264)


def by_source(encoder_spec, untagged: Path, name: str) -> Path:  # type: ignore[no-untyped-def]
    """The SOURCES case ``name`` made from ``untagged``, checked to carry what the case claims
    as ffmpeg's own parsers read it (its SPS parser and its mov demuxer)."""
    from conftest import ffmpeg_colour_reading

    options, claimed, _ = SOURCES[name]
    path = ff(encoder_spec, untagged.with_name(f"{name}.mp4"), "-i", str(untagged), "-c", "copy", *options)
    assert ffmpeg_colour_reading(ffmpeg_binary(encoder_spec), path) == claimed, name
    return path


@pytest.mark.parametrize("name", sorted(n for n, case in SOURCES.items() if case[2] is not None))
def test_a_colour_tag_one_source_states_otherwise_is_refused_naming_both(encoder_spec, untagged_bt709: Path,  # type: ignore[no-untyped-def]
                                                                       name: str) -> None:
    """Regression (issue 40): an MP4 whose colr box says full range or BT.601 while the
    stream states nothing, or something else, was accepted and decoded by the stream's tag."""
    path = by_source(encoder_spec, untagged_bt709, name)
    err, match = SOURCES[name][2]  # type: ignore[misc]
    with pytest.raises(err, match=match) as info:
        read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS)
    message = str(info.value)
    assert str(path) in message and ("re-encode" in message.lower() or "re-render" in message.lower())
    assert "H.264 stream" in message and "MP4 container" in message


def test_the_recipe_tags_stated_by_either_source_or_both_read_alike(encoder_spec, untagged_bt709: Path) -> None:  # type: ignore[no-untyped-def]
    """BT.709 limited range stated by the container alone, the stream alone or both is one
    reading: accepted, decoded to the same frames, and probed as each source states it."""
    from pairflow.media.probe import COLOUR_TAGS

    recipe_tags = dict(zip(COLOUR_TAGS, ("bt709", "tv", "bt709", "bt709"), strict=True))
    unknown = dict.fromkeys(COLOUR_TAGS, "unknown")
    frames = {}
    for name, stream, container in (("container_only", unknown, recipe_tags), ("stream_only", recipe_tags, unknown),
                                    ("both_agree", recipe_tags, recipe_tags)):
        path = by_source(encoder_spec, untagged_bt709, name)
        info = probe(path)
        assert (dict(info.stream_colour), dict(info.container_colour)) == (stream, container), name
        assert (info.colorspace, info.color_range, info.color_primaries, info.color_trc) == tuple(recipe_tags.values())
        frames[name] = read_video(path, encoder_spec, frames=F, height=H, width=W, fps=FPS)
    assert all(np.array_equal(f, frames["both_agree"]) for f in frames.values())
    with pytest.raises(E.ColourTagError, match="none declared"):  # and stated by neither: untagged, refused
        read_video(untagged_bt709, encoder_spec, frames=F, height=H, width=W, fps=FPS)


def test_an_icc_profile_in_the_container_is_refused(encoder_spec, recipe_video: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A colr box of type 'prof' (an ICC profile) instead of nclx: a colour declaration the
    recipe never writes (the box is retyped in place, so nothing else changes). ffmpeg hands
    the profile to every frame as side data, refused first; the container's reading names it too."""
    data = recipe_video.read_bytes()
    assert data.count(b"colrnclx") == 1
    (tmp_path / "icc.mp4").write_bytes(data.replace(b"colrnclx", b"colrprof"))
    with pytest.raises(E.ColourTagError, match="frame side data ICC_PROFILE"):
        read_video(tmp_path / "icc.mp4", encoder_spec, frames=F, height=H, width=W, fps=FPS)
    assert dict(probe(tmp_path / "icc.mp4").container_colour)["color_primaries"] == "ICC profile (prof)"

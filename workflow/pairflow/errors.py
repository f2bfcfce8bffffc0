"""Every error PairFlow raises on purpose. Each message names the value, where it came
from and the fix; the CLI turns any of them into exit code 3 (see ``cli``).

    PairFlowError
    ├── ConfigError            the study config or a prompt sheet is wrong
    ├── FrameError             frames handed to the encoder are unusable (dtype, range, NaN, shape)
    ├── EncodeError            the ffmpeg encode failed or its output did not verify
    ├── ToolTimeoutError       an external tool (ffmpeg) ran past the timeout its work allows
    ├── VideoReadError         a video on disk is unfit for scoring
    │   ├── MissingVideoError      zero bytes, absent, or no video stream
    │   ├── TruncatedVideoError    decodes to fewer frames than recorded, or fails mid-stream
    │   │   └── CorruptVideoError      the decoder's error detection fails a packet or frame
    │   ├── HDRVideoError          PQ (SMPTE ST 2084) or HLG (ARIB STD-B67) transfer
    │   ├── GamutError             BT.2020 primaries or matrix
    │   ├── BitDepthError          more than 8 bits per sample
    │   ├── PixelFormatError       a pixel format other than the recipe's
    │   ├── FrameRateError         variable or unexpected frame rate
    │   ├── GeometryError          size or frame count differs from the record
    │   └── StreamPropertyError    a declared stream property the recipe does not write (codec, streams,
    │       │                      interlacing, timing, edit list, side data)
    │       ├── ColourTagError         a colour matrix, range, primaries or transfer other than the recipe's,
    │       │                          or none declared
    │       └── DisplayTransformError  a display matrix (rotation, flip), non-square pixels, a stereo or
    │                                  spherical layout
    ├── IntegrityError         a digest does not match (record, video, archive)
    │   ├── RecordSchemaError      a record or manifest does not fit its kind's schema (workflow/schemas/)
    │   └── WeightDigestError      a mirrored weight file differs from the mirror's lock
    ├── WeightsError           no weight mirror, no lock, a weight file missing from it, or one that
    │                          does not fill its model
    │   └── WeightDigestError      (also an IntegrityError)
    ├── ScoringError           a metric cannot score these frames (too few, too small)
    ├── ModelBuildError        a loaded pipeline component is not the class it must be
    ├── PairingError           a pair lacks a partner or its arms are not comparable
    ├── StatsError             a statistic was asked of too little data (fewer than 2 pairs, a zero effect)
    ├── ArchiveError           promotion would overwrite different bytes, or escape its tree
    ├── StorageError           the file system is full (or over quota) while writing
    ├── TaskFailedError        a fanned-out task still failed after its retries (classified in a failure record)
    ├── TaskError              a task's non-PairFlow exception as the driver receives it (type, message, traceback)
    ├── StalledError           no task finished and no worker reported for ``fleet/stall_timeout_s``
    ├── InterchangeLostError   the job's Parsl interchange ended while its tasks were unfinished
    ├── LockError              another run holds the folder this job writes (a panel job: that panel's
    │                          folder; the timed pass and study statistics: the study folder)
    ├── CalibrationError       the calibration table is missing, stale (another key) or unreadable
    ├── BudgetError            the study's estimated slot-hours exceed ``fleet/budget_gpu_hours``
    ├── ProcessError           the OS refused a process operation PairFlow needs (the parent-death signal)
    └── SchedulerError         a Slurm command is missing, failed or did not answer, or the site
        │                      asked for (``fleet/site``) is not where the job runs
        └── AcceleratorError       the job's accelerator sources (CUDA_VISIBLE_DEVICES,
                                   NVIDIA_VISIBLE_DEVICES, torch) disagree
"""

from __future__ import annotations


class PairFlowError(Exception):
    """Base of every deliberate PairFlow error."""


class ConfigError(PairFlowError):
    """The study config or a prompt sheet is invalid."""


class FrameError(PairFlowError):
    """Frames given to the encoder are unusable."""


class EncodeError(PairFlowError):
    """ffmpeg failed, or its output failed verification."""


class ToolTimeoutError(PairFlowError):
    """An external tool (ffmpeg) ran longer than its timeout, derived from the work it was
    given (``video.tool_timeout``); it was killed."""


class VideoReadError(PairFlowError):
    """A video on disk cannot be scored as it is."""


class MissingVideoError(VideoReadError):
    """The file is absent, empty, or has no video stream."""


class TruncatedVideoError(VideoReadError):
    """The file ends early or fails to decode."""


class CorruptVideoError(TruncatedVideoError):
    """The decoder's error detection (``err_detect=explode``) fails a packet or flags a
    frame corrupt: the stream is damaged mid-file."""


class HDRVideoError(VideoReadError):
    """The file has an HDR transfer function (PQ or HLG)."""


class GamutError(VideoReadError):
    """The file uses BT.2020 primaries or matrix."""


class BitDepthError(VideoReadError):
    """The file stores more than 8 bits per sample."""


class PixelFormatError(VideoReadError):
    """The file's pixel format is not the recipe's."""


class FrameRateError(VideoReadError):
    """The frame rate is variable or not the recorded one."""


class GeometryError(VideoReadError):
    """Size or frame count differs from the record."""


class StreamPropertyError(VideoReadError):
    """A stream declares a property that changes the decoded pixels and that the fixed
    encoder recipe does not write (the reader's allow-list, ``video.recipe_declaration``)."""


class ColourTagError(StreamPropertyError):
    """The colour matrix, range, primaries or transfer is not the recipe's, or is not declared."""


class DisplayTransformError(StreamPropertyError):
    """A display transform (display matrix: rotation or flip), non-square sample aspect
    ratio, or a stereo / spherical layout."""


class IntegrityError(PairFlowError):
    """A digest does not match what was recorded."""


class RecordSchemaError(IntegrityError):
    """A record or manifest does not fit the JSON Schema of its kind (a missing field,
    a value outside its enum, a wrong type); the message names the file, the field's
    path, the value and the fix."""


class WeightsError(PairFlowError):
    """A scorer's weight file is not available from the offline mirror."""


class WeightDigestError(WeightsError, IntegrityError):
    """A mirrored weight file's bytes differ from the digest in the mirror's lock."""


class ScoringError(PairFlowError):
    """A metric cannot score the frames it was given (too few frames, frames too small)."""


class PairingError(PairFlowError):
    """Records cannot be paired or compared."""


class StatsError(PairFlowError):
    """A statistic cannot be computed from what it was given (too few pairs, a zero target effect)."""


class SchedulerError(PairFlowError):
    """A Slurm command (scontrol) is missing, failed or timed out inside a job, or the
    site named by ``fleet/site`` is not where the job runs."""


class AcceleratorError(SchedulerError):
    """The accelerators a job was granted disagree between their sources
    (``CUDA_VISIBLE_DEVICES``, ``NVIDIA_VISIBLE_DEVICES``, what torch reports)."""


class ArchiveError(PairFlowError):
    """Promotion to work storage was refused."""


class StorageError(PairFlowError):
    """No space left (or quota exceeded) while writing; nothing was left under a final name."""


class LockError(PairFlowError):
    """Another run holds the folder this job writes. The lock is per folder, not per results
    tree: a panel job (and ``pairflow rerun-panel``) locks that panel's folder, the timed pass
    and the study statistics lock the study folder, so two runs may write different panels
    of one tree but never the same panel."""


class ProcessError(PairFlowError):
    """The operating system refused a process operation PairFlow relies on (arming the
    kernel's parent-death signal for a pool's interchange)."""


class ModelBuildError(PairFlowError):
    """A loaded pipeline or component is not of the class PairFlow needs (a checkpoint whose
    ``model_index.json`` names other classes, or a broken diffusers install)."""


class CalibrationError(PairFlowError):
    """The calibration table is missing, was made for another key, or cannot be read."""


class BudgetError(PairFlowError):
    """The study's estimate exceeds ``fleet/budget_gpu_hours``; names the drivers of the cost."""


class TaskFailedError(PairFlowError):
    """Tasks still failed after their retries; each left a classified failure record."""


class TaskError(PairFlowError):
    """A task's exception that was not a PairFlowError, as the driver receives it.

    Parsl hands a task's exception (and its ``__cause__`` chain) back to the driver by
    pickling it; an exception whose class cannot be rebuilt from its ``args`` (ffmpeg-python's
    ``ffmpeg.Error`` among them) stops Parsl collecting results and the job waits forever.
    So tasks raise this instead: only strings, rebuilt from ``args``. ``exception`` is the
    original type's name, ``mro`` the names of its classes (for failure classification),
    ``remote_traceback`` the formatted traceback (cause chain included) from the worker.
    """

    def __init__(self, message: str, exception: str = "", mro: tuple[str, ...] = (),
                 remote_traceback: str = "") -> None:
        super().__init__(message, exception, tuple(mro), remote_traceback)
        self.exception = exception
        self.mro = tuple(mro)
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        return str(self.args[0])


class StalledError(PairFlowError):
    """No task finished and no worker reported progress within ``fleet/stall_timeout_s``."""


class InterchangeLostError(PairFlowError):
    """The job's Parsl interchange (the broker between the driver and its worker pools)
    ended while tasks were unfinished: nothing can reach a worker or come back, so the job
    stops at once instead of waiting out ``fleet/stall_timeout_s``."""

"""What an H.264 stream's sequence parameter sets declare that PyAV does not report alone.

The reader (``video``) refuses any declared property that changes decoded pixels and
that the recipe does not write. PyAV reports the sample aspect ratio and field order, but
not the chroma sample location (H.273 ``chroma_sample_loc_type``, which tells a decoder
where the 4:2:0 chroma samples sit), and it reports the colour tags (range, primaries,
transfer, matrix) only merged with the container's: the decoder starts from the values
of the MP4 ``colr`` box and overwrites each with the stream's where the stream states one,
so a disagreement between the two never shows (``mp4`` reads the container's). Both are
read here from every sequence parameter set: the ``avcC`` record in the container's
extradata and any SPS sent in-band with the packets. Parsing follows ITU-T H.264 section
7.3.2.1.1 (SPS) and E.1.1 (VUI) up to the chroma location fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

CHROMA_LOCATIONS = ("left", "center", "topleft", "top", "bottomleft", "bottom")
"""``chroma_sample_loc_type`` 0-5 by ffmpeg's names (0, ``left``, is H.264's default)."""
UNSET = "unset"
"""No chroma location declared: H.264's default, ``left`` (what the recipe writes)."""

_HIGH_PROFILES = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}
_SPS = 7


class _Bits:
    """An MSB-first bit reader over an RBSP (emulation-prevention bytes removed)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def u(self, n: int) -> int:
        value = 0
        for _ in range(n):
            byte = self.data[self.pos >> 3]  # IndexError past the end: a truncated SPS
            value = (value << 1) | ((byte >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return value

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("exp-Golomb code longer than 32 bits")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k % 2 else -(k // 2)


def _rbsp(nal: bytes) -> bytes:
    """The NAL unit's payload without its header byte and emulation-prevention bytes."""
    out, zeros = bytearray(), 0
    for b in nal[1:]:
        if zeros >= 2 and b == 3:
            zeros = 0
            continue
        out.append(b)
        zeros = zeros + 1 if b == 0 else 0
    return bytes(out)


@dataclass(frozen=True)
class SpsDeclaration:
    """What one SPS declares in its VUI. ``chroma_location``: ``UNSET`` or a name of
    ``CHROMA_LOCATIONS`` (``top/bottom`` field names joined by ``/`` when they differ).
    The colour tags are ITU-T H.273 code points, None where the SPS states nothing:
    ``full_range`` (``video_full_range_flag``, 0 limited, 1 full) needs
    ``video_signal_type_present_flag``; ``primaries``, ``transfer`` and ``matrix`` need
    ``colour_description_present_flag`` too (and may still be 2, "unspecified")."""

    chroma_location: str = UNSET
    full_range: int | None = None
    primaries: int | None = None
    transfer: int | None = None
    matrix: int | None = None


def sps_chroma_location(nal: bytes) -> str:
    """The chroma location one SPS NAL unit (header byte included) declares
    (``sps_declaration``). Raises ValueError or IndexError for an SPS that does not parse."""
    return sps_declaration(nal).chroma_location


def sps_declaration(nal: bytes) -> SpsDeclaration:
    """What one SPS NAL unit (header byte included) declares in its VUI. Raises ValueError
    or IndexError for an SPS that does not parse."""
    r = _Bits(_rbsp(nal))
    profile = r.u(8)
    r.u(16)  # constraint flags, level
    r.ue()  # seq_parameter_set_id
    if profile in _HIGH_PROFILES:
        chroma_format = r.ue()
        if chroma_format == 3:
            r.u(1)  # separate_colour_plane_flag
        r.ue(), r.ue(), r.u(1)  # bit depths, qpprime_y_zero_transform_bypass_flag
        if r.u(1):  # seq_scaling_matrix_present_flag
            for i in range(12 if chroma_format == 3 else 8):
                if r.u(1):
                    last = nxt = 8
                    for _ in range(16 if i < 6 else 64):
                        if nxt:
                            nxt = (last + r.se() + 256) % 256
                        last = nxt or last
    r.ue()  # log2_max_frame_num_minus4
    poc_type = r.ue()
    if poc_type == 0:
        r.ue()
    elif poc_type == 1:
        r.u(1), r.se(), r.se()
        for _ in range(r.ue()):
            r.se()
    r.ue(), r.u(1), r.ue(), r.ue()  # max_num_ref_frames, gaps flag, width and height in macroblocks
    if not r.u(1):  # frame_mbs_only_flag
        r.u(1)
    r.u(1)  # direct_8x8_inference_flag
    if r.u(1):  # frame_cropping_flag
        r.ue(), r.ue(), r.ue(), r.ue()
    if not r.u(1):  # vui_parameters_present_flag
        return SpsDeclaration()
    if r.u(1) and r.u(8) == 255:  # aspect_ratio_info_present_flag, aspect_ratio_idc (255: explicit)
        r.u(32)
    if r.u(1):  # overscan_info_present_flag
        r.u(1)
    full_range = primaries = transfer = matrix = None
    if r.u(1):  # video_signal_type_present_flag
        r.u(3)  # video_format
        full_range = r.u(1)
        if r.u(1):  # colour_description_present_flag
            primaries, transfer, matrix = r.u(8), r.u(8), r.u(8)
    location = UNSET
    if r.u(1):  # chroma_loc_info_present_flag
        top, bottom = r.ue(), r.ue()
        names = [CHROMA_LOCATIONS[t] if t < len(CHROMA_LOCATIONS) else f"type-{t}" for t in (top, bottom)]
        location = names[0] if top == bottom else "/".join(names)
    return SpsDeclaration(location, full_range, primaries, transfer, matrix)


def _avcc_nals(extradata: bytes) -> Iterator[bytes]:
    """The SPS NAL units of an ``avcC`` record (ISO/IEC 14496-15 5.3.3.1)."""
    if len(extradata) < 7 or extradata[0] != 1:
        return
    pos, count = 6, extradata[5] & 0x1F
    for _ in range(count):
        size = int.from_bytes(extradata[pos:pos + 2], "big")
        yield extradata[pos + 2:pos + 2 + size]
        pos += 2 + size


def _length_prefixed(data: bytes, length_size: int) -> Iterator[bytes]:
    pos = 0
    while pos + length_size <= len(data):
        size = int.from_bytes(data[pos:pos + length_size], "big")
        yield data[pos + length_size:pos + length_size + size]
        pos += length_size + size


def _annex_b(data: bytes) -> Iterator[bytes]:
    for chunk in data.split(b"\x00\x00\x01"):
        if chunk:
            yield chunk.rstrip(b"\x00")


def declarations(extradata: bytes | None, packets: Iterable[bytes]) -> list[SpsDeclaration | None]:
    """What every SPS of the stream declares (its ``avcC`` or Annex B extradata, then the
    in-band SPSs in ``packets``), in order; None for an SPS that does not parse."""
    extradata = extradata or b""
    avcc = bool(extradata) and extradata[0] == 1
    length_size = (extradata[4] & 3) + 1 if avcc and len(extradata) > 4 else 4
    nals = list(_avcc_nals(extradata) if avcc else _annex_b(extradata))
    for data in packets:
        nals.extend(_length_prefixed(data, length_size) if avcc else _annex_b(data))
    out: list[SpsDeclaration | None] = []
    for nal in nals:
        if nal and nal[0] & 0x1F == _SPS:
            try:
                out.append(sps_declaration(nal))
            except (ValueError, IndexError):
                out.append(None)
    return out


def chroma_location(extradata: bytes | None, packets: Iterable[bytes]) -> str:
    """Every chroma location the stream's SPSs declare (``declarations``), joined by ``|``
    when they differ; ``UNSET`` when none declares one, ``unparsable`` when an SPS does not
    parse (refused, being unknown)."""
    return chroma_locations(declarations(extradata, packets))


def chroma_locations(sps: Iterable[SpsDeclaration | None]) -> str:
    """``chroma_location`` of already parsed ``declarations``."""
    return "|".join(sorted({d.chroma_location if d is not None else "unparsable" for d in sps})) or UNSET

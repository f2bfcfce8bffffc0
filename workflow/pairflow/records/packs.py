"""Packs: many small evidence files in one sealed, compressed, indexed file.

A pack holds the files of one panel and part (its generation records, its score records
and statistics, its timing records and run files; ``archive.pack_group``) so that an
archived snapshot has a few files per panel, not three per candidate.

Format (``pairflow-pack`` version 1): a multi-member gzip file (RFC 1952), stdlib only.

    member 0            the index: one line of canonical JSON (format, version, group,
                        root, blocks, members)
    members 1..n        blocks: the member files' bytes concatenated in path order,
                        about ``BLOCK`` bytes of them per block

Why this and not a zip or Parquet: a record is 2-6 KB of JSON that differs from its
neighbours in a few digests, so it compresses about 2.5x alone (zip's per-member
deflate) and about 10x beside its neighbours; blocks of ~20 records keep deflate's 32 KB
window full while reading one record still inflates one block, never the whole pack.
Gzip members carry their own CRC-32, so a flipped bit is located to its block before the
member's own xxh3 digest is checked. Any gzip reader can inspect a pack (``zcat
pack | head -1`` prints its index), Python's stdlib reads and writes it, and putting the
index first means a truncated pack still names every member it lost.

Each index entry is ``[path, digest, block, start, length, record_digest, candidate_id]``
(the last two for PairFlow records, else null). The pack's ``root`` is the digest over
``{path: digest}``: over the files themselves, not the container, so the same files
packed with another block size or compressor have the same root. Packs are named by
their root (content addressed) and shared by every snapshot that holds those files.
Imports without torch.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from ..atomic import atomic_path, umask
from ..errors import IntegrityError
from ..identity import canonical_json, digest_bytes, digest_obj

FORMAT, VERSION = "pairflow-pack", 1
BLOCK = 1 << 17
"""Uncompressed bytes per block (128 KiB): reading one record inflates at most this much
(plus one record larger than it, which gets a block of its own)."""
SUFFIX = ".pfpack"
_INDEX_READ = 1 << 16


def files_root(digests: dict[str, str]) -> str:
    """The root of a set of files: the digest over ``{path: digest}`` (paths sorted by
    canonical JSON). Independent of how or whether the files are packed."""
    return digest_obj(dict(sorted(digests.items())))


CHUNK_LINES = 32
"""A chunk ends after a line whose xxh3_64 is 0 mod this: about 32 lines a chunk. Small,
because a rerun panel's few changed lines cost the whole chunks around them (about 3 KB
of a timing manifest at 32 lines, 11 KB at 128); the longer chunk lists this makes are
kept out of ``archive.json`` by an index (``archive.INDEXED_OVER``)."""
CHUNK_MAX = 1 << 20
"""A chunk is cut here whatever its lines (a file written as one long line)."""


def split_chunks(data: bytes) -> list[bytes]:
    """``data`` cut into content-defined chunks (their concatenation is ``data``): a chunk
    ends after a line whose hash is 0 mod ``CHUNK_LINES``, or at ``CHUNK_MAX`` bytes.
    The boundaries depend on the lines themselves, not on offsets, so an edit (one
    panel's lines of a study manifest changed, added or removed) changes only the chunks
    it touches and the rest are the same bytes as before, shared between snapshots."""
    chunks: list[bytes] = []
    buf = bytearray()
    for line in data.splitlines(keepends=True):
        buf += line
        if xxhash.xxh3_64_intdigest(line) % CHUNK_LINES == 0 or len(buf) >= CHUNK_MAX:
            chunks.append(bytes(buf))
            buf.clear()
    if buf:
        chunks.append(bytes(buf))
    return chunks


def _gzip(data: bytes) -> bytes:
    # Level 6: about twice as fast as 9 on records for a few percent more bytes. wbits 31:
    # a gzip member, with mtime 0 (the same files give the same bytes).
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def _record_keys(data: bytes) -> tuple[str | None, str | None]:
    """(record digest, candidate id) of a PairFlow record's bytes, else (None, None)."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return None, None
    if not isinstance(obj, dict) or not isinstance(obj.get("record_digest"), str):
        return None, None
    cand = obj.get("candidate")
    cid = cand.get("candidate_id") if isinstance(cand, dict) else None
    return obj["record_digest"], cid if isinstance(cid, str) else None


def write_pack(final: Path, group: str, members: Iterable[tuple[str, bytes]]) -> dict[str, Any]:
    """Pack ``members`` (path, bytes) into ``final``, atomically (temp name, fsync, rename:
    a kill leaves no file under ``final``), then drop its write bits. Returns the index.
    Raises IntegrityError for a path given twice."""
    entries: list[list[Any]] = []
    blocks: list[bytes] = []
    buf = bytearray()
    seen: set[str] = set()
    for rel, data in sorted(members, key=lambda m: m[0]):
        if rel in seen:
            raise IntegrityError(f"{final}: {rel} given twice to one pack; this is a bug in the caller")
        seen.add(rel)
        if buf and len(buf) + len(data) > BLOCK:
            blocks.append(_gzip(bytes(buf)))
            buf.clear()
        entries.append([rel, digest_bytes(data), len(blocks), len(buf), len(data), *_record_keys(data)])
        buf += data
    if buf:
        blocks.append(_gzip(bytes(buf)))
    offsets, at = [], 0
    for b in blocks:
        offsets.append([at, len(b)])
        at += len(b)
    index = {"format": FORMAT, "version": VERSION, "group": group,
             "root": files_root({e[0]: e[1] for e in entries}), "blocks": offsets, "members": entries}
    with atomic_path(Path(final)) as tmp, open(tmp, "wb") as fh:
        fh.write(_gzip(canonical_json(index) + b"\n"))
        for b in blocks:
            fh.write(b)
    os.chmod(final, 0o444 & ~umask())
    return index


@dataclass(frozen=True)
class Member:
    """One file in a pack: where its bytes are and what they hash to."""

    path: str
    digest: str
    block: int
    start: int
    length: int
    record_digest: str | None
    candidate_id: str | None


class Pack:
    """A pack opened for reading: the index is read and checked on open; member bytes
    are read one block at a time and checked against the index's digest.

    Raises IntegrityError naming the pack when the index is unreadable, is not a
    version-1 pack index, or disagrees with the pack (blocks outside the file, a root
    that is not over its members)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as fh:
                index, self.data_start = _read_index(fh, self.path)
                self.size = os.fstat(fh.fileno()).st_size
        except FileNotFoundError:
            raise IntegrityError(f"{self.path}: missing pack; the snapshots that list it cannot be read, "
                                 "retire them (pairflow archive retire <id> --why ...) and rerun") from None
        self.index = index
        try:
            self.group: str = index["group"]
            self.root: str = index["root"]
            self.blocks: list[tuple[int, int]] = [(int(o), int(n)) for o, n in index["blocks"]]
            self.members = {e[0]: Member(*e) for e in index["members"]}
        except (TypeError, ValueError) as e:
            raise IntegrityError(f"{self.path}: index disagrees with the pack format ({e}); the pack was "
                                 "altered, retire the snapshots that list it") from e
        self._check_index()

    def _check_index(self) -> None:
        fix = "the pack was altered or its index rewritten; retire the snapshots that list it"
        if files_root({m.path: m.digest for m in self.members.values()}) != self.root:
            raise IntegrityError(f"{self.path}: index disagrees with its pack: root {self.root} is not the "
                                 f"digest of the members it lists; {fix}")
        if len(self.members) != len(self.index["members"]):
            raise IntegrityError(f"{self.path}: index disagrees with its pack: a member is listed twice; {fix}")
        for m in self.members.values():
            if not (0 <= m.block < len(self.blocks) and m.start >= 0 and m.length >= 0):
                raise IntegrityError(f"{self.path}: index disagrees with its pack: member {m.path} lies in block "
                                     f"{m.block} at {m.start} (+{m.length}); the pack has {len(self.blocks)} "
                                     f"block(s); {fix}")
        end = 0
        for i, (off, n) in enumerate(self.blocks):
            if off != end or n <= 0:
                raise IntegrityError(f"{self.path}: index disagrees with its pack: block {i} at {off} "
                                     f"(+{n}) does not follow block {i - 1}; {fix}")
            end = off + n
        if self.data_start + end < self.size:  # (a shorter file is a truncated pack: its blocks say what it lost)
            raise IntegrityError(f"{self.path}: index disagrees with its pack: its blocks end at byte "
                                 f"{self.data_start + end}, the file has {self.size} (appended to); {fix}")

    def _inflate(self, fh: BinaryIO, block: int) -> bytes:
        off, n = self.blocks[block]
        fh.seek(self.data_start + off)
        raw = fh.read(n)
        if len(raw) < n:
            raise IntegrityError(f"block {block} is cut off: the index says it ends at byte "
                                 f"{self.data_start + off + n}, the pack ends at {self.size} (truncated)")
        try:
            d = zlib.decompressobj(31)
            out = d.decompress(raw)
            if not d.eof or d.unused_data:
                raise zlib.error("block does not end where the index says")
        except zlib.error as e:
            raise IntegrityError(f"block {block} at byte {self.data_start + off} does not inflate ({e})") from e
        return out

    def _cut(self, out: bytes, m: Member) -> bytes:
        data = out[m.start:m.start + m.length]
        if len(data) != m.length or digest_bytes(data) != m.digest:
            raise IntegrityError(f"bytes {m.start}..{m.start + m.length} of block {m.block} hash to "
                                 f"{digest_bytes(data)}, the index says {m.digest}")
        return data

    def read(self, path: str) -> bytes:
        """The bytes of member ``path``, checked against the index (one block inflated).
        Raises KeyError for a path the pack does not hold and IntegrityError naming the
        pack and the member when its block or bytes are damaged."""
        m = self.members[path]
        try:
            with open(self.path, "rb") as fh:
                return self._cut(self._inflate(fh, m.block), m)
        except IntegrityError as e:
            raise IntegrityError(f"{self.path}: member {path}: {e}; retire the snapshots that list this pack "
                                 "(pairflow archive retire <id> --why ...)") from e

    def items(self) -> Iterator[tuple[Member, bytes | IntegrityError]]:
        """Every member with its checked bytes (or the error that its block or digest
        raised), in block order: each block is inflated once."""
        by_block: dict[int, list[Member]] = {}
        for m in self.members.values():
            by_block.setdefault(m.block, []).append(m)
        with open(self.path, "rb") as fh:
            for b in range(len(self.blocks)):
                try:
                    out = self._inflate(fh, b)
                except IntegrityError as e:
                    for m in sorted(by_block.get(b, []), key=lambda m: m.start):
                        yield m, e
                    continue
                for m in sorted(by_block.get(b, []), key=lambda m: m.start):
                    try:
                        yield m, self._cut(out, m)
                    except IntegrityError as e:
                        yield m, e

    def verify(self) -> list[str]:
        """Inflate every block and check every member's digest. Returns [] or one line
        naming the pack, the first member that fails, why, and how many others fail."""
        bad = [(m, r) for m, r in self.items() if isinstance(r, IntegrityError)]
        if not bad:
            return []
        (m, err), more = bad[0], len(bad) - 1
        tail = f"; {more} more member(s) fail" if more else ""
        return [f"{self.path}: first failing record {m.path}: {err}{tail}; retire the snapshots that list "
                "this pack (pairflow archive retire <id> --why ...)"]


def _read_index(fh: BinaryIO, path: Path) -> tuple[dict[str, Any], int]:
    """The index (first gzip member) and the byte where the blocks start."""
    d = zlib.decompressobj(31)
    out, consumed = b"", 0
    try:
        while not d.eof:
            chunk = fh.read(_INDEX_READ)
            if not chunk:
                raise zlib.error("the file ends inside the index")
            out += d.decompress(chunk)
            consumed += len(chunk)
        consumed -= len(d.unused_data)
        index = json.loads(out)
    except (zlib.error, ValueError) as e:
        raise IntegrityError(f"{path}: pack index is unreadable ({e}); the pack was truncated or altered, "
                             "retire the snapshots that list it (pairflow archive retire <id> --why ...)") from e
    keys = {"format", "version", "group", "root", "blocks", "members"}
    if (not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION
            or not keys <= set(index)):
        raise IntegrityError(f"{path}: not a {FORMAT} version {VERSION} index (keys "
                             f"{sorted(index) if isinstance(index, dict) else type(index).__name__}); "
                             "this file was not written by this PairFlow, or was altered")
    return index, consumed

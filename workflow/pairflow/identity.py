"""Identity is data: xxh3 digests of canonical bytes, never Python's salted ``hash()``.

Digests are written as ``xxh3_128:<32 hex>`` so the algorithm travels with the value.
This module imports without torch.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import xxhash

ALGO = "xxh3_128"
_CHUNK = 1 << 22


def canonical_json(obj: Any) -> bytes:
    """Serialise ``obj`` as compact, key-sorted UTF-8 JSON (the bytes that get hashed)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def digest_bytes(data: bytes | memoryview) -> str:
    """``xxh3_128:<hex>`` of ``data`` (any contiguous buffer)."""
    return f"{ALGO}:{xxhash.xxh3_128_hexdigest(data)}"


def digest_obj(obj: Any) -> str:
    """Digest of ``canonical_json(obj)``."""
    return digest_bytes(canonical_json(obj))


def digest_file(path: Path) -> str:
    """Streamed ``xxh3_128`` digest of a file's bytes."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return f"{ALGO}:{h.hexdigest()}"


def digest_tree(root: Path) -> dict[str, str]:
    """Digest of every regular file under ``root``, keyed by POSIX relative path, sorted."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): digest_file(p)
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@dataclass(frozen=True)
class CandidateKey:
    """What makes a candidate: one (panel, prompt, seed) under one arm of one study.

    ``arm_digest`` and ``model_digest`` bind the arm's cache config and the model spec,
    so changing either gives new ids; ``prompt_digest`` binds the prompt text.
    """

    study: str
    panel: str
    prompt_id: str
    prompt_digest: str
    seed: int
    arm: str
    arm_digest: str
    model_digest: str

    @functools.cached_property
    def candidate_id(self) -> str:
        """Digest of every field: the candidate's identity (computed once per key)."""
        return digest_obj({f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def pair_key(self) -> tuple[str, str, int]:
        """(panel, prompt id, seed): the unit shared by all arms of a pair."""
        return (self.panel, self.prompt_id, self.seed)

    @property
    def stream_seed(self) -> int:
        """The generator seed: derived from (study, panel, prompt, seed, model) only, so
        every arm of a pair replays the same random stream."""
        fields = [self.study, self.panel, self.prompt_id, self.prompt_digest, self.seed,
                  self.model_digest]
        return xxhash.xxh3_64_intdigest(canonical_json(fields)) & 0x7FFF_FFFF_FFFF_FFFF


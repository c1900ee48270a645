"""Chained block keys for the prefix cache, with a selectable hash function."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Callable, Sequence

import xxhash

# A hash function maps (parent key or None, the block's token ids, extra keys) to an int.
HashFunction = Callable[[int | None, Sequence[int], tuple | None], int]


@dataclass(slots=True, frozen=True)
class BlockHash:
    """A full block's cache key plus what it was computed from, to confirm hits."""

    value: int
    parent: int | None
    token_ids: tuple[int, ...]
    extra_keys: tuple | None = None


def _to_bytes(parent: int | None, token_ids: Sequence[int], extra: tuple | None) -> bytes:
    head = struct.pack("<q", -1 if parent is None else parent & 0x7FFF_FFFF_FFFF_FFFF)
    body = struct.pack(f"<{len(token_ids)}I", *token_ids)
    if extra:
        return head + body + repr(extra).encode()
    return head + body


def xxhash64(parent: int | None, token_ids: Sequence[int], extra: tuple | None) -> int:
    """xxh3-64 of the packed inputs: fast, the default."""
    return xxhash.xxh3_64_intdigest(_to_bytes(parent, token_ids, extra))


def sha256_64(parent: int | None, token_ids: Sequence[int], extra: tuple | None) -> int:
    """The first 8 bytes of SHA-256 of the packed inputs: slower, cryptographic spread."""
    return int.from_bytes(hashlib.sha256(_to_bytes(parent, token_ids, extra)).digest()[:8], "little")


def builtin_hash(parent: int | None, token_ids: Sequence[int], extra: tuple | None) -> int:
    """Python's tuple hash: fastest, stable within one process only."""
    return hash((parent, tuple(token_ids), extra))


HASH_FUNCTIONS: dict[str, HashFunction] = {
    "xxhash": xxhash64,
    "sha256": sha256_64,
    "builtin": builtin_hash,
}


def get_hash_function(name_or_fn: str | HashFunction) -> HashFunction:
    """Resolve a hash function by name (xxhash, sha256, builtin) or pass a callable through."""
    if callable(name_or_fn):
        return name_or_fn
    try:
        return HASH_FUNCTIONS[name_or_fn]
    except KeyError:
        from ..errors import InvalidConfigError

        raise InvalidConfigError("prefix_caching_hash_algo", name_or_fn,
                                 " or ".join(sorted(HASH_FUNCTIONS))) from None


def hash_block(fn: HashFunction, parent: int | None, token_ids: Sequence[int],
               extra_keys: tuple | None) -> BlockHash:
    """Key one full block given its parent's key."""
    tokens = tuple(token_ids)
    return BlockHash(fn(parent, tokens, extra_keys), parent, tokens, extra_keys)

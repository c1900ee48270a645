"""Chained block keys for the prefix cache, with a selectable hash function."""

from __future__ import annotations

import hashlib
from array import array
from typing import Callable, NamedTuple, Sequence

import xxhash

# A hash function maps (parent key or None, the block's token ids, extra keys) to an int.
HashFunction = Callable[[int | None, Sequence[int], tuple | None], int]


class BlockHash(NamedTuple):
    """A full block's cache key plus what it was computed from, to confirm hits.

    A NamedTuple rather than a frozen dataclass: one is built per full block on the
    prefix-cache hot path, and tuple construction and equality run in C.
    """

    value: int
    parent: int | None
    token_ids: tuple[int, ...]
    extra_keys: tuple | None = None


def _to_bytes(token_ids: Sequence[int], extra: tuple | None) -> bytes:
    body = array("I", token_ids).tobytes()
    return body + repr(extra).encode() if extra else body


def _seed(parent: int | None) -> int:
    # Chaining through the seed hashes (parent, tokens) without concatenating bytes.
    return 0 if parent is None else parent & 0xFFFF_FFFF_FFFF_FFFF


def xxhash64(parent: int | None, token_ids: Sequence[int], extra: tuple | None) -> int:
    """xxh3-64 of the packed inputs: fast, the default."""
    return xxhash.xxh3_64_intdigest(_to_bytes(token_ids, extra), _seed(parent))


def sha256_64(parent: int | None, token_ids: Sequence[int], extra: tuple | None) -> int:
    """The first 8 bytes of SHA-256 of the packed inputs: slower, cryptographic spread."""
    data = _seed(parent).to_bytes(8, "little") + _to_bytes(token_ids, extra)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


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

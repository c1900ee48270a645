"""Chained prefix-cache block keys and their hash functions."""

from __future__ import annotations

import hashlib
import struct
from array import array
from typing import Callable, NamedTuple, Sequence

import xxhash

# (parent value or None, token ids, extra keys) -> int.
HashFunction = Callable[[int | None, Sequence[int], tuple | None], int]


class BlockHash(NamedTuple):
    """A full block's cache key: value, parent key object, contents.

    Hits are confirmed by parent identity, so colliding prefixes never share one;
    a NamedTuple, built per block in C.
    """

    value: int
    parent: BlockHash | None
    token_ids: tuple[int, ...]
    extra_keys: tuple | None = None

    # Tuple equality, hash and repr would recurse through the prefix.
    def __eq__(self, other: object) -> bool:
        """True when both keys name the same prefix."""
        a, b = self, other
        while a is not b:
            if not isinstance(a, BlockHash) or not isinstance(b, BlockHash):
                return False
            if a[0] != b[0] or a[2] != b[2] or a[3] != b[3]:
                return False
            a, b = a[1], b[1]
        return True

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self[0])

    def __reduce__(self):
        chain = []
        key: BlockHash | None = self
        while key is not None:
            chain.append((key[0], key[2], key[3]))
            key = key[1]
        chain.reverse()
        return _rebuild_chain, (chain,)

    def __repr__(self) -> str:
        parent = None if self[1] is None else self[1][0]
        return (f"BlockHash(value={self[0]}, parent_value={parent}, token_ids={self[2]}, "
                f"extra_keys={self[3]})")


def _rebuild_chain(chain: list[tuple[int, tuple[int, ...], tuple | None]]) -> BlockHash | None:
    """Unpickle a flattened chain without recursion."""
    key = None
    for value, token_ids, extra in chain:
        key = BlockHash(value, key, token_ids, extra)
    return key


_PACKERS: dict[int, struct.Struct] = {}


def _to_bytes(token_ids: Sequence[int], extra: tuple | None) -> bytes:
    # array("I", ids) bytes via a cached Struct (about 2x faster).
    n = len(token_ids)
    packer = _PACKERS.get(n)
    if packer is None:
        packer = _PACKERS[n] = struct.Struct(f"={n}I")
    try:
        body = packer.pack(*token_ids)
    except struct.error:
        body = array("I", token_ids).tobytes()  # the right error for an out-of-range id
    return body + repr(extra).encode() if extra else body


def _seed(parent: int | None) -> int:
    # Chains through the seed, without concatenating bytes.
    return 0 if parent is None else parent & 0xFFFF_FFFF_FFFF_FFFF


def xxhash64(parent: int | None, token_ids: Sequence[int], extra: tuple | None,
             _packers: dict = _PACKERS, _digest=xxhash.xxh3_64_intdigest) -> int:
    """xxh3-64: fast, the default."""
    # _to_bytes and _seed inlined (the hottest call of a tiered run); the same bytes and seed.
    packer = _packers.get(len(token_ids))
    if packer is None or extra:
        return _digest(_to_bytes(token_ids, extra), _seed(parent))
    try:
        body = packer.pack(*token_ids)
    except struct.error:
        body = array("I", token_ids).tobytes()  # the right error for an out-of-range id
    return _digest(body, 0 if parent is None else parent & 0xFFFF_FFFF_FFFF_FFFF)


def sha256_64(parent: int | None, token_ids: Sequence[int], extra: tuple | None) -> int:
    """First 8 bytes of SHA-256: slower, cryptographic spread."""
    data = _seed(parent).to_bytes(8, "little") + _to_bytes(token_ids, extra)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def builtin_hash(parent: int | None, token_ids: Sequence[int], extra: tuple | None) -> int:
    """Python's hash: fastest, stable within one process only."""
    return hash((parent, tuple(token_ids), extra))


HASH_FUNCTIONS: dict[str, HashFunction] = {
    "xxhash": xxhash64,
    "sha256": sha256_64,
    "builtin": builtin_hash,
}


def get_hash_function(name_or_fn: str | HashFunction) -> HashFunction:
    """A hash function by name, or a callable passed through."""
    if callable(name_or_fn):
        return name_or_fn
    try:
        return HASH_FUNCTIONS[name_or_fn]
    except KeyError:
        from twinserve.core.errors import InvalidConfigError

        raise InvalidConfigError("prefix_caching_hash_algo", name_or_fn,
                                 " or ".join(sorted(HASH_FUNCTIONS))) from None

"""Paged KV-cache bookkeeping: block pool, prefix cache, KV cache manager."""

from twinserve.core.kv.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock
from twinserve.core.kv.hashing import BlockHash, HASH_FUNCTIONS, get_hash_function
from twinserve.core.kv.kv_cache_manager import KVCacheManager, PrefixCacheStats

__all__ = [
    "BlockHash", "BlockPool", "FreeBlockQueue", "HASH_FUNCTIONS", "KVCacheBlock",
    "KVCacheManager", "PrefixCacheStats", "get_hash_function",
]

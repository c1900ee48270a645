"""Paged KV-cache bookkeeping: block pool, prefix cache, KV cache manager."""

from .block_pool import BlockPool, FreeBlockQueue, KVCacheBlock
from .hashing import BlockHash, HASH_FUNCTIONS, get_hash_function
from .kv_cache_manager import KVCacheManager, PrefixCacheStats

__all__ = [
    "BlockHash", "BlockPool", "FreeBlockQueue", "HASH_FUNCTIONS", "KVCacheBlock",
    "KVCacheManager", "PrefixCacheStats", "get_hash_function",
]

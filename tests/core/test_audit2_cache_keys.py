"""Prefix-cache keys: two tenants' salted copies of one prompt are both cached, each hit by its own
tenant only; the host tier's LRU keeps what was used last (docs/test-audit.md, round 2)."""

from __future__ import annotations

from twinserve.core import Request, SamplingParams
from twinserve.core.kv import KVCacheManager
from twinserve.core.kv.host_policies import make_host_policy


def test_two_tenants_with_the_same_prompt_each_keep_their_own_cached_prefix() -> None:
    kv = KVCacheManager(32, 4)
    prompt = list(range(9))  # two full blocks of 4
    for rid, salt in (("a", "x"), ("b", "y")):
        r = Request(rid, prompt, SamplingParams(), cache_salt=salt)
        kv.allocate_slots(r, 9)
        kv.cache_blocks(r, 9)
    # The second tenant's blocks did not take the first's place: both are hit, each by its own salt.
    for salt in ("x", "y"):
        assert kv.get_computed_blocks(Request(f"again-{salt}", prompt, SamplingParams(), cache_salt=salt))[1] == 8
    assert kv.get_computed_blocks(Request("other", prompt, SamplingParams(), cache_salt="z"))[1] == 0
    # Salted keys differ from unsalted ones and from each other at the first block.
    sx = kv.get_computed_blocks(Request("kx", prompt, SamplingParams(), cache_salt="x"))[0]
    sy = kv.get_computed_blocks(Request("ky", prompt, SamplingParams(), cache_salt="y"))[0]
    assert [b.block_id for b in sx] != [b.block_id for b in sy]


def test_the_lru_host_policy_evicts_the_least_recently_used_not_the_first_stored() -> None:
    p = make_host_policy("lru", 4)
    for v in (1, 2, 3):
        p.insert(v)
    p.access(1)  # 1 was hit: 2 is now the least recently used
    assert p.victim(set()) == 2
    assert p.victim({2}) == 3
    p.access(2)
    p.access(3)
    assert p.victim(set()) == 1


def test_a_salted_conversations_next_turn_hits_the_blocks_its_answer_filled() -> None:
    # Turn 1: 9 prompt tokens, then 7 generated ones fill blocks 2 and 3. Turn 2's prompt is turn 1's
    # whole context plus a new token: same tenant, so all 16 tokens are hits, the answer's too.
    kv = KVCacheManager(32, 4)
    r = Request("t1", list(range(9)), SamplingParams(), cache_salt="x")
    kv.allocate_slots(r, 9)
    r.num_computed_tokens = 9
    kv.cache_blocks(r, 9)
    for t in range(100, 107):
        r.append_output_token(t, 0.0)
    kv.allocate_slots(r, 7)
    r.num_computed_tokens = 16
    kv.cache_blocks(r, 16)
    context = list(r.all_token_ids)
    assert len(context) == 16
    assert kv.get_computed_blocks(Request("t2", context + [7], SamplingParams(), cache_salt="x"))[1] == 16
    assert kv.get_computed_blocks(Request("t2-other", context + [7], SamplingParams(), cache_salt="y"))[1] == 0

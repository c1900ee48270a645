"""nano-vllm's decode-step scheduling, re-created for bench_scheduler's side-by-side figure.

nano-vllm is not on PyPI (nano-vllm-fork there adds CFG pairs to every loop), so its algorithm
is re-created here from its published source: GeeeekExplorer/nano-vllm, nanovllm/engine/
scheduler.py (Scheduler.schedule's decode branch, Scheduler.postprocess), block_manager.py
(BlockManager.allocate/can_append/may_append, xxh64 block hashes chained on the previous
block's hash, a deque of free ids and a set of used ones) and sequence.py (a token list, a
block table). Same data structures and per-request work (a plain Sequence class with properties, Block
objects, the asserts), plus LLMEngine.step's list of finished outputs; our own code. Only what
a decode step runs is here, with the prefill-time allocation that sets the block tables up.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import xxhash


class NanoSeq:
    """A sequence: its tokens and its block table (a plain class with properties, as nano-vllm's)."""

    block_size = 16

    def __init__(self, token_ids: list[int], max_tokens: int) -> None:
        self.token_ids = list(token_ids)
        self.last_token = token_ids[-1]
        self.num_tokens = self.num_prompt_tokens = len(token_ids)
        self.block_table: list[int] = []
        self.max_tokens = max_tokens
        self.ignore_eos = True
        self.finished = False

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def is_finished(self) -> bool:
        """True once a stop rule ended it."""
        return self.finished

    @property
    def num_completion_tokens(self) -> int:
        """Tokens generated so far."""
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_blocks(self) -> int:
        """Blocks its tokens span."""
        return (self.num_tokens + self.block_size - 1) // self.block_size

    def block(self, i: int) -> list[int]:
        """The tokens of its block i."""
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        """Append a sampled token."""
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1


class NanoBlock:
    """One KV block: ref count, hash (-1: none) and tokens."""

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []

    def update(self, h: int, token_ids: list[int]) -> None:
        """Record a full block's hash and tokens."""
        self.hash = h
        self.token_ids = token_ids

    def reset(self) -> None:
        """Taken: one owner, no hash."""
        self.ref_count = 1
        self.hash = -1
        self.token_ids = []


class NanoBlocks:
    """The block manager: free-id deque, used-id set, hash -> block id."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = [NanoBlock(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()

    @staticmethod
    def compute_hash(token_ids: list[int], prefix: int = -1) -> int:
        """xxh64 over the previous block's hash (if any) and the tokens as a numpy array."""
        h = xxhash.xxh64()
        if prefix != -1:
            h.update(prefix.to_bytes(8, "little"))
        h.update(np.array(token_ids).tobytes())
        return h.intdigest()

    def _allocate_block(self, block_id: int) -> NanoBlock:
        block = self.blocks[block_id]
        assert block.ref_count == 0
        block.reset()
        self.free_block_ids.remove(block_id)  # by value, as nano-vllm does
        self.used_block_ids.add(block_id)
        return block

    def allocate(self, seq: NanoSeq) -> None:
        """Prefill-time block table with prefix-cache lookups (not timed)."""
        h, miss = -1, False
        for i in range(seq.num_blocks):
            toks = seq.block(i)
            h = self.compute_hash(toks, h) if len(toks) == self.block_size else -1
            bid = self.hash_to_block_id.get(h, -1)
            miss = miss or bid == -1 or self.blocks[bid].token_ids != toks
            if miss:
                block = self._allocate_block(self.free_block_ids[0])
            elif bid in self.used_block_ids:
                block = self.blocks[bid]
                block.ref_count += 1
            else:
                block = self._allocate_block(bid)
            if h != -1:
                block.update(h, toks)
                self.hash_to_block_id[h] = block.block_id
            seq.block_table.append(block.block_id)

    def can_append(self, seq: NanoSeq) -> bool:
        """A new block is needed when the last token starts one."""
        return len(self.free_block_ids) >= (len(seq) % self.block_size == 1)

    def may_append(self, seq: NanoSeq) -> None:
        """Take a block when a token starts one; hash and register the block a token fills."""
        table = seq.block_table
        last = self.blocks[table[-1]]
        if len(seq) % self.block_size == 1:
            assert last.hash != -1
            block_id = self.free_block_ids[0]
            self._allocate_block(block_id)
            table.append(block_id)
        elif len(seq) % self.block_size == 0:
            assert last.hash == -1
            toks = seq.block(seq.num_blocks - 1)
            prefix = self.blocks[table[-2]].hash if len(table) > 1 else -1
            h = self.compute_hash(toks, prefix)
            last.update(h, toks)
            self.hash_to_block_id[h] = last.block_id
        else:
            assert last.hash == -1


class NanoScheduler:
    """Decode-step scheduling as nano-vllm does it (no preemption at this benchmark's sizes)."""

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, eos: int = -1) -> None:
        self.block_manager = NanoBlocks(num_blocks, block_size)
        self.running: deque[NanoSeq] = deque()
        self.max_num_seqs = max_num_seqs
        self.eos = eos

    def schedule_decode(self) -> list[NanoSeq]:
        """Every running sequence in order, each with a slot for one token."""
        scheduled = []
        num_seqs = 0
        while self.running and num_seqs < self.max_num_seqs:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                raise RuntimeError("out of blocks: the benchmark sizes its pool to never preempt")
            else:
                num_seqs += 1
                self.block_manager.may_append(seq)
                scheduled.append(seq)
        self.running.extendleft(reversed(scheduled))
        return scheduled

    def postprocess(self, seqs: list[NanoSeq], token_ids: list[int]) -> None:
        """Append each sampled token; a finished sequence leaves running (none finish here)."""
        for seq, token_id in zip(seqs, token_ids):
            seq.append_token(token_id)
            if (not seq.ignore_eos and token_id == self.eos) or seq.num_completion_tokens == seq.max_tokens:
                seq.finished = True
                self.running.remove(seq)

    def step(self, token_ids: list[int]) -> list[tuple[int, list[int]]]:
        """LLMEngine.step without the model: schedule, postprocess, the finished outputs."""
        seqs = self.schedule_decode()
        self.postprocess(seqs, token_ids)
        return [(id(seq), seq.token_ids[seq.num_prompt_tokens:]) for seq in seqs if seq.is_finished]


def nano_step_times(num_reqs: int, steps: int, prompt_len: int = 128) -> list[float]:
    """Per-step seconds of schedule + postprocess, on bench_scheduler's workload."""
    bs = 16
    sched = NanoScheduler(num_reqs * ((prompt_len + steps + 64) // bs + 2), bs, num_reqs)
    for i in range(num_reqs):
        prompt = [1] * 64 + [(i * 7 + j) % 30000 + 2 for j in range(prompt_len - 64)]
        seq = NanoSeq(prompt, steps + 32)
        sched.block_manager.allocate(seq)
        seq.append_token(5)  # the prefill's sampled token
        sched.running.append(seq)
    tokens = [7] * num_reqs
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        sched.step(tokens)
        times.append(time.perf_counter() - t0)
    return times

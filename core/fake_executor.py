"""Deterministic test executor: a toy model, optionally checking every KV slot read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput


@dataclass(slots=True)
class _ReqState:
    token_ids: list[int]
    num_computed: int
    # One block table per KV group.
    tables: list[list[int]] = field(default_factory=list)
    # See KVSlotModel.prefix_ids.
    prefix_ids: list[int] = field(default_factory=list)


class ContractViolation(AssertionError):
    """The scheduler broke the executor contract."""


class KVSlotModel:
    """Each KV slot's content as the id of the prefix it was computed from.

    KV at p depends on tokens 0..p; a trie interns prefixes exactly, so equal ids mean equal KV.
    """

    __slots__ = ("block_size", "slots", "_trie")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.slots: dict[int, list[int | None]] = {}
        self._trie: dict[tuple[int, int], int] = {}

    def prefix_ids(self, token_ids: Sequence[int], known: list[int]) -> list[int]:
        """Extend known (prefix ids of token_ids) to every position."""
        trie = self._trie
        prev = known[-1] if known else 0
        for tok in token_ids[len(known):]:
            node = (prev, tok)
            prev = trie.get(node, 0)
            if not prev:
                prev = trie[node] = len(trie) + 1
            known.append(prev)
        return known

    def write(self, block_ids: Sequence[int], prefix_ids: Sequence[int], start: int, end: int,
              group: int = 0) -> None:
        """Store the KV of positions start..end-1 (of KV group `group`'s layers) into their slots."""
        bs = self.block_size
        for p in range(start, end):
            block = self.slots.get(block_ids[p // bs])
            if block is None:
                block = self.slots[block_ids[p // bs]] = [None] * bs
            # Another group's layers are other KV, even for the same prefix.
            block[p % bs] = prefix_ids[p] if not group else (group, prefix_ids[p])

    def check(self, req_id: str, block_ids: Sequence[int], prefix_ids: Sequence[int], end: int,
              start: int = 0, group: int = 0) -> None:
        """Raise ContractViolation unless positions start..end-1 all hold this request's own prefix."""
        bs = self.block_size
        slots = self.slots
        for p in range(start, end):
            block = slots.get(block_ids[p // bs])
            held = None if block is None else block[p % bs]
            if held != (prefix_ids[p] if not group else (group, prefix_ids[p])):
                what = "nothing" if held is None else "another prefix's or group's KV"
                raise ContractViolation(
                    f"{req_id} attends to position {p} in group {group}'s block {block_ids[p // bs]} "
                    f"(offset {p % bs}), which holds {what}")


class FakeExecutor:
    """next token = f(previous token, position), so recomputation reproduces outputs; checks the contract.

    model_kv checks every attended slot; drafts miss where (token + position) % draft_miss == 0.
    kv_groups gives each KV group's window (0 = full), as SchedulerConfig.kv_groups.
    Host tier: stores copy slots at the step's start; each load job's copy lands load_delay steps
    after it is issued (0: this step), and only then is it reported in finished_loads.
    """

    def __init__(self, vocab_size: int = 1000, block_size: int = 16, eos_token_id: int | None = None,
                 step_time: float | None = None, model_kv: bool = False,
                 num_speculative_tokens: int = 0, draft_miss: int = 3,
                 sliding_window: int | None = None, kv_groups: Sequence[int] = (),
                 load_delay: int = 0) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.draft_miss = draft_miss
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.eos_token_id = eos_token_id
        self.step_time = step_time
        self.state: dict[str, _ReqState] = {}
        self.num_steps = 0
        self.kv = KVSlotModel(block_size) if model_kv else None
        self.num_kv_reads = 0
        self.sliding_window = sliding_window
        self.windows = [w or None for w in kv_groups] if kv_groups else [sliding_window]
        self.load_delay = load_delay
        # Host slot -> the KV it holds (as KVSlotModel's block lists); loads in flight by due step.
        self.host: dict[int, list | None] = {}
        self.loads_in_flight: list[tuple[int, int, list[tuple[int, int]]]] = []
        self.num_blocks_stored = 0
        self.num_blocks_loaded = 0

    def _transfer(self, so: SchedulerOutput) -> list[int]:
        """Run the step's stores, then the loads now due; the jobs done."""
        slots = self.kv.slots if self.kv is not None else None
        for block_id, slot in so.kv_stores:
            if slots is not None:
                held = slots.get(block_id)
                self.host[slot] = None if held is None else list(held)
            self.num_blocks_stored += 1
        for job_id, pairs in so.kv_loads.items():
            self.loads_in_flight.append((self.num_steps + self.load_delay, job_id, pairs))
        done = []
        waiting = []
        for due, job_id, pairs in self.loads_in_flight:
            if due > self.num_steps:
                waiting.append((due, job_id, pairs))
                continue
            for slot, block_id in pairs:
                if slots is not None:
                    held = self.host.get(slot)
                    slots[block_id] = None if held is None else list(held)
                self.num_blocks_loaded += 1
            done.append(job_id)
        self.loads_in_flight = waiting
        return done

    def _split(self, rid: str, block_ids: Sequence[int]) -> list[list[int]]:
        """Group-major block ids -> one list per group."""
        g = len(self.windows)
        n, rem = divmod(len(block_ids), g)
        if rem:
            raise ContractViolation(f"{rid}: {len(block_ids)} block ids do not split into {g} groups")
        return [list(block_ids[i * n:(i + 1) * n]) for i in range(g)]

    def next_token(self, prev_token: int, position: int) -> int:
        """The toy model."""
        return (prev_token * 31 + position * 17 + 7) % self.vocab_size

    def propose(self, token_ids: Sequence[int]) -> list[int]:
        """The toy model's continuation, with planted misses."""
        drafts = []
        prev, pos = token_ids[-1], len(token_ids)
        for _ in range(self.num_speculative_tokens):
            tok = self.next_token(prev, pos)
            if (tok + pos) % self.draft_miss == 0:
                tok = (tok + 1) % self.vocab_size
            drafts.append(tok)
            prev, pos = tok, pos + 1
        return drafts

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Advance scheduled requests; sample for those at their end."""
        self.num_steps += 1
        finished_loads = self._transfer(so) if so.kv_stores or so.kv_loads or self.loads_in_flight else None
        for rid in so.finished_req_ids:
            self.state.pop(rid, None)
        for rid in so.preempted_req_ids:
            self.state.pop(rid, None)
        for new in so.scheduled_new_reqs:
            if new.req_id in self.state:
                raise ContractViolation(f"{new.req_id} sent as new while the executor holds it")
            self.state[new.req_id] = _ReqState(list(new.token_ids), new.num_computed_tokens,
                                               self._split(new.req_id, new.block_ids))
        for rid, n in so.num_dropped_blocks.items():
            st = self.state.get(rid)
            if st is None:
                raise ContractViolation(f"{rid}: blocks dropped from a request the executor does not hold")
            for table in st.tables:
                del table[len(table) - n:]
        cached = so.scheduled_cached_reqs
        for rid, blocks, computed in zip(cached.req_ids, cached.new_block_ids,
                                         cached.num_computed_tokens):
            st = self.state.get(rid)
            if st is None:
                raise ContractViolation(f"{rid} scheduled as running but unknown to the executor")
            if st.num_computed != computed:
                raise ContractViolation(f"{rid}: executor has {st.num_computed} computed, "
                                        f"scheduler says {computed}")
            for table, part in zip(st.tables, self._split(rid, blocks)):
                table.extend(part)
        sampled: dict[str, list[int]] = {}
        bs = self.block_size
        kv = self.kv
        spans: list[tuple[str, _ReqState, int, list[int]]] = []
        spec = so.scheduled_spec_decode_tokens
        proposals: dict[str, list[int]] | None = {} if self.num_speculative_tokens else None
        for rid, n in so.num_scheduled_tokens.items():
            st = self.state[rid]
            drafts = spec.get(rid, ()) if spec else ()
            seq = st.token_ids + list(drafts) if drafts else st.token_ids
            end = st.num_computed + n
            if end > len(seq) or (drafts and end != len(seq)):
                raise ContractViolation(f"{rid}: {n} tokens scheduled past the known sequence")
            if len(st.tables[0]) * bs < end:
                raise ContractViolation(f"{rid}: {len(st.tables[0])} blocks cannot hold {end} tokens")
            if kv is not None:
                # A real step writes all K/V before attention reads any.
                ids = kv.prefix_ids(seq, list(st.prefix_ids) if drafts else st.prefix_ids)
                for g, w in enumerate(self.windows):
                    kv.write(st.tables[g], ids, st.num_computed, end, g)
                    spans.append((rid, st.tables[g], 0 if w is None else max(0, st.num_computed - w + 1),
                                  end, ids, g))
            st.num_computed = end
            if end == len(seq):
                base = len(st.token_ids)
                out: list[int] = []
                for j in range(len(drafts) + 1):  # greedy verification: accept while equal
                    tok = self.next_token(seq[base - 1 + j], base + j)
                    out.append(tok)
                    if j == len(drafts) or drafts[j] != tok:
                        break
                st.num_computed -= len(drafts) - (len(out) - 1)
                st.token_ids.extend(out)
                sampled[rid] = out
                if proposals is not None:
                    proposals[rid] = self.propose(st.token_ids)
        if kv is not None:
            for rid, table, start, end, ids, g in spans:
                kv.check(rid, table, ids, end, start, g)
                self.num_kv_reads += end - start
        return ModelRunnerOutput(sampled, step_time=self.step_time, spec_token_ids=proposals,
                                 finished_loads=finished_loads or None)

"""SchedulerOutput -> flat varlen tensors -> forward -> sampled tokens, with state kept across steps."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ...core.sched.output import Logprob, ModelRunnerOutput, SchedulerOutput
from .attention import AttentionBackend, AttentionMetadata
from .cuda_graphs import DecodeGraphs
from .input_batch import CachedRequestState, InputBatch
from .models.llama import LlamaForCausalLM
from .sampler import Sampler, SamplingRow


@dataclass(slots=True)
class StepShape:
    """What one step computed, in the cost model's terms (filled by the runner)."""

    num_new_tokens: int = 0
    # (new tokens q, cached context c) per prefill chunk.
    prefills: list[tuple[int, int]] = field(default_factory=list)
    # Context length (tokens before this one) per decode sequence.
    decodes: list[int] = field(default_factory=list)


class ModelRunner:
    """Owns the model, its KV cache tensors, the attention backend and the sampler for one device."""

    def __init__(self, model: LlamaForCausalLM, backend: AttentionBackend, device: torch.device,
                 block_size: int, max_model_len: int, max_num_seqs: int, stop_ids: list[int]) -> None:
        self.model = model
        self.backend = backend
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks_per_req = -(-max_model_len // block_size)
        self.batch = InputBatch(max_num_seqs, max_model_len, self.max_blocks_per_req)
        self.sampler = Sampler(device)
        self.stop_ids = stop_ids
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.last_shape = StepShape()
        # Time the phases of each step (set by the engine when it keeps a step log); on CUDA
        # this synchronizes at each phase end, so it is off unless asked for.
        self.timing = False
        # (prepare_s, forward_s, sample_s) of the last step, when timing.
        self.last_timing: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self.max_num_seqs = max_num_seqs
        # Set by the worker on CUDA unless --enforce-eager (see cuda_graphs.py).
        self.graphs: DecodeGraphs | None = None
        self._pinned = _PinnedStaging(device)

    def init_kv_cache(self, num_blocks: int, dtype: torch.dtype) -> None:
        """Allocate [num_blocks, block_size, num_kv_heads, head_dim] K and V per layer."""
        cfg = self.model.config
        shape = (num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=self.device),
                           torch.zeros(shape, dtype=dtype, device=self.device))
                          for _ in range(cfg.num_hidden_layers)]

    # ------------------------------------------------------------------ state
    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self.batch
        for rid in so.finished_req_ids:
            batch.remove(rid)
        for rid in so.preempted_req_ids:
            batch.remove(rid)
        for new in so.scheduled_new_reqs:
            batch.remove(new.req_id)  # a resumed request is rebuilt from scratch
            # The engine gives every request a seed; a bare core user gets seed 0.
            seed = new.sampling_params.seed
            batch.add(new.req_id, new.token_ids, new.num_prompt_tokens, new.sampling_params,
                      new.block_ids, new.num_computed_tokens, 0 if seed is None else seed)
        c = so.scheduled_cached_reqs
        for rid, blocks, computed in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens):
            st = batch.requests[rid]
            st.num_computed_tokens = computed
            batch.append_blocks(st, blocks)

    # ------------------------------------------------------------------ step
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one scheduler output and return the sampled tokens."""
        timing = self.timing
        t0 = time.perf_counter() if timing else 0.0
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            self.last_shape = StepShape()
            self.last_timing = (0.0, 0.0, 0.0)
            return ModelRunnerOutput({})
        states, q_lens, starts = self._order(so)
        input_ids, positions, meta, logits_idx, sampling = self._prepare(states, q_lens, starts)
        t1 = self._mark() if timing else 0.0
        graphs = self.graphs
        if graphs is not None and meta.num_decodes == meta.num_tokens and graphs.bucket_for(meta.num_tokens) is not None:
            hidden = graphs.run(input_ids, positions, meta.slot_mapping, meta.seq_lens, meta.block_tables)
        else:
            hidden = self.model(input_ids, positions, self.kv_caches, meta, self.backend)
        logits = self.model.compute_logits(hidden[logits_idx]) if sampling else None
        t2 = self._mark() if timing else 0.0
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list[Logprob]] = {}
        if sampling:
            rows = [SamplingRow(st.sampling_params, st.token_ids, st.num_prompt_tokens, st.base_seed,
                                ([] if st.sampling_params.ignore_eos else self.stop_ids)
                                + st.sampling_params.stop_token_ids)
                    for st in sampling]
            tokens, lps = self.sampler(logits, rows)
            for st, tok, lp in zip(sampling, tokens, lps):
                self.batch.append_token(st, tok)
                sampled[st.req_id] = [tok]
                if lp is not None:
                    logprobs[st.req_id] = [lp]
        for st, q in zip(states, q_lens):
            st.num_computed_tokens += q
        if timing:
            t3 = self._mark()
            self.last_timing = (t1 - t0, t2 - t1, t3 - t2)
        return ModelRunnerOutput(sampled, logprobs or None)

    def _mark(self) -> float:
        """Now, after the device has finished what was queued (timing only)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _order(self, so: SchedulerOutput) -> tuple[list[CachedRequestState], list[int], list[int]]:
        """Decodes first, sorted by context length (the torch backend buckets them), then prefills."""
        reqs = self.batch.requests
        decodes: list[tuple[int, CachedRequestState]] = []
        prefills: list[tuple[CachedRequestState, int]] = []
        for rid, q in so.num_scheduled_tokens.items():
            st = reqs[rid]
            if q == 1:
                decodes.append((st.num_computed_tokens, st))
            else:
                prefills.append((st, q))
        decodes.sort(key=lambda x: x[0])
        states = [st for _, st in decodes] + [st for st, _ in prefills]
        q_lens = [1] * len(decodes) + [q for _, q in prefills]
        starts = [st.num_computed_tokens for st in states]
        shape = StepShape(so.total_num_scheduled_tokens)
        for st, q, c in zip(states, q_lens, starts):
            if q > 1 or c < st.num_prompt_tokens:
                shape.prefills.append((q, c))
            else:
                shape.decodes.append(c)
        self.last_shape = shape
        return states, q_lens, starts

    def _prepare(self, states: list[CachedRequestState], q_lens: list[int], starts: list[int]):
        """Flat token ids, positions and attention metadata, built with array ops (no per-token loop)."""
        bs = self.block_size
        n = len(states)
        rows = np.fromiter((st.row for st in states), dtype=np.int64, count=n)
        q = np.asarray(q_lens, dtype=np.int64)
        start = np.asarray(starts, dtype=np.int64)
        cu = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(q, out=cu[1:])
        total = int(cu[-1])
        rows_rep = np.repeat(rows, q)
        positions = np.arange(total, dtype=np.int64) - np.repeat(cu[:-1] - start, q)
        input_ids = self.batch.token_ids[rows_rep, positions]
        slots = self.batch.block_table[rows_rep, positions // bs].astype(np.int64) * bs + positions % bs
        seq_lens = start + q
        max_seq = int(seq_lens.max())
        block_tables = self.batch.block_table[rows, :-(-max_seq // bs)]
        num_decodes = next((i for i, x in enumerate(q_lens) if x != 1), n)
        dev = self.device
        put = self._pinned.put
        meta = AttentionMetadata(
            num_tokens=total,
            num_decodes=num_decodes,
            query_start_loc=put("qsl", cu.astype(np.int32)),
            seq_lens=put("seq_lens", seq_lens.astype(np.int32)),
            block_tables=put("block_tables", np.ascontiguousarray(block_tables)),
            slot_mapping=put("slots", slots),
            max_query_len=int(q.max()),
            max_seq_len=max_seq,
            query_lens_cpu=q_lens,
            seq_lens_cpu=seq_lens.tolist(),
        )
        if self.graphs is None or num_decodes != n or self.graphs.bucket_for(n) is None:
            self.backend.plan(meta, bs, self.model.config.num_key_value_heads)
        ends = seq_lens.tolist()
        sampling = [st for st, e in zip(states, ends) if e == len(st.token_ids)]
        sample_at = np.fromiter((int(cu[i + 1]) - 1 for i, (st, e) in enumerate(zip(states, ends))
                                 if e == len(st.token_ids)), dtype=np.int64)
        return (put("input_ids", input_ids), put("positions", positions), meta,
                put("logits_idx", sample_at), sampling)


class _PinnedStaging:
    """Host arrays -> device tensors; on CUDA through reused pinned buffers and async copies.

    A pageable host-to-device copy blocks the host and goes through a bounce buffer. Each
    name keeps its own pinned buffer; reusing it next step is safe because every step ends
    by reading the sampled tokens back, which waits for the copies.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.buffers: dict[str, torch.Tensor] = {}

    def put(self, name: str, arr: np.ndarray) -> torch.Tensor:
        """The array as a tensor on the device."""
        src = torch.from_numpy(arr)
        if not self.cuda:
            return src if self.device.type == "cpu" else src.to(self.device)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < src.numel() or buf.dtype != src.dtype:
            buf = self.buffers[name] = torch.empty(max(src.numel(), 1024), dtype=src.dtype, pin_memory=True)
        staged = buf[:src.numel()].view(src.shape)
        staged.copy_(src)
        return staged.to(self.device, non_blocking=True)

"""SchedulerOutput -> flat varlen tensors -> forward -> sampled tokens, with state kept across steps."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from twinserve.core.kv.groups import kv_cache_groups, layer_slots
from twinserve.core.sched.output import Logprob, ModelRunnerOutput, SchedulerOutput
from twinserve.backends.real.attention import AttentionBackend, AttentionMetadata
from twinserve.backends.real.cuda_graphs import DecodeGraphs
from twinserve.backends.real.host_kv import HostKVCache
from twinserve.backends.real.input_batch import CachedRequestState, InputBatch
from twinserve.backends.real.models.architectures import CausalLM
from twinserve.backends.real.sampler import Sampler, SamplingRow, prompt_logprob_records
from twinserve.backends.real.spec.draft_model import DraftModelProposer
from twinserve.backends.real.spec.ngram import NgramProposer
from twinserve.backends.real.spec.verify import VerifyEntry, verify_drafts
from twinserve.backends.real.structured.mask import GrammarMasker
from twinserve.core.spec_decode import SpeculativeConfig

# Bounds the [chunk, vocab] logits materialised at once.
_PROMPT_LP_CHUNK = 256


@dataclass(slots=True)
class StepShape:
    """What one step computed, in the cost model's terms."""

    num_new_tokens: int = 0
    # (new tokens q, cached context c) per prefill chunk
    prefills: list[tuple[int, int]] = field(default_factory=list)
    # context length per decode sequence
    decodes: list[int] = field(default_factory=list)
    # Seconds in grammar bitmasks and matcher advances.
    grammar_mask_time: float = 0.0
    num_constrained: int = 0
    # CUDA with a step log: host seconds to launch the forward.
    forward_launch_time: float = 0.0


class ModelRunner:
    """Owns the model, its KV cache, the attention backend and the sampler for one device."""

    def __init__(self, model: CausalLM, backend: AttentionBackend, device: torch.device,
                 block_size: int, max_model_len: int, max_num_seqs: int, stop_ids: list[int],
                 compile_grammar: Callable[[Any], Any] | None = None,
                 speculative_config: SpeculativeConfig | None = None, draft_model: CausalLM | None = None) -> None:
        self.model = model
        self.spec_config = speculative_config
        self.proposer = (NgramProposer(speculative_config.num_speculative_tokens,
                                       speculative_config.prompt_lookup_min, speculative_config.prompt_lookup_max)
                         if speculative_config is not None and speculative_config.method == "ngram" else None)
        self._drafts: dict[str, list[int]] = {}
        self.sampler = Sampler(device)
        self.drafter = (DraftModelProposer(draft_model, backend, device, block_size,
                                           speculative_config.num_speculative_tokens, self.sampler)
                        if draft_model is not None and speculative_config is not None else None)
        # Off: propose nothing, so every step is plain (calibration's plain points and speed probes).
        self.drafting = True
        self.backend = backend
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks_per_req = -(-max_model_len // block_size)
        # Layers grouped by attention type, as the core's KV manager groups them.
        self.kv_groups = kv_cache_groups(model.config.layer_windows or [None] * model.config.num_hidden_layers)
        for g, group in enumerate(self.kv_groups):
            for layer in group.layers:
                model.layers[layer].self_attn.kv_group = g
        self.batch = InputBatch(max_num_seqs, max_model_len, self.max_blocks_per_req, len(self.kv_groups))
        self.grammar = GrammarMasker()
        # For specs from another process, which arrive without their grammar.
        self.compile_grammar = compile_grammar
        self.stop_ids = stop_ids
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.last_shape = StepShape()
        # Off by default: on CUDA, timing syncs each step.
        self.timing = False
        self._events: tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event] | None = None
        self.last_timing: tuple[float, float, float] = (0.0, 0.0, 0.0)
        # Extra logits are computed only while some live request asked for prompt logprobs.
        self._prompt_lp_reqs: set[str] = set()
        self.max_num_seqs = max_num_seqs
        # Set by the worker on CUDA unless --enforce-eager.
        self.graphs: DecodeGraphs | None = None
        self._pinned = _PinnedStaging(device)
        # The host tier's tensors and copies (init_host_tier); None when off.
        self.host_kv: HostKVCache | None = None

    def init_kv_cache(self, num_blocks: int, dtype: torch.dtype) -> None:
        """Allocate [num_blocks, block_size, num_kv_heads, head_dim] K and V per layer of a group.

        Layer j of every KV group shares tensor j: a block id is one page of the shared pool.
        """
        cfg = self.model.config
        shape = (num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        shared = [(torch.zeros(shape, dtype=dtype, device=self.device),
                   torch.zeros(shape, dtype=dtype, device=self.device))
                  for _ in range(len(self.kv_groups[0].layers))]
        slots = layer_slots(self.kv_groups)
        self.kv_caches = [shared[slots[layer][1]] for layer in range(cfg.num_hidden_layers)]
        self._kv_tensors = [t for pair in shared for t in pair]
        if self.drafter is not None:
            # The draft indexes its own tensors with group 0's table (full attention when any layer is).
            self.drafter.init_kv_cache(num_blocks, dtype)
            self._kv_tensors += [t for pair in self.drafter.kv_caches for t in pair]

    def init_host_tier(self, size_gib: float, size_field: tuple[str, object] | None = None) -> int:
        """Host memory mirroring every KV tensor (the draft's too), size_gib of it; its block count."""
        self.host_kv = HostKVCache(self._kv_tensors, size_gib, self.device, size_field)
        return self.host_kv.num_blocks

    # ------------------------------------------------------------------ state
    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self.batch
        for rid in so.finished_req_ids:
            batch.remove(rid)
            self.grammar.remove(rid)
        for rid in so.preempted_req_ids:
            batch.remove(rid)
            self.grammar.remove(rid)
        if self.drafter is not None:
            self.drafter.forget(so.finished_req_ids)
            self.drafter.forget(so.preempted_req_ids)
        if self._prompt_lp_reqs:
            self._prompt_lp_reqs.difference_update(so.finished_req_ids)
            self._prompt_lp_reqs.difference_update(so.preempted_req_ids)
        for new in so.scheduled_new_reqs:
            if new.sampling_params.prompt_logprobs is not None:
                self._prompt_lp_reqs.add(new.req_id)
            batch.remove(new.req_id)  # a resumed request is rebuilt from scratch
            spec = new.sampling_params.structured_output
            if spec is not None:
                # Compiled by the engine in-process; a spec from another process arrives bare.
                compiled = spec.compiled
                if compiled is None:
                    if self.compile_grammar is None:
                        raise RuntimeError(f"request {new.req_id}: structured output without a compiled grammar")
                    compiled = self.compile_grammar(spec)
                self.grammar.add(new.req_id, compiled, new.token_ids[new.num_prompt_tokens:])
            # The engine seeds every request; a bare core user gets seed 0.
            seed = new.sampling_params.seed
            batch.add(new.req_id, new.token_ids, new.num_prompt_tokens, new.sampling_params,
                      new.block_ids, new.num_computed_tokens, 0 if seed is None else seed)
        for rid, n in so.num_dropped_blocks.items():
            st = batch.requests.get(rid)
            if st is not None:
                st.num_blocks -= n  # they held only rejected drafts
        c = so.scheduled_cached_reqs
        for rid, blocks, computed in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens):
            st = batch.requests[rid]
            st.num_computed_tokens = computed
            batch.append_blocks(st, blocks)
        self._drafts = so.scheduled_spec_decode_tokens
        for rid, drafts in self._drafts.items():
            # Fed after the newest token; accepted ones are written again as they are appended.
            st = batch.requests[rid]
            n = len(st.token_ids)
            batch.token_ids[st.row, n:n + len(drafts)] = drafts

    # ------------------------------------------------------------------ step
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one scheduler output and return the sampled tokens."""
        timing = self.timing
        t0 = time.perf_counter() if timing else 0.0
        # Before the forward: stores read blocks this step may reuse.
        loads_done = self.host_kv.run(so) if self.host_kv is not None else None
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            self.last_shape = StepShape()
            self.last_timing = (0.0, 0.0, 0.0)
            return ModelRunnerOutput({}, finished_loads=loads_done or None)
        states, q_lens, starts = self._order(so)
        input_ids, positions, meta, logits_idx, sampling = self._prepare(states, q_lens, starts)
        t1 = time.perf_counter() if timing else 0.0
        events = self._phase_events() if timing else None
        if events is not None:
            events[0].record()
        graphs = self.graphs
        if (graphs is not None and meta.num_decodes == meta.num_tokens
                and graphs.bucket_for(meta.num_tokens) is not None):
            hidden = graphs.run(input_ids, positions, meta.slot_mapping, meta.seq_lens, meta.block_tables,
                                [(m.slot_mapping, m.block_tables) for m in (meta.groups or [meta])[1:]])
        else:
            hidden = self.model(input_ids, positions, self.kv_caches, meta, self.backend)
        logits = self.model.compute_logits(hidden[logits_idx]) if sampling else None
        if events is not None:
            events[1].record()
        t2 = time.perf_counter() if timing else 0.0
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list[Logprob]] = {}
        failed: dict[str, str] = {}
        prompt_lps = self._prompt_logprobs(hidden, states, q_lens, starts) if self._prompt_lp_reqs else None
        rejected: dict[str, int] = {}
        constrained = len(self.grammar) > 0
        if constrained:
            self.grammar.last_mask_time = 0.0
            self.grammar.last_num_masked = 0
        if sampling and self._drafts:
            logits, sampling = self._verify(logits, sampling, sampled, logprobs, rejected, failed)
        if sampling:
            rows = [SamplingRow(st.sampling_params, st.token_ids, st.num_prompt_tokens, st.base_seed,
                                ([] if st.sampling_params.ignore_eos else self.stop_ids)
                                + st.sampling_params.stop_token_ids)
                    for st in sampling]
            if constrained:
                ids = [st.req_id for st in sampling]
                self.grammar.apply(logits, ids)
            tokens, lps = self._sample(logits, rows, sampling, failed)
            if constrained:
                ok = [(rid, tok) for rid, tok in zip(ids, tokens) if tok is not None]
                self.grammar.accept([rid for rid, _ in ok], [tok for _, tok in ok])
            for st, tok, lp in zip(sampling, tokens, lps):
                if tok is None:
                    continue
                self.batch.append_token(st, tok)
                sampled[st.req_id] = [tok]
                if lp is not None:
                    logprobs[st.req_id] = [lp]
        if constrained:
            self.last_shape.grammar_mask_time = self.grammar.last_mask_time
            self.last_shape.num_constrained = self.grammar.last_num_masked
        for st, q in zip(states, q_lens):
            st.num_computed_tokens += q
        for rid, n in rejected.items():
            self.batch.requests[rid].num_computed_tokens -= n
        if self.proposer is not None:
            # No proposals the scheduler would drop: a batch at disable_by_batch_size drafts nothing.
            spec = self.spec_config
            on = self.drafting and (spec is None or spec.active(len(self.batch.requests)))
            spec_ids = self._propose(sampled) if on else None
        elif self.drafter is not None:
            spec = self.spec_config
            spec_ids = self.drafter.propose(self.batch, states, starts, sampled, failed,
                                            self.drafting and spec is not None
                                            and spec.active(len(self.batch.requests)),
                                            self.max_model_len, self._row)
        else:
            spec_ids = None
        if timing:
            self.last_timing = self._phase_times(t0, t1, t2, events)
        return ModelRunnerOutput(sampled, logprobs or None, failed=failed or None,
                                 prompt_logprobs=prompt_lps or None, spec_token_ids=spec_ids,
                                 finished_loads=loads_done or None)

    def _row(self, st: CachedRequestState) -> SamplingRow:
        sp = st.sampling_params
        return SamplingRow(sp, st.token_ids, st.num_prompt_tokens, st.base_seed,
                           ([] if sp.ignore_eos else self.stop_ids) + sp.stop_token_ids)

    def _verify(self, logits: torch.Tensor, sampling: list[CachedRequestState], sampled: dict[str, list[int]],
                logprobs: dict[str, list[Logprob]], rejected: dict[str, int], failed: dict[str, str]
                ) -> tuple[torch.Tensor, list[CachedRequestState]]:
        """Verify the step's drafts (one logits row per draft, plus one); returns the plain rows left."""
        plain_idx: list[int] = []
        plain: list[CachedRequestState] = []
        entries: list[VerifyEntry] = []
        verified: list[CachedRequestState] = []
        offset = 0
        for st in sampling:
            drafts = self._drafts.get(st.req_id)
            if drafts:
                q = (self.drafter.probs_for(st.req_id, len(drafts))
                     if self.drafter is not None and not st.sampling_params.greedy else None)
                entries.append(VerifyEntry(self._row(st), drafts, q))
                verified.append(st)
                offset += len(drafts) + 1
            else:
                plain_idx.append(offset)
                plain.append(st)
                offset += 1
        if entries:
            is_plain = set(plain_idx)
            spec_idx = [i for i in range(offset) if i not in is_plain]
            spec_logits = logits[spec_idx]
            if len(self.grammar):
                row = 0
                for e, st in zip(entries, verified):
                    n = len(e.drafts) + 1
                    self.grammar.apply_drafts(spec_logits[row:row + n], st.req_id, e.drafts)
                    row += n
            try:
                results: list[list[int] | None] = list(verify_drafts(self.sampler, spec_logits, entries))
            except Exception:  # noqa: BLE001 - find the request whose inputs broke the batch
                results = []
                row = 0
                for st, e in zip(verified, entries):
                    n = len(e.drafts) + 1
                    try:
                        results.append(verify_drafts(self.sampler, spec_logits[row:row + n], [e])[0])
                    except Exception as exc:  # noqa: BLE001 - this request's own inputs: it alone ends
                        failed[st.req_id] = f"sampling failed: {type(exc).__name__}: {exc}"
                        results.append(None)
                    row += n
            row = 0
            for st, e, toks in zip(verified, entries, results):
                n = len(e.drafts) + 1
                row, first = row + n, row
                if toks is None:
                    continue
                for tok in toks:
                    self.batch.append_token(st, tok)
                sampled[st.req_id] = toks
                rejected[st.req_id] = n - len(toks)
                if len(self.grammar):
                    self.grammar.accept([st.req_id] * len(toks), toks)
                top_n = st.sampling_params.logprobs
                if top_n is not None:
                    # As plain decoding reports them: the (grammar-masked) raw logits of each position.
                    raw = torch.log_softmax(spec_logits[first:first + len(toks)].float(), dim=-1)
                    logprobs[st.req_id] = prompt_logprob_records(raw, toks, top_n)
        return logits[plain_idx], plain

    def _propose(self, sampled: dict[str, list[int]]) -> dict[str, list[int]]:
        """Drafts for every request that sampled."""
        out: dict[str, list[int]] = {}
        reqs = self.batch.requests
        for rid in sampled:
            st = reqs[rid]
            sp = st.sampling_params
            drafts = self.proposer.propose(self.batch.token_ids[st.row, :len(st.token_ids)])
            if drafts:
                out[rid] = drafts
        return out

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow], sampling: list[CachedRequestState],
                failed: dict[str, str]) -> tuple[list[int | None], list[Logprob | None]]:
        """The batch's tokens; on failure rows are retried alone so only the failing ones fail."""
        try:
            tokens, lps = self.sampler(logits, rows)
            return list(tokens), lps
        except Exception:  # noqa: BLE001 - find the request whose inputs broke the batch
            pass
        tokens_out: list[int | None] = []
        lps_out: list[Logprob | None] = []
        for i, (row, st) in enumerate(zip(rows, sampling)):
            try:
                tok, lp = self.sampler(logits[i:i + 1], [row])
            except Exception as e:  # noqa: BLE001 - this request's own inputs: it alone ends
                failed[st.req_id] = f"sampling failed: {type(e).__name__}: {e}"
                tokens_out.append(None)
                lps_out.append(None)
            else:
                tokens_out.append(tok[0])
                lps_out.append(lp[0])
        return tokens_out, lps_out

    def _prompt_logprobs(self, hidden: torch.Tensor, states: list[CachedRequestState], q_lens: list[int],
                         starts: list[int]) -> dict[str, tuple[int, list[Logprob]]]:
        """Prompt-token logprobs this step's chunks predict, for requests that asked."""
        out: dict[str, tuple[int, list[Logprob]]] = {}
        offset = 0
        for st, q, start in zip(states, q_lens, starts):
            top_n = st.sampling_params.prompt_logprobs
            # Position p predicts token p + 1; the sampler reports the first output token.
            end = min(start + q, st.num_prompt_tokens - 1)
            if top_n is not None and start < end:
                targets = st.token_ids[start + 1:end + 1]
                records: list[Logprob] = []
                for c0 in range(0, end - start, _PROMPT_LP_CHUNK):
                    c1 = min(end - start, c0 + _PROMPT_LP_CHUNK)
                    lp = torch.log_softmax(self.model.compute_logits(hidden[offset + c0:offset + c1]), dim=-1)
                    records.extend(prompt_logprob_records(lp, targets[c0:c1], top_n))
                out[st.req_id] = (start + 1, records)
            offset += q
        return out

    def _phase_events(self) -> tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event] | None:
        if self.device.type != "cuda":
            return None
        if self._events is None:
            self._events = tuple(torch.cuda.Event(enable_timing=True) for _ in range(3))
        return self._events

    def _phase_times(self, t0: float, t1: float, t2: float,
                     events: tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event] | None
                     ) -> tuple[float, float, float]:
        """(prepare_s, forward_s, sample_s) of the step that began at t0 and prepared until t1.

        On CUDA launches are async, so forward_s is event device time and sample_s the remaining
        wall time: the three still add up to the step's wall time.
        """
        if events is None:
            return t1 - t0, t2 - t1, time.perf_counter() - t2
        self.last_shape.forward_launch_time = t2 - t1
        events[2].record()
        events[2].synchronize()  # at once for a step that read its sampled tokens back
        t3 = time.perf_counter()
        forward = events[0].elapsed_time(events[1]) / 1e3
        return t1 - t0, forward, max(t3 - t1 - forward, 0.0)

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
        """Flat token ids, positions and attention metadata, with array ops (no per-token loop)."""
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
        if self.batch.num_groups > 1:
            meta.groups = [meta]
            pos_blocks, offsets = positions // bs, positions % bs
            for g in range(1, self.batch.num_groups):
                table = self.batch.block_tables[g]
                gm = AttentionMetadata(
                    total, num_decodes, meta.query_start_loc, meta.seq_lens,
                    put(f"block_tables{g}", np.ascontiguousarray(table[rows, :-(-max_seq // bs)])),
                    put(f"slots{g}", table[rows_rep, pos_blocks].astype(np.int64) * bs + offsets),
                    meta.max_query_len, max_seq, q_lens, meta.seq_lens_cpu)
                self.backend.plan(gm, bs, self.model.config.num_key_value_heads)
                meta.groups.append(gm)
        ends = seq_lens.tolist()
        drafts = self._drafts
        if not drafts:
            sampling = [st for st, e in zip(states, ends) if e == len(st.token_ids)]
            sample_at = np.fromiter((int(cu[i + 1]) - 1 for i, (st, e) in enumerate(zip(states, ends))
                                     if e == len(st.token_ids)), dtype=np.int64)
        else:
            # A request verifying k drafts samples at its last k + 1 positions.
            sampling, at = [], []
            for i, (st, e) in enumerate(zip(states, ends)):
                nd = len(drafts.get(st.req_id, ()))
                if e == len(st.token_ids) + nd:
                    sampling.append(st)
                    at.extend(range(int(cu[i + 1]) - 1 - nd, int(cu[i + 1])))
            sample_at = np.asarray(at, dtype=np.int64)
        out = (put("input_ids", input_ids), put("positions", positions), meta,
               put("logits_idx", sample_at), sampling)
        self._pinned.copies_queued()
        return out


class _PinnedStaging:
    """Host arrays -> device tensors; on CUDA through reused pinned buffers and async copies.

    Pageable copies block the host. A step may read nothing back, so an event after each step's
    copies is waited on before a buffer is rewritten.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.buffers: dict[str, torch.Tensor] = {}
        self._copied: torch.cuda.Event | None = None

    def copies_queued(self) -> None:
        if self.cuda:
            if self._copied is None:
                self._copied = torch.cuda.Event()
            self._copied.record()

    def put(self, name: str, arr: np.ndarray) -> torch.Tensor:
        src = torch.from_numpy(arr)
        if not self.cuda:
            return src if self.device.type == "cpu" else src.to(self.device)
        if self._copied is not None:
            self._copied.synchronize()  # returns at once unless the last step's copies are pending
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < src.numel() or buf.dtype != src.dtype:
            buf = self.buffers[name] = torch.empty(max(src.numel(), 1024), dtype=src.dtype, pin_memory=True)
        staged = buf[:src.numel()].view(src.shape)
        staged.copy_(src)
        return staged.to(self.device, non_blocking=True)

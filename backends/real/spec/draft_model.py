"""Draft-model proposals: a smaller model with the target's vocabulary and its own paged KV cache.

The draft's K/V tensors are its own, indexed with the target's block ids (as vLLM does); the
scheduler reserves num_lookahead_tokens slots past each sampling step for the positions the
draft feeds while drafting. At every step's start the draft's KV is valid exactly where the
target's is (positions below num_computed_tokens), so prefix hits, preemption and rollback need
nothing of their own: each step the draft catches up on what the target verified, then drafts.
With temperature > 0 it samples from its own processed distribution q, which verification
needs (Leviathan et al. 2023, Algorithm 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from twinserve.core.errors import InvalidConfigError
from twinserve.backends.real.attention import AttentionBackend, AttentionMetadata
from twinserve.backends.real.input_batch import CachedRequestState, InputBatch
from twinserve.backends.real.models.architectures import CausalLM
from twinserve.backends.real.models.config import model_context
from twinserve.backends.real.sampler import Sampler, SamplingRow, step_seed, uniforms

# Keeps the draft's uniforms apart from verification's and plain sampling's.
_DRAFT_SALT = 0x2545F4914F6CDD1D


@dataclass(slots=True)
class DraftWork:
    """One request's share of a step: catch up on [start, end), then draft k tokens (k may be 0)."""

    st: CachedRequestState
    start: int
    end: int
    k: int
    row: SamplingRow | None = None


class DraftModelProposer:
    """Runs the draft model beside the target: catch-up forwards and k autoregressive drafts."""

    def __init__(self, model: CausalLM, backend: AttentionBackend, device: torch.device, block_size: int,
                 num_speculative_tokens: int, sampler: Sampler) -> None:
        self.model = model
        self.backend = backend
        self.device = device
        self.block_size = block_size
        self.k = num_speculative_tokens
        self.sampler = sampler
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        # Draft forwards run in the last step (catch-up included).
        self.last_num_forwards = 0
        # q [k, V] behind each random request's pending drafts, until they are verified.
        self.pending_probs: dict[str, torch.Tensor] = {}

    def init_kv_cache(self, num_blocks: int, dtype: torch.dtype) -> None:
        """The draft's own K and V per layer, as many blocks as the target's."""
        cfg = self.model.config
        shape = (num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=self.device),
                           torch.zeros(shape, dtype=dtype, device=self.device))
                          for _ in range(cfg.num_hidden_layers)]

    def forget(self, req_ids) -> None:
        """Drop the pending q of finished or preempted requests."""
        if self.pending_probs:
            for rid in req_ids:
                self.pending_probs.pop(rid, None)

    def probs_for(self, req_id: str, num_drafts: int) -> torch.Tensor:
        """q of a random request's first num_drafts pending drafts (verification needs them)."""
        q = self.pending_probs.get(req_id)
        if q is None or q.shape[0] < num_drafts:
            raise RuntimeError(f"request {req_id}: drafts without the draft model's probabilities")
        return q[:num_drafts]

    def propose(self, batch: InputBatch, states: list[CachedRequestState], starts: list[int],
                sampled: dict[str, list[int]], failed: dict[str, str], active: bool, max_model_len: int,
                row_of: Callable[[CachedRequestState], SamplingRow]) -> dict[str, list[int]]:
        """After a step: catch up on what the target verified (from each request's computed tokens at
        the step's start), then draft for those that sampled when active; the drafts by request."""
        bs = self.block_size
        work: list[DraftWork] = []
        for st, start in zip(states, starts):
            rid = st.req_id
            if rid in failed:
                continue
            n = st.num_computed_tokens  # the target's KV is valid below n; so will the draft's be
            # Drafting feeds positions n .. n+k-1: only slots the request holds (its lookahead).
            k = min(self.k, min(st.num_blocks * bs, max_model_len) - n) if active and rid in sampled else 0
            work.append(DraftWork(st, start, n + 1, k, row_of(st)) if k > 0 else DraftWork(st, start, n, 0))
        for rid in sampled:
            self.pending_probs.pop(rid, None)
        drafts, probs = self.run(batch, work)
        self.pending_probs.update(probs)
        return drafts

    def run(self, batch: InputBatch, work: list[DraftWork]
            ) -> tuple[dict[str, list[int]], dict[str, torch.Tensor]]:
        """Catch up every request, then draft; returns drafts and, for random rows, q [k, V] (CPU float64)."""
        self.last_num_forwards = 0
        work = [w for w in work if w.end > w.start]
        if not work:
            return {}, {}
        # Decodes (one token to catch up) first, as the attention metadata expects.
        work.sort(key=lambda w: w.end - w.start != 1)
        rows = np.fromiter((w.st.row for w in work), dtype=np.int64, count=len(work))
        starts = np.fromiter((w.start for w in work), dtype=np.int64, count=len(work))
        ends = np.fromiter((w.end for w in work), dtype=np.int64, count=len(work))
        hidden = self._forward(batch, rows, starts, ends, batch.token_ids[np.repeat(rows, ends - starts),
                                                                        _ranges(starts, ends)])
        drafting = [i for i, w in enumerate(work) if w.k > 0]
        if not drafting:
            return {}, {}
        last = torch.from_numpy(np.cumsum(ends - starts)[drafting] - 1).to(self.device)
        logits = self.model.compute_logits(hidden[last])
        live = [work[i] for i in drafting]
        drafts: dict[str, list[int]] = {w.st.req_id: [] for w in live}
        probs: dict[str, list[torch.Tensor]] = {w.st.req_id: [] for w in live}
        pos = ends[drafting].copy()  # where each live request feeds its next draft
        for j in range(max(w.k for w in live)):
            toks = self._sample(logits, live, drafts, probs)
            for w, t in zip(live, toks):
                drafts[w.st.req_id].append(t)
            keep = [i for i, w in enumerate(live) if w.k > j + 1]
            if not keep:
                break
            live = [live[i] for i in keep]
            pos = pos[keep]
            ids = np.fromiter((drafts[w.st.req_id][-1] for w in live), dtype=np.int64, count=len(live))
            lrows = np.fromiter((w.st.row for w in live), dtype=np.int64, count=len(live))
            logits = self.model.compute_logits(self._forward(batch, lrows, pos, pos + 1, ids))
            pos = pos + 1
        q = {rid: torch.stack(ps) for rid, ps in probs.items() if ps}
        return drafts, q

    def _forward(self, batch: InputBatch, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 input_ids: np.ndarray) -> torch.Tensor:
        """One draft forward over positions [start, end) of each row, through the target's block table."""
        bs = self.block_size
        q = ends - starts
        n = len(rows)
        cu = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(q, out=cu[1:])
        positions = _ranges(starts, ends)
        rows_rep = np.repeat(rows, q)
        slots = batch.block_table[rows_rep, positions // bs].astype(np.int64) * bs + positions % bs
        max_seq = int(ends.max())
        q_list = q.tolist()
        dev = self.device
        meta = AttentionMetadata(
            num_tokens=int(cu[-1]),
            num_decodes=next((i for i, x in enumerate(q_list) if x != 1), n),
            query_start_loc=torch.from_numpy(cu.astype(np.int32)).to(dev),
            seq_lens=torch.from_numpy(ends.astype(np.int32)).to(dev),
            block_tables=torch.from_numpy(np.ascontiguousarray(batch.block_table[rows, :-(-max_seq // bs)])).to(dev),
            slot_mapping=torch.from_numpy(slots).to(dev),
            max_query_len=int(q.max()),
            max_seq_len=max_seq,
            query_lens_cpu=q_list,
            seq_lens_cpu=ends.tolist(),
        )
        self.backend.plan(meta, bs, self.model.config.num_key_value_heads)
        self.last_num_forwards += 1
        return self.model(torch.from_numpy(np.ascontiguousarray(input_ids)).to(dev),
                          torch.from_numpy(positions).to(dev), self.kv_caches, meta, self.backend)

    def _sample(self, logits: torch.Tensor, live: list[DraftWork], drafts: dict[str, list[int]],
                probs: dict[str, list[torch.Tensor]]) -> list[int]:
        """The next draft per live request: greedy rows take the argmax, random rows draw from q."""
        rows = []
        for w in live:
            r = w.row
            d = drafts[w.st.req_id]
            rows.append(r if not d else SamplingRow(r.params, r.token_ids + d, r.num_prompt_tokens,
                                                    r.base_seed, r.stop_ids))
        processed = self.sampler.processed_logits(logits, rows)
        toks = processed.argmax(dim=-1).tolist()
        rand = [i for i, r in enumerate(rows) if not r.params.greedy]
        if rand:
            q = self.sampler.probs(processed[rand], [rows[i] for i in rand]).cpu()
            counters = torch.tensor([step_seed(rows[i].base_seed ^ _DRAFT_SALT, rows[i].num_output_tokens)
                                     for i in rand], dtype=torch.int64)
            u = uniforms(counters)
            cdf = q.cumsum(dim=-1)
            drawn = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
            drawn = drawn.clamp_(max=q.shape[1] - 1).tolist()
            for j, i in enumerate(rand):
                toks[i] = drawn[j]
                probs[live[i].st.req_id].append(q[j])
        return toks


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenated aranges [start, end) per row, without a Python loop."""
    q = ends - starts
    cu = np.cumsum(q)
    return np.arange(int(cu[-1]) if len(cu) else 0, dtype=np.int64) - np.repeat(cu - q - starts, q)


def num_parameters(cfg) -> int:
    """Weights of a decoder from its config: embeddings, head (unless tied), attention, MLP, norms."""
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    attn = h * cfg.q_size * 2 + h * cfg.kv_size * 2
    mlp = 3 * h * cfg.intermediate_size
    embed = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return embed + layers * (attn + mlp + 2 * h) + h


def check_draft_model(draft_cfg, target_cfg, max_model_len: int, draft_context: int,
                      kv_window: int | None = None) -> None:
    """Typed errors for a draft that cannot serve this target: another vocabulary, more weights, too
    short a context, or one that attends further back than the KV manager keeps blocks (kv_window)."""
    if draft_cfg.vocab_size != target_cfg.vocab_size:
        raise InvalidConfigError("speculative_config.model", draft_cfg.vocab_size,
                                 f"a draft with the target's vocabulary ({target_cfg.vocab_size} tokens), "
                                 f"not {draft_cfg.vocab_size}")
    d, t = num_parameters(draft_cfg), num_parameters(target_cfg)
    if d > t:
        raise InvalidConfigError("speculative_config.model", f"{d:,} parameters",
                                 f"a draft no larger than the target ({t:,} parameters)")
    if draft_context < max_model_len:
        raise InvalidConfigError("speculative_config.model", f"a {draft_context}-token context",
                                 f"a draft whose context covers max_model_len={max_model_len}")
    if kv_window is not None and any(w is None or w > kv_window for w in draft_cfg.layer_windows):
        raise InvalidConfigError("speculative_config.model", draft_cfg.architecture,
                                 f"a draft whose layers attend within the target's {kv_window}-token window "
                                 "(the KV manager frees the blocks behind it)")


def resolve_draft_model(name: str, target_cfg, max_model_len: int, kv_window: int | None = None):
    """(ModelSource, config) of the draft named in --speculative-config, checked against the target."""
    from twinserve.backends.real.models.loader import peek_model_config
    from twinserve.backends.real.models.registry import resolve_model

    source = resolve_model(name)
    cfg = peek_model_config(source)
    check_draft_model(cfg, target_cfg, max_model_len, model_context(cfg), kv_window)
    return source, cfg

"""AicCostModel: each step priced from aiconfigurator-core's measured per-operation kernel timings.

A step's time is the sum of aic's own answers (EngineHandle.evaluate_ops_json) for its ops at the
step's shape, in aic's three-pass composition of a mixed step (sdk/rust_engine_step.py): the linear
layers, norms, MoE and all-reduces over all the step's tokens; context attention over the prefill
chunks; generation attention over the decode rows at their context. Plus, when set, the engine's
host cost per step and per sequence (aic's own step estimate has none).
"""

from __future__ import annotations

from typing import Any

from twinserve.backends.sim.catalog import HardwareSpec, ModelSpec

from twinserve.backends.sim.aic.graph import StepGraph, build_graph
from twinserve.backends.sim.aic.mapping import AicError, check_precision, quant_modes, resolve_version, sdk, system_for

_MS = 1e-3
KV_GRID = 16  # decode attention is priced at the context rounded up to this many tokens (a KV block)


def _total(rows: list[tuple[str, float, float, str]]) -> float:
    """Sum of an evaluate_ops_json answer's latencies (ms)."""
    t = 0.0
    for row in rows:
        t += row[1]
    return t


class AicCostModel:
    """Step time from aic's database for one model on one GPU of a TP group; prices memoized by shape.

    Prefill chunks are priced as num_prefill_seqs equal chunks of their mean size and mean cached
    context (exact for one chunk); decode rows at their mean context plus the token they write.
    """

    __slots__ = ("name", "model", "hardware", "tp", "ep", "system", "backend", "version", "database",
                 "graph", "step_overhead_s", "per_seq_overhead_s", "_eval", "_tok", "_seq", "_ctx", "_gen")

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp: int = 1, backend: str = "vllm",
                 version: str = "", ep: int = 1, step_overhead_s: float = 0.0,
                 per_seq_overhead_s: float = 0.0) -> None:
        if tp < 1 or model.num_heads % tp or model.num_kv_heads % tp and tp % model.num_kv_heads:
            raise AicError("tensor_parallel_size", f"tensor_parallel_size={tp} does not divide "
                           f"{model.name}'s {model.num_heads} heads / {model.num_kv_heads} KV heads")
        if ep < 1 or tp % ep or (model.is_moe and model.num_experts % ep):
            raise AicError("expert_parallel_size", f"expert_parallel_size={ep} must divide the TP size "
                           f"{tp} and the {model.num_experts} experts")
        pdb = sdk()
        self.name = "aic"
        self.model, self.hardware, self.tp, self.ep = model, hardware, tp, ep
        self.system = system_for(hardware.name)
        self.backend = backend
        self.version = resolve_version(self.system, backend, version)
        self.database = _load(pdb, self.system, backend, self.version)
        modes = quant_modes(model.precision, model.is_moe)
        check_precision(self.database, modes, model.precision)
        self.graph: StepGraph = build_graph(model, tp, modes, backend, self.database, ep)
        from aiconfigurator_core.sdk.engine import EngineHandle
        self._eval = EngineHandle.for_database(self.database).evaluate_ops_json
        self._probe()
        self.step_overhead_s = step_overhead_s
        self.per_seq_overhead_s = per_seq_overhead_s
        self._tok: list[float] = []   # running max by token count
        self._seq: list[float] = []   # running max by sequence count
        self._ctx: dict[tuple[int, int, int], float] = {}
        self._gen: list[list[float]] = [[0.0]]  # [rows][kv_len / KV_GRID], running max both ways

    def _probe(self) -> None:
        """Query every op once, so a shape the database has no timings for fails now, by name."""
        g = self.graph
        calls = [("linear layers", g.tokens, True, 1, 1, 0, 16), ("LM head", g.logits, True, 1, 1, 0, 1)]
        calls += [("context attention", js, True, 1, 128, 0, None) for js, _ in g.context_attn]
        calls += [("generation attention", js, False, 1, 128, 0, None) for js, _ in g.generation_attn]
        for what, js, is_context, b, s, prefix, x in calls:
            try:
                self._eval(js, is_context=is_context, batch_size=b, s=s, prefix=prefix, x=x)
            except Exception as err:  # aic's PerfDataNotAvailableError and kin: no timings for this shape
                m = self.model
                have = attention_shapes(self.database) if "attention" in what else ""
                raise AicError("model", f"aiconfigurator-core's {self.describe()} database has no {what} "
                               f"timings for {m.name} at TP {self.tp} ({m.num_heads // self.tp} heads, "
                               f"{m.kv_heads_per_gpu(self.tp)} KV heads per GPU, head_dim {m.head_dim}, "
                               f"{m.precision.label()}): {str(err).split(': tried')[0]}"
                               + (f"; it has (KV heads per GPU, head_dim, window): {have}" if have else "")
                               ) from None

    def describe(self) -> str:
        """What prices the steps, e.g. 'aic vllm 0.24.0 on h200_sxm'."""
        return f"aic {self.backend} {self.version} on {self.system}"

    # Each part in seconds, memoized: the same shape always returns the same float. The measured tables
    # are not monotone (Llama-3.1-8B on H200: 33 token counts below 4,096 price up to 5.7% under a
    # smaller one); the linear part, the LM head and decode attention take their running maximum, so
    # one more row or token of context never makes a step cheaper. Where the table is monotone the
    # price is the table's own answer.
    def _db_tokens(self, tokens: int) -> float:
        return _total(self._eval(self.graph.tokens, is_context=True, batch_size=1, s=1, x=tokens)) * _MS

    def tokens_time(self, tokens: int) -> float:
        """Linear layers, norms, MoE and all-reduces over `tokens` rows (running max over fewer rows)."""
        env = self._tok
        while len(env) <= tokens:
            x = len(env)
            t = self._db_tokens(x) if x else 0.0
            env.append(t if not env or t > env[-1] else env[-1])
        return env[tokens]

    def logits_time(self, seqs: int) -> float:
        """The LM head over one row per sequence (running max over fewer sequences)."""
        env = self._seq
        while len(env) <= seqs:
            x = len(env)
            t = _total(self._eval(self.graph.logits, is_context=True, batch_size=1, s=1, x=x)) * _MS if x else 0.0
            env.append(t if not env or t > env[-1] else env[-1])
        return env[seqs]

    def context_attention_time(self, seqs: int, q: int, cached: int) -> float:
        """Prefill attention of `seqs` chunks of q new tokens after `cached` tokens each (the table's answer)."""
        key = (seqs, q, cached)
        t = self._ctx.get(key)
        if t is None:
            t = 0.0
            for ops_json, _ in self.graph.context_attn:
                t += _total(self._eval(ops_json, is_context=True, batch_size=seqs, s=q, prefix=cached))
            t = self._ctx[key] = t * _MS
        return t

    def db_generation_attention(self, seqs: int, kv_len: int) -> float:
        """The table's decode attention of `seqs` rows each reading kv_len tokens of K/V."""
        t = 0.0
        for ops_json, _ in self.graph.generation_attn:
            t += _total(self._eval(ops_json, is_context=False, batch_size=seqs, s=kv_len))
        return t * _MS

    def generation_attention_time(self, seqs: int, kv_len: int) -> float:
        """Decode attention of `seqs` rows reading kv_len tokens each (their new one included), at kv_len
        rounded up to KV_GRID tokens: the running max over fewer rows and shorter contexts."""
        k = -(-kv_len // KV_GRID)
        env = self._gen
        while len(env) <= seqs:
            env.append([0.0])
        row = env[seqs]
        if len(row) <= k:
            for b in range(1, seqs + 1):  # rows below first: each cell is the max of its two neighbours
                below, r = env[b - 1], env[b]
                for j in range(len(r), k + 1):
                    t = self.db_generation_attention(b, j * KV_GRID)
                    if t < r[j - 1]:
                        t = r[j - 1]
                    if b > 1 and t < below[j]:
                        t = below[j]
                    r.append(t)
        return row[k]

    def step_time(self, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
                  prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
        """Seconds for a step: aic's price of each op at this shape, summed, plus host overheads."""
        tokens = num_prefill_tokens + num_decode_seqs
        seqs = num_prefill_seqs + num_decode_seqs
        if not tokens:
            return self.step_overhead_s
        t = self.tokens_time(tokens) + self.logits_time(seqs)
        if num_prefill_seqs:
            q = max(1, round(num_prefill_tokens / num_prefill_seqs))
            t += self.context_attention_time(num_prefill_seqs, q, round(prefill_context / num_prefill_seqs))
        if num_decode_seqs:
            t += self.generation_attention_time(num_decode_seqs, round(decode_context / num_decode_seqs) + 1)
        return t + self.step_overhead_s + self.per_seq_overhead_s * seqs

    def cache_size(self) -> int:
        """Distinct shapes priced so far (all parts)."""
        return len(self._tok) + len(self._seq) + len(self._ctx) + sum(map(len, self._gen))


def attention_shapes(db: Any) -> str:
    """The (KV heads per GPU, head_dim, window) the database's decode-attention table measured."""
    import aiconfigurator_core.sdk.operations as ops
    try:
        ops.GenerationAttention.load_data(db)
        table = db._generation_attention_data
        shapes = {(kv, d, w) for by_kv in table.values() for kv, by_d in by_kv.items()
                  for d, by_w in by_d.items() for w in by_w}
    except Exception:  # the listing is a courtesy; the error stands without it
        return ""
    return ", ".join(f"({kv or 'MHA'}, {d}, {w})" for kv, d, w in sorted(shapes))


_DATABASES: dict[tuple[str, str, str], Any] = {}


def _load(pdb: Any, system: str, backend: str, version: str) -> Any:
    """aic's PerfDatabase for (system, backend, version), loaded once per process."""
    key = (system, backend, version)
    db = _DATABASES.get(key)
    if db is None:
        import logging
        # aic logs every low-fidelity fallback table it loads at WARNING; a study's log is not the place.
        logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
        db = pdb.get_database(system, backend, version)
        if db is None:
            raise AicError("aic_version", f"aiconfigurator-core could not load its {backend} {version} "
                           f"database for {system}")
        _DATABASES[key] = db
    return db

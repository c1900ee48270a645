"""vLLM's Marlin MXFP4 MoE kernel (VLLM_MXFP4_USE_MARLIN=1), priced for a model aic has no Marlin rows for.

Why it matters: InferenceX serves gpt-oss on H100 / H200 with vLLM and `export VLLM_MXFP4_USE_MARLIN=1`
(SemiAnalysisAI/InferenceX benchmarks/gptoss_fp4_h200.sh @16cd955, gptoss_fp4_h100.sh @1fc5d73), which
makes vLLM's get_mxfp4_backend (vllm/model_executor/layers/quantization/mxfp4.py) return its MARLIN
backend instead of the Triton matmul_ogs kernel it runs on Hopper by default. aic's vLLM 0.24.0 Hopper
tables time gpt-oss's experts on that default kernel only (kernel_source
'vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic'); the only Marlin MXFP4 MoE rows they hold
are Kimi-K3's (hidden 3584, intermediate 3072, 896 experts, top-16; kernel_source
'vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu', collection_meta.yaml of
h200_sxm / h100_sxm moe/vllm/0.24.0: TP 1-16 at EP 1, EP 1-128 at TP 1).

The transfer: a grouped MoE GEMM's work is, per expert, a GEMM of (rows routed to it) x hidden x
intermediate, over 4-bit weights read once. At the same rows per expert (tokens x top-k / experts) the
two shapes run the same per-expert GEMM up to its (hidden x intermediate) size, so the reference's time
at T' = T x (k / E) / (k_ref / E_ref) tokens, times the ratio of the layers' expert work
(E x hidden x intermediate over the reference's), is the model's at T: both its FLOPs and its expert
weight bytes scale by that ratio. What does not scale is the fixed time of a launch (routing sort, block
alignment, kernel launches), which dominates at decode sizes, where both kernels only stream the same
4-bit weights: there the model's own measured table is the better price. The price taken is the larger
of the two, per layer, at each token count: the transfer where the kernel's throughput binds (prefill),
the model's table where it does not (decode). Nothing is fitted.

Marlin's own padding: vLLM pads each MXFP4 expert shard for its Marlin MoE kernel (n % 256 and k % 128 of
both GEMMs): the hidden size up to a multiple of 256 and the intermediate size per partition up to a
multiple of 128 (mxfp4.py create_weights / mxfp4_round_up_hidden_size_and_intermediate_size). gpt-oss's
2880 runs as 3072 hidden and, per shard, 2944 (TP 1), 1536 / 768 / 384 (TP 2 / 4 / 8): the work ratio is
taken over the padded shapes, the reference's by the same rule (Kimi-K3's shards up to TP 8 need none).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# aic's only Marlin MXFP4 MoE rows on Hopper (vLLM 0.24.0): Kimi-K3's expert shape (above).
MARLIN_REFERENCE = {"hidden_size": 3584, "inter_size": 3072, "num_experts": 896, "topk": 16}
MARLIN_KERNELS = ("default", "marlin")


@dataclass(slots=True, frozen=True)
class MarlinMoe:
    """The model's own expert op and the Marlin reference op (aic op JSON, one layer each) and the transfer."""

    own: str            # the model's expert op, one layer (its measured table)
    reference: str      # the reference shape's expert op at the same layout, one layer (aic's Marlin rows)
    token_ratio: float  # T' / T: the reference's tokens at the model's rows per expert
    work_ratio: float   # the model's expert work per layer over the reference's, at the same rows per expert
    layers: int         # MoE layers the extra time is paid on

    def reference_tokens(self, tokens: int) -> int:
        """The reference's token count with the model's routed rows per expert at `tokens`."""
        return max(1, round(tokens * self.token_ratio))


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def marlin_shard(hidden: int, inter: int, moe_tp: int) -> int:
    """hidden x intermediate of one expert's shard as vLLM's Marlin MoE lays it out (padded; module doc)."""
    return _round_up(hidden, 256) * _round_up(inter // moe_tp, 128)


def marlin_moe(token_graph: str) -> MarlinMoe | None:
    """The transfer for the MXFP4 expert op of a step graph (aic op JSON); None when it has none."""
    for entry in json.loads(token_graph):
        (kind, fields), = entry.items()
        if kind != "Moe" or fields.get("quant_mode") != "w4a16_mxfp4":
            continue
        own = {**fields, "scale_factor": 1.0}
        ref = {**own, **MARLIN_REFERENCE, "name": "marlin_reference_moe"}
        r, mtp = MARLIN_REFERENCE, fields["moe_tp_size"]
        token_ratio = (fields["topk"] / fields["num_experts"]) / (r["topk"] / r["num_experts"])
        work_ratio = (fields["num_experts"] * marlin_shard(fields["hidden_size"], fields["inter_size"], mtp)
                      / (r["num_experts"] * marlin_shard(r["hidden_size"], r["inter_size"], mtp)))
        return MarlinMoe(json.dumps([{kind: own}]), json.dumps([{kind: ref}]), token_ratio, work_ratio,
                         round(fields["scale_factor"]))
    return None


def marlin_extra_ms(evaluate: Any, marlin: MarlinMoe, tokens: int) -> float:
    """Milliseconds Marlin adds to a step of `tokens` rows over the model's own table, all MoE layers:
    layers x max(0, transfer - table) (module doc)."""
    def price(js: str, x: int) -> float:
        return sum(row[1] for row in evaluate(js, is_context=True, batch_size=1, s=1, x=x))
    table = price(marlin.own, tokens)
    transfer = price(marlin.reference, marlin.reference_tokens(tokens)) * marlin.work_ratio
    return marlin.layers * max(0.0, transfer - table)

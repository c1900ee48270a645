"""What-if, not used by the simulator: vLLM Llama-3.1-70B steps that run without CUDA graphs take at least FLOOR_MS.

    FLOOR_MS=55 python experiments/vllm_ungraphed_floor.py validate --silicon --cost-model aic --rows dev \
        --model Llama-3.1-70B --backend vllm --workers 1 --out /tmp/floor55

A step is taken as ungraphed when it carries prompt tokens and its token count is above 512, the largest
CUDA-graph size any of these rows' launches captures (docs/validate-accuracy.md, "vLLM B200 Llama-3.1-70B
first tokens"). The measured backend's step_time is wrapped in this process only (the validate workers fork
from it); FLOOR_MS=0 reproduces `simulate validate` float for float. Development rows only.
"""

from __future__ import annotations

import os
import sys

from twinserve.backends.sim.aic.cost_model import AicCostModel
from twinserve.sim.cli import main

FLOOR_S = float(os.environ.get("FLOOR_MS", "0")) * 1e-3
LARGEST_CAPTURED = 512
_step_time = AicCostModel.step_time


def _floored(self: AicCostModel, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
             prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
    t = _step_time(self, num_prefill_tokens, num_prefill_seqs, prefill_context, prefill_attn, num_decode_seqs,
                   decode_context)
    ungraphed = num_prefill_tokens > 0 and num_prefill_tokens + num_decode_seqs > LARGEST_CAPTURED
    if self.backend == "vllm" and self.model.name.startswith("Llama-3.1-70B") and ungraphed:
        return max(t, FLOOR_S)
    return t


if __name__ == "__main__":
    AicCostModel.step_time = _floored
    sys.exit(main())

"""What a run did (feature sums for MFU and MBU) and a draft model's steps, priced by a cost model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from twinserve.backends.sim.catalog import HardwareSpec, ModelSpec

if TYPE_CHECKING:
    from twinserve.backends.sim.cost_model import CostModel


@dataclass(slots=True)
class WorkTotals:
    """Feature sums over a run, enough to count FLOPs and bytes (both are linear in them)."""

    num_steps: int = 0
    num_prefill_tokens: int = 0
    num_prefill_seqs: int = 0
    prefill_context: int = 0
    prefill_attn: float = 0.0
    num_decode_seqs: int = 0
    decode_context: int = 0
    busy_time: float = 0.0
    # Steps larger than any the measured profile was fitted on (SimExecutor), and their time.
    beyond_fit_steps: int = 0
    beyond_fit_time: float = 0.0
    # Sliding-window layers read at most `window` cached tokens a sequence: the K/V tokens such a
    # layer read over the run, as step_time caps them (0 window: every layer reads full context).
    window: int = 0
    window_read: int = 0

    def window_tokens(self, pc: int, ps: int, pt: int, dc: int, ds: int) -> int:
        """The K/V tokens a sliding layer reads in one step (step_time's caps)."""
        w = self.window
        return min(pc, ps * w) + pt + min(dc + ds, ds * w)

    def count_window_read(self, pc: int, ps: int, pt: int, dc: int, ds: int) -> None:
        """Add one step's tokens read by a sliding layer (step_time's caps)."""
        if self.window:
            self.window_read += self.window_tokens(pc, ps, pt, dc, ds)

    def count_window_decode(self, context: int, n: int, k: int) -> None:
        """Add k decode steps of n sequences starting at context (growing by n a step)."""
        w = self.window
        if not (w and n and k):
            return
        cap = n * w
        # Step j reads min(context + n (j + 1), cap): the first m steps are below the cap.
        m = min(max((cap - context) // n, 0), k)
        self.window_read += m * context + n * m * (m + 1) // 2 + (k - m) * cap

    @staticmethod
    def window_of(model: ModelSpec) -> int:
        """The window whose reads a run counts for the model: 0 when no layer slides."""
        return model.sliding_window if model.sliding_window and model.num_sliding_layers else 0

    def flops(self, model: ModelSpec) -> float:
        """Model FLOPs (all GPUs together) of the work done."""
        m = model
        tokens = self.num_prefill_tokens + self.num_decode_seqs
        seqs = self.num_prefill_seqs + self.num_decode_seqs
        lin = 2.0 * (m.num_layers * m.active_params_per_layer * tokens
                     + m.vocab_size * m.hidden_size * seqs)
        pairs = self.prefill_attn + self.decode_context + self.num_decode_seqs
        return lin + 2.0 * m.num_layers * m.num_heads * (m.qk_head_dim + m.v_dim) * pairs

    def bytes_moved(self, model: ModelSpec) -> float:
        """HBM bytes (all GPUs together): weights once per step plus K/V read and written."""
        m = model
        tokens = self.num_prefill_tokens + self.num_decode_seqs
        p = m.precision
        routed = m.routed_params
        if m.is_moe:  # the experts a step of the run's mean size touches
            mean = tokens / self.num_steps if self.num_steps else 0.0
            routed = m.num_moe_layers * m.expected_experts(mean) * m.expert_params
        weights = (m.always_weight_bytes + routed * p.expert_weight_bytes
                   + m.vocab_size * m.hidden_size * m.dtype_bytes)
        full = self.prefill_context + tokens + self.decode_context
        kv = m.kv_bytes_per_token * full
        if self.window and m.sliding_window and m.num_sliding_layers:  # those layers read what step_time priced
            slide = m.num_sliding_layers / m.num_layers
            kv = m.kv_bytes_per_token * ((1.0 - slide) * full + slide * self.window_read)
        return weights * self.num_steps + kv

    def mfu(self, model: ModelSpec, hardware: HardwareSpec, tp: int) -> float:
        """Model FLOPs utilisation over the busy time."""
        if self.busy_time <= 0:
            return 0.0
        return self.flops(model) / (self.busy_time * tp * hardware.peak_flops)

    def mbu(self, model: ModelSpec, hardware: HardwareSpec, tp: int) -> float:
        """Memory bandwidth utilisation over the busy time."""
        if self.busy_time <= 0:
            return 0.0
        return self.bytes_moved(model) / (self.busy_time * tp * hardware.mem_bandwidth)


@dataclass(slots=True)
class DraftModelSteps:
    """The draft model's own forwards in one speculative step, priced by the draft's cost model.

    As the engine's DraftModelProposer runs them: one catch-up forward over what the target
    verified (prefill chunks and 1 + accepted + 1 tokens per drafting sequence), then k - 1
    decode forwards of the drafting sequences.
    """

    cost: CostModel
    num_speculative_tokens: int

    def time(self, catch_up: tuple[int, int, int, float, int, int], num_drafting: int,
             drafting_context: int) -> float:
        """Seconds of the draft's work: catch_up is a step's features (step_time's arguments);
        drafting_context sums the drafting sequences' lengths after the catch-up."""
        t = self.cost.step_time(*catch_up) if catch_up[0] or catch_up[4] else 0.0
        if num_drafting:
            for j in range(self.num_speculative_tokens - 1):
                t += self.cost.step_time(0, 0, 0, 0.0, num_drafting, drafting_context + j * num_drafting)
        return t

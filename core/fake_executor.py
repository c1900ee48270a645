"""A deterministic executor for tests: a toy 'model' whose next token is a function of the past."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sched.output import ModelRunnerOutput, SchedulerOutput


@dataclass(slots=True)
class _ReqState:
    token_ids: list[int]
    num_computed: int
    block_ids: list[int] = field(default_factory=list)


class ContractViolation(AssertionError):
    """The scheduler broke the executor contract (tokens, blocks or ordering)."""


class FakeExecutor:
    """Returns next-token = f(previous token, position), so recomputation reproduces outputs.

    It keeps per-request state from the scheduler outputs exactly as a model runner
    must, and checks the contract as it goes: every scheduled token is known, block
    tables cover the computed tokens, and nothing runs that the executor has dropped.
    """

    def __init__(self, vocab_size: int = 1000, block_size: int = 16, eos_token_id: int | None = None,
                 step_time: float | None = None) -> None:
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.eos_token_id = eos_token_id
        self.step_time = step_time
        self.state: dict[str, _ReqState] = {}
        self.num_steps = 0

    def next_token(self, prev_token: int, position: int) -> int:
        """The toy model: a fixed function of the previous token and its position."""
        return (prev_token * 31 + position * 17 + 7) % self.vocab_size

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Advance every scheduled request and sample for those that reached their end."""
        self.num_steps += 1
        for rid in so.finished_req_ids:
            self.state.pop(rid, None)
        for rid in so.preempted_req_ids:
            self.state.pop(rid, None)
        for new in so.scheduled_new_reqs:
            if new.req_id in self.state:
                raise ContractViolation(f"{new.req_id} sent as new while the executor holds it")
            self.state[new.req_id] = _ReqState(list(new.token_ids), new.num_computed_tokens,
                                               list(new.block_ids))
        cached = so.scheduled_cached_reqs
        for rid, blocks, computed in zip(cached.req_ids, cached.new_block_ids,
                                         cached.num_computed_tokens):
            st = self.state.get(rid)
            if st is None:
                raise ContractViolation(f"{rid} scheduled as running but unknown to the executor")
            if st.num_computed != computed:
                raise ContractViolation(f"{rid}: executor has {st.num_computed} computed, "
                                        f"scheduler says {computed}")
            st.block_ids.extend(blocks)
        sampled: dict[str, list[int]] = {}
        bs = self.block_size
        for rid, n in so.num_scheduled_tokens.items():
            st = self.state[rid]
            end = st.num_computed + n
            if end > len(st.token_ids):
                raise ContractViolation(f"{rid}: {n} tokens scheduled past the known sequence")
            if len(st.block_ids) * bs < end:
                raise ContractViolation(f"{rid}: {len(st.block_ids)} blocks cannot hold {end} tokens")
            st.num_computed = end
            if end == len(st.token_ids):
                tok = self.next_token(st.token_ids[-1], end)
                st.token_ids.append(tok)
                sampled[rid] = [tok]
        return ModelRunnerOutput(sampled, step_time=self.step_time)

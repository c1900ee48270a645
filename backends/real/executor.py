"""Executors: the seam between the engine core and the workers that own devices."""

from __future__ import annotations

from typing import Protocol

from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput
from twinserve.backends.real.model_runner import StepShape


class WorkerHandle(Protocol):
    """What an executor needs from a worker, whether in this process or behind a pipe."""

    num_blocks: int

    def determine_num_blocks(self) -> int:
        """KV blocks this worker can hold."""

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache."""

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step."""

    @property
    def last_step_shape(self) -> StepShape:
        """Shape of the step just run."""

    @property
    def last_step_timing(self) -> tuple[float, float, float]:
        """(prepare_s, forward_s, sample_s) of the step just run, when timing is on."""

    def set_timing(self, on: bool) -> None:
        """Time the phases of each step."""


class InProcessExecutor:
    """Runs the workers in this process; satisfies core.Executor.

    Every worker gets the same SchedulerOutput; the first one's output is returned and num_blocks is
    the minimum over workers.
    """

    def __init__(self, workers: list[WorkerHandle]) -> None:
        self.workers = workers
        self.num_steps = 0

    def initialize_kv_cache(self) -> int:
        """Size the KV cache on every worker (the smallest budget wins); returns num_blocks."""
        num_blocks = min(w.determine_num_blocks() for w in self.workers)
        for w in self.workers:
            w.init_kv_cache(num_blocks)
        return num_blocks

    def host_tier(self) -> tuple[int, int]:
        """(host-tier blocks every worker holds, rank 0's bytes per block)."""
        tiers = [w.host_tier() for w in self.workers]
        return min(n for n, _ in tiers), tiers[0][1]

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step on the workers; the first one's output is the step's."""
        outputs = [w.execute_model(scheduler_output) for w in self.workers]
        self.num_steps += 1
        return outputs[0]

    @property
    def last_step_shape(self) -> StepShape:
        """Shape of the step just run (rank 0's)."""
        return self.workers[0].last_step_shape

    @property
    def last_step_timing(self) -> tuple[float, float, float]:
        """(prepare_s, forward_s, sample_s) of the step just run (rank 0's)."""
        return self.workers[0].last_step_timing

    @property
    def last_comm_time(self) -> float:
        """Seconds rank 0 spent in tensor-parallel collectives in the step just run."""
        return getattr(self.workers[0], "last_comm_time", 0.0)

    def set_timing(self, on: bool) -> None:
        """Time each step's phases on every worker."""
        for w in self.workers:
            w.set_timing(on)

    def shutdown(self) -> None:
        """Nothing to release in process."""

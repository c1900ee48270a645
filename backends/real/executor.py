"""Executors: the seam between the engine core and the workers that own devices."""

from __future__ import annotations

from typing import Protocol

from ...core.sched.output import ModelRunnerOutput, SchedulerOutput
from .model_runner import StepShape
from .step_log import StepLog, StepRecord


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


class InProcessExecutor:
    """Runs one worker in this process and logs every step; satisfies core.Executor.

    With tensor parallelism each worker would get the same SchedulerOutput and the first
    one's ModelRunnerOutput would be returned; num_blocks is the minimum over workers.
    """

    def __init__(self, workers: list[WorkerHandle], step_log: StepLog | None = None) -> None:
        self.workers = workers
        self.step_log = step_log if step_log is not None else StepLog()
        self.num_steps = 0

    def initialize_kv_cache(self) -> int:
        """Size the KV cache on every worker (the smallest budget wins); returns num_blocks."""
        num_blocks = min(w.determine_num_blocks() for w in self.workers)
        for w in self.workers:
            w.init_kv_cache(num_blocks)
        return num_blocks

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step on the workers and record its shape and measured time."""
        outputs = [w.execute_model(scheduler_output) for w in self.workers]
        out = outputs[0]
        shape = self.workers[0].last_step_shape
        if shape.num_new_tokens:
            self.step_log.append(StepRecord(self.num_steps, shape.num_new_tokens, len(shape.prefills),
                                            len(shape.decodes), shape.prefills, shape.decodes,
                                            out.step_time or 0.0))
        self.num_steps += 1
        return out

    def shutdown(self) -> None:
        """Write the step log if a path was given."""
        self.step_log.write()

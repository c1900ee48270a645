"""twinserve's shared policy core: requests, KV cache, scheduler and engine core.

Pure Python (no torch, simpy, pandas or numpy), so the simulator and the real engine share it.
"""

from twinserve.core.engine_core import EngineCore, Executor, StepStats
from twinserve.core.errors import (ComputedTokensError, ExecutorOutputError, InvalidConfigError, InvalidRequestError,
                                   InvalidSamplingParamsError, PrefixCacheBusyError, PromptTooLongError,
                                   TwinserveError)
from twinserve.core.kv import BlockPool, KVCacheManager
from twinserve.core.request import FinishReason, Request, RequestStatus
from twinserve.core.sampling_params import SamplingParams
from twinserve.core.sched import (EngineCoreOutput, ModelRunnerOutput, NewRequestData, Scheduler,
                    SchedulerConfig, SchedulerOutput)

__all__ = [
    "BlockPool", "ComputedTokensError", "EngineCore", "EngineCoreOutput", "Executor", "ExecutorOutputError",
    "FinishReason",
    "InvalidConfigError", "InvalidRequestError", "InvalidSamplingParamsError",
    "KVCacheManager", "ModelRunnerOutput", "NewRequestData", "PrefixCacheBusyError",
    "PromptTooLongError", "Request", "RequestStatus", "SamplingParams", "Scheduler",
    "SchedulerConfig", "SchedulerOutput", "StepStats", "TwinserveError",
]

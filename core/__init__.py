"""twinserve's shared policy core: requests, KV cache, scheduler and engine core.

Pure Python: nothing here imports torch, simpy, pandas or numpy, so the simulator
and the real engine drive the very same objects.
"""

from .engine_core import EngineCore, Executor, StepStats
from .errors import (InvalidConfigError, InvalidRequestError, InvalidSamplingParamsError,
                     PrefixCacheBusyError, PromptTooLongError, TwinserveError)
from .kv import BlockPool, KVCacheManager
from .request import FinishReason, Request, RequestStatus
from .sampling_params import SamplingParams
from .sched import (EngineCoreOutput, ModelRunnerOutput, NewRequestData, Scheduler,
                    SchedulerConfig, SchedulerOutput)

__all__ = [
    "BlockPool", "EngineCore", "EngineCoreOutput", "Executor", "FinishReason",
    "InvalidConfigError", "InvalidRequestError", "InvalidSamplingParamsError",
    "KVCacheManager", "ModelRunnerOutput", "NewRequestData", "PrefixCacheBusyError",
    "PromptTooLongError", "Request", "RequestStatus", "SamplingParams", "Scheduler",
    "SchedulerConfig", "SchedulerOutput", "StepStats", "TwinserveError",
]

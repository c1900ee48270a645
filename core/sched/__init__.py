"""The scheduler, its config, its policies and its output contract."""

from .config import SchedulerConfig
from .output import (CachedRequestData, EngineCoreOutput, Logprob, ModelRunnerOutput,
                     NewRequestData, SchedulerOutput)
from .policies import (FCFSQueue, KeyedQueue, PreemptLastAdmitted, PreemptLowestPriority,
                       make_preemption_policy, make_queue)
from .scheduler import Scheduler

__all__ = [
    "CachedRequestData", "EngineCoreOutput", "FCFSQueue", "KeyedQueue", "Logprob",
    "ModelRunnerOutput", "NewRequestData", "PreemptLastAdmitted", "PreemptLowestPriority",
    "Scheduler", "SchedulerConfig", "SchedulerOutput", "make_preemption_policy", "make_queue",
]

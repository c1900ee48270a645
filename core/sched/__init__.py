"""The scheduler, its config, its policies and its output contract."""

from twinserve.core.sched.config import SchedulerConfig
from twinserve.core.sched.output import (CachedRequestData, EngineCoreOutput, Logprob, ModelRunnerOutput,
                     NewRequestData, SchedulerOutput)
from twinserve.core.sched.policies import (FCFSQueue, KeyedQueue, PreemptLastAdmitted, PreemptLowestPriority,
                       make_preemption_policy, make_queue)
from twinserve.core.sched.scheduler import Scheduler

__all__ = [
    "CachedRequestData", "EngineCoreOutput", "FCFSQueue", "KeyedQueue", "Logprob",
    "ModelRunnerOutput", "NewRequestData", "PreemptLastAdmitted", "PreemptLowestPriority",
    "Scheduler", "SchedulerConfig", "SchedulerOutput", "make_preemption_policy", "make_queue",
]

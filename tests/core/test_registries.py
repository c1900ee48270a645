"""Policy and router names come from the core's registries; the study config and the docs follow them."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.core import InvalidConfigError, SchedulerConfig
from twinserve.core.kv.hashing import HASH_FUNCTIONS
from twinserve.core.kv.host_policies import HOST_EVICTION_POLICIES
from twinserve.core.sched.batch_policy import BATCH_POLICIES, make_batch_policy
from twinserve.core.routing import ROUTERS, UnknownRouterError, make_router
from twinserve.core.sched.config import CAPACITY_POLICIES, SCHEDULER_CHOICES
from twinserve.core.sched.policies import (PREEMPTION_CHOICES, PREEMPTION_POLICIES, QUEUE_POLICIES,
                                           make_preemption_policy, make_queue)
from twinserve.sim.config import from_dict
from twinserve.sim.errors import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "policies.md"


def test_every_registered_name_is_described_in_the_docs() -> None:
    text = DOC.read_text()
    names = [*QUEUE_POLICIES, *PREEMPTION_CHOICES, *ROUTERS, *HASH_FUNCTIONS, *BATCH_POLICIES]
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, f"docs/policies.md does not describe {missing}"


def test_each_registry_builds_what_its_name_says() -> None:
    for name in QUEUE_POLICIES:
        assert make_queue(name, 30.0, 128) is not make_queue(name, 30.0, 128)
        SchedulerConfig(policy=name)
    for name in PREEMPTION_CHOICES:
        SchedulerConfig(preemption=name)
    assert type(make_preemption_policy("last", "priority")) is PREEMPTION_POLICIES["last"]
    assert type(make_preemption_policy("auto", "priority")) is PREEMPTION_POLICIES["priority"]
    assert type(make_preemption_policy("auto", "fcfs")) is PREEMPTION_POLICIES["last"]
    for name in ROUTERS:
        assert make_router(name).name == name
    for name in BATCH_POLICIES:
        assert make_batch_policy(name).name == name
    assert SCHEDULER_CHOICES == {"policy": tuple(QUEUE_POLICIES), "preemption": PREEMPTION_CHOICES,
                                 "prefix_caching_hash_algo": tuple(HASH_FUNCTIONS),
                                 "kv_offloading_policy": tuple(HOST_EVICTION_POLICIES),
                                 "batch_policy": tuple(BATCH_POLICIES), "capacity_policy": CAPACITY_POLICIES}


@pytest.mark.parametrize("field", ["policy", "preemption", "prefix_caching_hash_algo", "batch_policy",
                                   "capacity_policy"])
def test_a_name_outside_the_registry_is_a_typed_error_listing_the_registry(field: str) -> None:
    with pytest.raises(InvalidConfigError, match=", ".join(repr(c) for c in SCHEDULER_CHOICES[field])):
        SchedulerConfig(**{field: "nonesuch"})
    with pytest.raises(ConfigError, match=", ".join(repr(c) for c in SCHEDULER_CHOICES[field])):
        from_dict({"scheduler": {field: "nonesuch"}})
    with pytest.raises(InvalidConfigError, match=field):  # not even a name: still typed
        SchedulerConfig(**{field: ["nonesuch"]})


def test_the_study_config_takes_its_router_names_from_the_core() -> None:
    for name in ROUTERS:
        assert from_dict({"cluster": {"router": name}}).cluster.router == name
    with pytest.raises(ConfigError, match=", ".join(repr(c) for c in ROUTERS)):
        from_dict({"cluster": {"router": "nonesuch"}})
    with pytest.raises(UnknownRouterError, match="round_robin"):
        make_router("nonesuch")

"""The router's Prometheus series, and the replicas' series merged under a `replica` label."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


@dataclass(slots=True)
class ProxyMetrics:
    """Prometheus series of routing decisions and replica health."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    routed: Any = None
    errors: Any = None
    healthy: Any = None
    in_flight: Any = None
    refused: Any = None

    def __post_init__(self) -> None:
        r = self.registry
        self.routed = Counter("twinserve_router:requests_routed", "Requests the router sent to "
                              "each replica.", ["replica", "policy"], registry=r)
        self.errors = Counter("twinserve_router:replica_errors", "Requests that failed because "
                              "the replica could not be reached or broke off.", ["replica"],
                              registry=r)
        self.healthy = Gauge("twinserve_router:replica_healthy", "1 while the replica is in "
                             "rotation.", ["replica"], registry=r)
        self.in_flight = Gauge("twinserve_router:requests_in_flight", "Requests the proxy has "
                               "open on each replica.", ["replica"], registry=r)
        self.refused = Counter("twinserve_router:requests_refused", "Requests refused because "
                               "no replica was in rotation.", registry=r)


def merge_replica_metrics(scrapes: list[tuple[str, str]]) -> bytes:
    """(replica URL, its /metrics text) pairs as one exposition: every sample gains replica="<url>",
    and each family appears once (a scrape that does not parse is left out)."""
    families: dict[str, Metric] = {}
    for url, text in scrapes:
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError:
            continue
        for fam in parsed:
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            elif merged.type != fam.type:
                continue
            merged.samples.extend(Sample(x.name, {"replica": url, **x.labels}, x.value, x.timestamp, x.exemplar)
                                  for x in fam.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families:
    """A collector that yields fixed metric families (the replicas' series, relabelled)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        """The families as given."""
        return self.families

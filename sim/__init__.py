"""The study harness around the simulated backend: workloads, traces, the SimPy world,
metrics, reports and the `simulate` CLI."""

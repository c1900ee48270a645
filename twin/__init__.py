"""The twin's loop: calibrate a profile on the real engine, forecast a workload with it, judge the forecast.

calibrate.py / calfit.py: measure designed steps, fit the profile (backends/sim/fit.py).
fidelity.py: preflight.py (checks, no weights) -> forecast.py (forecast.json) -> realrun.py
(N real runs) -> verdict.py (per cell) -> report.py; schedule.py checks the plumbing.
"""

"""The twin's loop: calibrate the simulator from the real engine and measure how far apart they are.

Step log (engine) -> `twinserve calibrate` (calibrate.py, fit in backends/sim/fit.py) ->
profile JSON -> the simulator's FittedCostModel -> `twinserve fidelity` (fidelity.py, with a
real-time replay in realrun.py and the exact-schedule check in replay.py).
"""

"""Suite-wide set-up: Triton's interpreter and a fixed thread count before anything imports them."""

import os

# Must be in effect before any @triton.jit decorator runs: this machine has no GPU driver.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

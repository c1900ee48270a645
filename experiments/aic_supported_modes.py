"""Check backends.sim.aic.mapping.supported_modes against aiconfigurator-core's own
`PerfDatabase.supported_quant_mode` on every database of the installed package, and time both.

supported_modes reads the top-level keys of aic's engine table views; aic's own listing builds the whole
GEMM / MoE / attention tables in Python first. A mismatch is printed and the script exits 1.

    python experiments/aic_supported_modes.py [--systems h200_sxm,b200_sxm] [--backends vllm]
"""
from __future__ import annotations

import argparse
import sys
import time

from twinserve.backends.sim.aic.mapping import _MODE_TABLES, sdk, supported, supported_modes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default="", help="comma-separated aic systems (default: every installed one)")
    ap.add_argument("--backends", default="", help="comma-separated engines: vllm, sglang, trtllm (default: all)")
    args = ap.parse_args(argv)
    pdb = sdk()
    want_s = set(filter(None, args.systems.split(",")))
    want_b = set(filter(None, args.backends.split(",")))
    bad = checked = 0
    ours_s = theirs_s = 0.0
    for system, backends in sorted(supported().items()):
        if want_s and system not in want_s:
            continue
        for backend, versions in sorted(backends.items()):
            if want_b and backend not in want_b:
                continue
            for version in versions:
                # Ours first: it pays the engine handle's start, which aic's listing then finds warm.
                a = b = pdb.get_database(system, backend, version)
                if a is None:
                    continue
                for table in _MODE_TABLES:
                    t0 = time.process_time()
                    ours = supported_modes(a, table)
                    t1 = time.process_time()
                    theirs = sorted(b.supported_quant_mode[table])
                    t2 = time.process_time()
                    ours_s, theirs_s = ours_s + t1 - t0, theirs_s + t2 - t1
                    checked += 1
                    if ours != theirs:
                        bad += 1
                        print(f"MISMATCH {system} {backend} {version} {table}: ours {ours}, aic {theirs}")
                print(f"{system} {backend} {version}: checked", flush=True)
    print(f"{checked} listings, {bad} mismatches; CPU s ours {ours_s:.1f}, aic's {theirs_s:.1f} "
          f"({theirs_s / max(ours_s, 1e-9):.1f}x)")
    return 1 if bad or not checked else 0


if __name__ == "__main__":
    sys.exit(main())

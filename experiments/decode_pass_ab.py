"""Old against new decode passes on one scheduler, alternating call by call (same state, one process).

    taskset -c 1 python experiments/decode_pass_ab.py --old MAIN_CHECKOUT -n 500 2000 4000

Loads --old's core/sched/fast_forward.py (the tree before the executor's known lengths moved into the
windows' and join steps' own passes, docs/validate-speed.md, 2026-12-05) next to this tree's, builds a
scheduler of N plain decodes without a prefix cache (1,024-1,087-token prompts, blocks of 64), and
times, per request, each side's join-step decode half (old: schedule_decode_half, then the executor's
pass over the ids) and one- and three-step windows (old: the ids list, _apply_uncached, then
advance_decode's pass), the two sides alternating; then an uncached pool's second-pass
get_new_blocks + free_blocks through the general walk and the uncached one. Run-to-run noise under a
loaded machine cancels in these ratios; they are not a whole run's.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics as S
import time

from twinserve.core import ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from twinserve.core.kv.block_pool import BlockPool
import twinserve.core.sched.fast_forward as new


def _old_module(tree: str):
    spec = importlib.util.spec_from_file_location("old_fast_forward", f"{tree}/core/sched/fast_forward.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _bench(a, b, reps: int = 60) -> tuple[float, float]:
    ta, tb = [], []
    for i in range(reps):
        for fn, acc in ((a, ta), (b, tb)) if i % 2 else ((b, tb), (a, ta)):
            t = time.process_time()
            fn()
            acc.append(time.process_time() - t)
    return S.median(ta), S.median(tb)


def passes(old, n: int) -> None:
    """Per-request CPU of the join step's decode half and of 1- and 3-step windows, old and new."""
    cfg = SchedulerConfig(max_num_batched_tokens=n * 1100, max_num_seqs=n, max_model_len=100_000, block_size=64,
                          num_blocks=n * 200, enable_prefix_caching=False)
    s = Scheduler(cfg)
    sp = SamplingParams(max_tokens=90_000, ignore_eos=True)
    for i in range(n):
        s.add_request(Request(f"r{i}", list(range(1024 + i % 64)), sp))
    so = s.schedule(0.0)
    s.update_from_output(so, ModelRunnerOutput({r: [5] for r in so.num_scheduled_tokens}), 0.5)
    tokens = {r.request_id: 7 for r in s.running}
    state = {r.request_id: [r.num_tokens, r.num_prompt_tokens] for r in s.running}

    def old_join():
        ids, _, _ = old.schedule_decode_half(s, tokens.get, 1)
        for st in map(state.__getitem__, ids):  # SimExecutor.execute's pass over the decodes (before)
            st[0] += 1

    def new_join():
        new.schedule_decode_half(s, tokens.get, 1, state)

    def old_window(k):
        def run():
            ids = [r.request_id for r in s.running]  # ClusterSimulation._plan_window (before)
            old._apply_uncached(s, [1.0] * k, None, tokens.get, 1, False)
            for st in map(state.__getitem__, ids):  # SimExecutor.advance_decode's pass (before)
                st[0] += k
        return run

    def new_window(k):
        return lambda: new._apply_uncached(s, [1.0] * k, None, tokens.get, 1, False, state)

    for name, a, b in (("join step", old_join, new_join), ("window k=1", old_window(1), new_window(1)),
                       ("window k=3", old_window(3), new_window(3))):
        x, y = _bench(a, b)
        print(f"{name:11s} N={n:5d}: old {1e6 * x / n:.3f} us/request, new {1e6 * y / n:.3f}, new/old {y / x:.3f}")


def pool_walk(blocks: int = 200_000, rounds: int = 5) -> None:
    """An uncached pool's second pass (every block freed once): general walk against the uncached one."""
    def run(uncached: bool) -> float:
        p = BlockPool(blocks, enable_caching=False)
        p.free_blocks(p.get_new_blocks(blocks))
        if not uncached:
            p.enable_caching = True  # nothing is cached: the general walk, the same blocks
        t = time.process_time()
        for _ in range(4):
            p.free_blocks(p.get_new_blocks(blocks))
        return time.process_time() - t

    ratios = []
    for _ in range(rounds):
        x = run(False)
        y = run(True)
        ratios.append(y / x)
    print(f"get_new_blocks + free_blocks, second pass of {blocks:,} blocks: new/old {S.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="the old tree's root (its core/sched/fast_forward.py is loaded)")
    p.add_argument("-n", type=int, nargs="+", default=[500, 2000, 4000], help="batch sizes")
    args = p.parse_args()
    old = _old_module(args.old)
    for n in args.n:
        passes(old, n)
    pool_walk()


if __name__ == "__main__":
    main()

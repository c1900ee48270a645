"""Scheduler hot-path benchmark: microseconds per decode step and allocator throughput.

Prints us per schedule() + update_from_output() at 64, 256 and 1,024 running decode
requests (prefix caching on, block size 16): the mean, p99 and median step, per step and
per request, and allocate/free operations per second. The executor's own work is not
timed: only the policy core is.

Blocks fill during the run: every request decodes one token a step from a 128-token
prompt, so each request takes a new block once every 16 steps and, at another step,
registers its newly full block in the prefix cache (since lazy registration, a pending
chain's block is hashed only if a lookup reaches it: see core/kv/kv_cache_manager.py's
PendingChain; the prompts share a 64-token system prompt, so each request's chain starts
at its first own block). The mean and p99 cover all steps, those included; the median is
a plain decode step.

--baseline REF also times core/ as of a git revision (extracted to a temporary folder, its own
imports renamed so it never loads the working tree's core: --baseline HEAD on a clean tree is an A/A
check whose ratios should be ~1),
alternating runs with the working tree's, and prints the ratios of the two. --baseline may be given
more than once (e.g. `--baseline 4b37f8e^ --baseline main`): every core is timed in the same
interleaved run, and each baseline gets its own row of ratios against the working tree. --aa REF times REF
against a second extracted copy of itself: the ratios must be ~1 (the run's noise floor). A
baseline whose core/ is the working tree's is reported as an A/A run.

--warm-pool makes every KV block before timing: since the pool makes blocks on first use, a cold
run's block-filling steps also pay for making them (once per block in a process's life).

--nano-vllm also times nano-vllm's decode-step algorithm (experiments/nano_vllm_sched.py, re-created
from its published source) on the same workload in the same run, per request.

    python experiments/bench_scheduler.py [--steps 400] [--repeats 5] [--sizes 64,256,1024]
                                          [--baseline REF ... | --aa REF] [--nano-vllm] [--warm-pool]
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import importlib.util
import io
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from types import ModuleType

import twinserve.core as current_core
from twinserve.core.kv import KVCacheManager


def decode_step_times(num_reqs: int, steps: int, prompt_len: int = 128,
                      core: ModuleType = current_core, warm_pool: bool = False) -> tuple[list[float], list[bool]]:
    """Per-step seconds of schedule+update with num_reqs requests all decoding.

    Also says, per step, whether it filled blocks (allocated one or registered a full one).
    core is the policy package to time (twinserve.core, or a baseline's copy). warm_pool makes
    every block before timing (a pool past its first pass; a core that makes them up front has
    nothing to do).
    """
    ModelRunnerOutput, Request = core.ModelRunnerOutput, core.Request
    cfg = core.SchedulerConfig(max_num_batched_tokens=max(8192, num_reqs), max_num_seqs=num_reqs,
                               max_model_len=prompt_len + steps + 64, block_size=16,
                               num_blocks=num_reqs * ((prompt_len + steps + 64) // 16 + 2),
                               enable_prefix_caching=True)
    sched = core.Scheduler(cfg)
    sp = core.SamplingParams(max_tokens=steps + 32, ignore_eos=True)
    for i in range(num_reqs):
        # distinct prompts sharing a 64-token system prompt: real prefix hashing work
        prompt = [1] * 64 + [(i * 7 + j) % 30000 + 2 for j in range(prompt_len - 64)]
        sched.add_request(Request(f"r{i}", prompt, sp))
    # prefill until every request decodes
    while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens
                               for r in sched.requests.values()):
        so = sched.schedule(0.0)
        sampled = {rid: [5] for rid, n in so.num_scheduled_tokens.items()
                   if sched.requests[rid].num_computed_tokens == sched.requests[rid].num_tokens}
        sched.update_from_output(so, ModelRunnerOutput(sampled), 0.0)
    if warm_pool:
        getattr(sched.kv.pool.free_queue, "materialize", lambda: None)()
    ids = list(sched.requests)
    token = [7]
    times = []
    filled = []
    bs = cfg.block_size
    gc.collect()
    gc.disable()  # a real engine tunes the collector too; measure the code, not gen-2 pauses
    try:
        for step in range(steps):
            t0 = time.perf_counter()
            so = sched.schedule(float(step))
            t1 = time.perf_counter()
            mro = ModelRunnerOutput({rid: token for rid in ids})
            t2 = time.perf_counter()
            sched.update_from_output(so, mro, float(step))
            t3 = time.perf_counter()
            assert so.total_num_scheduled_tokens == num_reqs
            times.append((t1 - t0) + (t3 - t2))
            # A request computing token c took a block when c starts one and registered a
            # full block when c ends one (prefill chunks leave requests at different offsets).
            filled.append(any(c % bs == 0 or (c + 1) % bs == 0
                              for c in so.scheduled_cached_reqs.num_computed_tokens))
    finally:
        gc.enable()
    return times, filled


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0-100) of xs, by the nearest-rank rule."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, -(-len(s) * q // 100) - 1))]


def alloc_free_ops_per_s(n_ops: int = 200_000) -> float:
    """allocate_slots + free pairs per second for 1-block requests (each pair is 2 ops)."""
    kv = KVCacheManager(4096, 16, enable_caching=True)
    reqs = [current_core.Request(f"a{i}", [i % 1000 + 1] * 8, current_core.SamplingParams())
            for i in range(1024)]
    t0 = time.perf_counter()
    for k in range(n_ops // 2):
        r = reqs[k & 1023]
        kv.allocate_slots(r, 8)
        kv.free(r)
    return n_ops / (time.perf_counter() - t0)


def load_baseline(ref: str, name: str = "baseline_core") -> ModuleType:
    """core/ as of git revision ref, imported as a package of its own, `name`.

    Its own absolute imports (twinserve.core.*) are renamed to name.*, else they would
    load the working tree's modules and the comparison would time the working tree twice.
    """
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    archive = subprocess.run(["git", "archive", "--format=tar", ref, "core"], capture_output=True,
                             check=True, cwd=root).stdout
    tmp = tempfile.mkdtemp(prefix="bench-sched-baseline-")
    atexit.register(shutil.rmtree, tmp, True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp)
    pkg = os.path.join(tmp, name)
    os.rename(os.path.join(tmp, "core"), pkg)
    for folder, _, files in os.walk(pkg):
        for fname in files:
            if fname.endswith(".py"):
                path = os.path.join(folder, fname)
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace("twinserve.core", name))
    sys.path.insert(0, tmp)
    # A package of that name loaded before (another revision) would be reused: drop it.
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
    module = importlib.import_module(name)
    check_baseline(module, tmp, name)
    return module


def same_core_as_tree(ref: str) -> bool:
    """True when ref's core/ has the working tree's content (an A/A run: ratios must be ~1)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run(["git", "diff", "--quiet", ref, "--", "core"], cwd=root).returncode == 0


def check_baseline(module: ModuleType, folder: str, package: str = "baseline_core") -> None:
    """Refuse a baseline whose code is not all from folder: none of the working tree's core may run in it."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        mod = sys.modules[name]
        path = os.path.abspath(getattr(mod, "__file__", "") or "")
        if not path.startswith(os.path.abspath(folder) + os.sep):
            raise RuntimeError(f"baseline module {name} was imported from {path}, not from {folder}")
        for attr, value in vars(mod).items():
            owner = getattr(value, "__module__", None)
            if isinstance(owner, str) and owner.startswith("twinserve.core"):
                raise RuntimeError(f"baseline module {name} uses {owner}.{attr} of the working tree")
    if module.Scheduler is current_core.Scheduler:
        raise RuntimeError("the baseline's Scheduler is the working tree's")


def summarize(runs: list[list[float]]) -> tuple[float, float, float]:
    """Mean, p99 and median step (seconds) of runs of the same steps."""
    # Every run does the same work step for step: the best over runs of each step keeps
    # its own cost (block filling included) and drops the time slices other processes
    # take from this one (4 ms each, which a median over a few runs still lets through).
    steps = [min(col) for col in zip(*runs)]
    return statistics.fmean(steps), percentile(steps, 99), statistics.median(steps)


def time_nano(n: int, steps: int) -> list[float]:
    """nano-vllm's decode steps on the same workload, the collector off as for ours."""
    spec = importlib.util.spec_from_file_location(
        "nano_vllm_sched", os.path.join(os.path.dirname(os.path.abspath(__file__)), "nano_vllm_sched.py"))
    nano = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nano)
    gc.collect()
    gc.disable()
    try:
        return nano.nano_step_times(n, steps)
    finally:
        gc.enable()


def variants_for(args: argparse.Namespace) -> list[tuple[str, ModuleType]]:
    """(name, core) pairs to time: the working tree's and the baselines', or a revision twice (A/A).

    The first baseline is imported as baseline_core, the k-th (k >= 2) as baseline_core_k.
    """
    if args.aa:
        return [(args.aa, load_baseline(args.aa)), (args.aa + " (A/A)", load_baseline(args.aa, "baseline_core_aa"))]
    variants = [("current", current_core)]
    for k, ref in enumerate(args.baseline or [], 1):
        name = ref if all(ref != v for v, _ in variants) else f"{ref}#{k}"
        variants.append((name, load_baseline(ref, "baseline_core" if k == 1 else f"baseline_core_{k}")))
    return variants


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400, help="decode steps per run")
    ap.add_argument("--repeats", type=int, default=5, help="runs per size and core (each step's best is kept)")
    ap.add_argument("--sizes", default="64,256,1024", help="running requests, comma-separated")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--baseline", metavar="REF", action="append",
                       help="also time core/ at this git revision (repeatable: one row of ratios each)")
    group.add_argument("--aa", metavar="REF", help="A/A check: time REF's core/ against a second copy of itself")
    ap.add_argument("--warm-pool", action="store_true",
                    help="make every KV block before timing (cores that make blocks on first use)")
    ap.add_argument("--nano-vllm", action="store_true",
                    help="also time nano-vllm's decode-step algorithm on the same workload")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    variants = variants_for(args)
    a_name = variants[0][0]
    # The runs whose ratios must be ~1: the A/A copy, or baselines whose core/ is the tree's.
    aa_names = {variants[1][0]} if args.aa else {
        name for (name, _), ref in zip(variants[1:], args.baseline or []) if same_core_as_tree(ref)}
    print(f"python {platform.python_version()} on {platform.machine()}, single thread; "
          f"{args.steps} steps per run, {args.repeats} runs, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load {os.getloadavg()[0]:.2f}")
    for name, core in variants:
        print(f"  {name}: {os.path.dirname(core.__file__)}")
    for name in sorted(aa_names) if not args.aa else ():
        print(f"  note: {name}'s core/ is the working tree's: an A/A run, ratios should be ~1")
    print(f"{'':>8} {'':>10} {'us/step':^26} {'us/request':^26} {'filling':>8}")
    print(f"{'running':>8} {'core':>10} {'mean':>8} {'p99':>8} {'median':>8} {'mean':>8} "
          f"{'p99':>8} {'median':>8} {'steps':>8}")
    n_filled = 0
    worst = 0.0
    for n in sizes:
        runs: dict[str, list[list[float]]] = {name: [] for name, _ in variants}
        nano_runs: list[list[float]] = []
        for rep in range(args.repeats):
            # Alternate the order, so neither core always runs first after the other.
            for name, core in (variants if rep % 2 == 0 else variants[::-1]):
                times, filled = decode_step_times(n, args.steps, core=core, warm_pool=args.warm_pool)
                runs[name].append(times)
                n_filled = sum(filled)
            if args.nano_vllm:
                nano_runs.append(time_nano(n, args.steps))
        rows = {}
        for name, _ in variants:
            rows[name] = row = [x * 1e6 for x in summarize(runs[name])]
            cells = " ".join(f"{x:>8.1f}" for x in row) + " " + " ".join(
                f"{x / n:>8.3f}" for x in row)
            print(f"{n:>8} {name[:10]:>10} {cells} {n_filled:>8}")
        if nano_runs:
            row = [x * 1e6 for x in summarize(nano_runs)]
            cells = " ".join(f"{x:>8.1f}" for x in row) + " " + " ".join(f"{x / n:>8.3f}" for x in row)
            print(f"{n:>8} {'nano-vllm':>10} {cells}")
            print(f"{n:>8} {'vs nano':>10} " + " ".join(
                f"{b / c:>8.2f}" for b, c in zip(row, rows[a_name])))
        for b_name, _ in variants[1:]:
            ratios = [b / c for b, c in zip(rows[b_name], rows[a_name])]
            if b_name in aa_names:
                worst = max([worst] + [abs(r - 1) for r in ratios])
            label = "speedup" if len(variants) == 2 else f"/{b_name}"[:10]
            print(f"{n:>8} {label:>10} " + " ".join(f"{r:>8.2f}" for r in ratios))
    print(f"mean and p99 cover all {args.steps} steps, the block-filling ones (column 'filling') "
          "included "
          "(at each, some requests allocate a block or register a full one in the prefix cache; "
          "every request does both once per 16 steps); each step's time is its best over the runs")
    if args.nano_vllm:
        print(f"vs nano: nano-vllm's time over {a_name}'s (above 1: ours is cheaper per request)")
    if len(variants) > 2:
        print(f"/REF rows: REF's time over {a_name}'s (above 1: {a_name} is faster)")
    elif len(variants) == 2:
        print(f"speedup: {variants[1][0]}'s time over {a_name}'s (above 1: {a_name} is faster)")
    if aa_names:
        verdict = "within" if worst <= 0.05 else "OUTSIDE"
        print(f"A/A: the largest ratio is {worst:.1%} from 1, {verdict} 5% "
              "(outside: too noisy a machine for ratios this small)")
    ops = statistics.median(alloc_free_ops_per_s() for _ in range(3))
    print(f"allocate/free: {ops / 1e6:.2f} M ops/s")


if __name__ == "__main__":
    main()

"""With the host tier off, every shipped study simulates byte-identically to a git revision's code.

    python experiments/tier_off_identity.py [--baseline main] [--studies experiments/*.toml]
        [--set FIELD=VALUE ...] [--keep DIR]

Each study TOML is run with `simulate run --config` twice, in fresh processes: on the code of
--baseline (core/, backends/, sim/, twinserve/ extracted with git archive) and on the working
tree (with any --set, e.g. kv_offload.host_size_gib=0). Every CSV written is compared byte for byte
(summary.csv without its wall-clock columns, sim_wall_s and sim_requests_per_wall_s). Prints one
line per study and exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import atexit
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGES = ("core", "backends", "sim", "kernels")
WALL_COLUMNS = ("sim_wall_s", "sim_requests_per_wall_s")
# Runs `simulate` from the package folder given first (''= the installed working tree).
_CHILD = """
import sys
pkg = sys.argv[1]
if pkg:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    sys.path.insert(0, pkg)
from twinserve.sim.cli import main
sys.exit(main(sys.argv[2:]))
"""


def baseline_tree(ref: str) -> str:
    """A folder holding the twinserve package as of git revision ref (removed at exit)."""
    here = Path(__file__).resolve().parent
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True, cwd=here).stdout.strip()
    archive = subprocess.run(["git", "archive", "--format=tar", ref, "twinserve", *PACKAGES],
                             capture_output=True, check=True, cwd=root).stdout
    tmp = tempfile.mkdtemp(prefix="tier-off-baseline-")
    atexit.register(shutil.rmtree, tmp, True)
    src = os.path.join(tmp, "src")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src)  # our own repository's files
    pkg = os.path.join(tmp, "pkg", "twinserve")
    shutil.copytree(os.path.join(src, "twinserve"), pkg)
    for name in PACKAGES:
        shutil.move(os.path.join(src, name), os.path.join(pkg, name))
    return os.path.join(tmp, "pkg")


def shipped_studies(ref: str, here: Path) -> list[str]:
    """The study TOMLs under experiments/ at revision ref (those its code can read)."""
    names = subprocess.run(["git", "ls-tree", "--name-only", ref, "experiments/"], capture_output=True,
                           text=True, check=True, cwd=here.parent).stdout.split()
    return [str(here.parent / n) for n in sorted(names) if n.endswith(".toml")]


def run_study(pkg: str, toml: str, out: Path, sets: list[str]) -> None:
    """`simulate run --config toml --out out` on the code in pkg ('' = the working tree)."""
    args = ["run", "--config", toml, "--out", str(out), "--workers", "1"]
    for s in sets:
        args += ["--set", s]
    env = dict(os.environ, PYTHONSAFEPATH="1", MPLBACKEND="Agg")
    res = subprocess.run([sys.executable, "-c", _CHILD, pkg, *args], capture_output=True, text=True,
                         env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{toml} ({pkg or 'working tree'}) exited {res.returncode}:\n{res.stderr[-2000:]}")


def table_bytes(path: Path) -> bytes:
    """A CSV's bytes; summary.csv without its wall-clock columns."""
    if path.name != "summary.csv":
        return path.read_bytes()
    import pandas as pd

    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    return df.drop(columns=[c for c in WALL_COLUMNS if c in df]).to_csv(index=False).encode()


def differences(a: Path, b: Path) -> list[str]:
    """CSV files (relative paths) that differ or exist on one side only."""
    files_a = {p.relative_to(a) for p in a.rglob("*.csv")}
    files_b = {p.relative_to(b) for p in b.rglob("*.csv")}
    out = [f"{f} (only one side)" for f in sorted(files_a ^ files_b, key=str)]
    for f in sorted(files_a & files_b, key=str):
        if table_bytes(a / f) != table_bytes(b / f):
            out.append(str(f))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every study on both codes and print which match."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="main", help="git revision to compare with (default main)")
    ap.add_argument("--studies", nargs="*", default=None,
                    help="study TOMLs (default: the baseline's experiments/*.toml)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="set on the working tree's runs only (e.g. kv_offload.host_size_gib=0)")
    ap.add_argument("--keep", default=None, help="write both runs' outputs under this folder")
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    studies = args.studies or shipped_studies(args.baseline, here)
    pkg = baseline_tree(args.baseline)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tier-off-"))
    if not args.keep:
        atexit.register(shutil.rmtree, str(root), True)
    bad = 0
    print(f"working tree{' with ' + ', '.join(args.set) if args.set else ''} vs {args.baseline}: "
          "every CSV of `simulate run` (wall-clock columns left out)")
    for toml in studies:
        name = Path(toml).stem
        base, cur = root / name / "baseline", root / name / "tree"
        run_study(pkg, toml, base, [])
        run_study("", toml, cur, args.set)
        diff = differences(base, cur)
        n = len(list(base.rglob("*.csv")))
        bad += bool(diff)
        print(f"{name:28s} {n:3d} CSV  " + ("identical" if not diff else "DIFFER: " + ", ".join(diff[:5])),
              flush=True)
    print("all identical" if not bad else f"{bad} study(ies) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""What a local command costs beyond its work: ``reverie consolidate full --all --as-of
2025-07-01`` on the sample store, with no Prefect API configured, so that the run is
recorded on the shared local Prefect server.

Each variant (this checkout, and optionally a baseline source tree run by the same
virtualenv) gets a sample store and a ``PREFECT_HOME`` of its own, made by ``reverie
demo`` (which also starts that home's local server and consolidates the store at that
``as_of``, so every timed run does the same steps and changes nothing). After one
warm-up each, the variants run in turn, timed from outside as whole processes: wall
clock, CPU of the process, and the work, which is the steps' own clocks summed from the
run's JSON report. The load average is read before every run.

    python -m reverie.benchmarks.local_command --runs 9 --json out.json [--baseline DIR]

``DIR`` is a source tree of Reverie (``git archive <commit> | tar -x -C DIR``): the
baseline runs with it first on ``PYTHONPATH``. Nothing is timed inside the command, so
the figures hold for any commit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH = "local-command"  # how benchmarks/report.py knows this bench's JSON
AS_OF = "2025-07-01"
COMMAND = ["consolidate", "full", "--all", "--as-of", AS_OF]
TARGET = "a local command costs at most 2 s beyond its work"
BEYOND_SECONDS = 2.0


@dataclass
class Variant:
    name: str
    source: Path | None  # None: this checkout
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    work: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        beyond = [w - k for w, k in zip(self.wall, self.work, strict=True)]
        return {
            "name": self.name,
            "runs": len(self.wall),
            "wall_median": round(statistics.median(self.wall), 3),
            "wall_min": round(min(self.wall), 3),
            "wall_max": round(max(self.wall), 3),
            "cpu_median": round(statistics.median(self.cpu), 3),
            "work_median": round(statistics.median(self.work), 3),
            "work_min": round(min(self.work), 3),
            "work_max": round(max(self.work), 3),
            "beyond_median": round(statistics.median(beyond), 3),
            "beyond_max": round(max(beyond), 3),
            **{k: [round(x, 3) for x in v] for k, v in asdict(self).items()
               if isinstance(v, list)},
        }


def environment(variant: Variant, home: Path) -> dict[str, str]:
    # As a user runs it: Python caches compiled modules (without the cache every command
    # compiles Reverie's ~70 modules again, about 0.2 s), and no Prefect API is set.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PREFECT_PROFILE", "PYTHONDONTWRITEBYTECODE")}
    env.update({
        "PREFECT_HOME": str(home / "prefect"),
        "REVERIE_DATABASE_URL": f"sqlite:///{home / 'store.db'}",
        "REVERIE_LOCAL_SERVER": "shared",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    })
    if variant.source is not None:
        # The baseline's package first: the venv's editable finder comes after PYTHONPATH.
        link = home / "path" / "reverie"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(variant.source.resolve())
        env["PYTHONPATH"] = str(link.parent)
    return env


def reverie() -> list[str]:
    return [str(Path(sys.executable).with_name("reverie"))]


def timed(env: dict[str, str]) -> tuple[float, float, float]:
    """(wall, CPU, work) of one run of the command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([*reverie(), *COMMAND, "--json"], env=env, capture_output=True,
                          text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:  # its stderr holds no memory content: Prefect's console is quiet
        raise SystemExit(f"the command failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    work = sum(float(s["seconds"]) for s in report["steps"])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reverie.benchmarks.local_command",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--source", type=Path, default=None,
                        help="a Reverie source tree to time instead of this checkout")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a Reverie source tree to compare with, run in turn")
    parser.add_argument("--name", default="this", help="what the measured variant is called")
    parser.add_argument("--baseline-name", default="baseline")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    variants = [Variant(args.name, args.source)]
    if args.baseline is not None:
        variants.append(Variant(args.baseline_name, args.baseline))
    with tempfile.TemporaryDirectory(prefix="reverie-local-command-") as tmp:
        homes = {v.name: Path(tmp) / f"variant-{i}" for i, v in enumerate(variants)}
        envs = {}
        for v in variants:
            homes[v.name].mkdir()
            envs[v.name] = environment(v, homes[v.name])
            subprocess.run([*reverie(), "demo", "--database", str(homes[v.name] / "store.db")],
                           env=envs[v.name], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            timed(envs[v.name])  # warm-up: the page cache, the server's first queries
        try:
            for i in range(args.runs):
                # Alternate which variant goes first, so neither always follows the other.
                for v in (variants if i % 2 == 0 else variants[::-1]):
                    load = os.getloadavg()[0]
                    wall, cpu, work = timed(envs[v.name])
                    v.wall.append(wall)
                    v.cpu.append(cpu)
                    v.work.append(work)
                    v.load.append(load)
                    print(f"{v.name:9} run {i + 1}: wall {wall:.3f} s, CPU {cpu:.3f} s, "
                          f"work {work:.3f} s, beyond {wall - work:.3f} s, load {load:.2f}",
                          file=sys.stderr)
        finally:
            for v in variants:
                subprocess.run([*reverie(), "server", "stop"], env=envs[v.name], check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    again = f"python -m reverie.benchmarks.local_command --runs {args.runs}"
    if args.baseline is not None:
        again += " --baseline DIR"
    result = result_of(variants, again)
    text = json.dumps(result, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def result_of(variants: list[Variant], command: str = "python -m reverie.benchmarks."
              "local_command") -> dict[str, Any]:
    """The JSON of a bench run (``command``: how to run it again)."""
    this = variants[0].summary()
    out: dict[str, Any] = {
        "bench": BENCH,
        "command": command,
        "timed": "reverie " + " ".join(COMMAND),
        "target": TARGET,
        "beyond_target_seconds": BEYOND_SECONDS,
        "verdict": "met" if this["beyond_median"] <= BEYOND_SECONDS else
        f"missed by {this['beyond_median'] - BEYOND_SECONDS:.2f} s",
        "variants": [v.summary() for v in variants],
    }
    if len(variants) == 2:
        # Pair by pair (run i of each, taken back to back): the load they shared cancels.
        a, b = variants
        for what in ("wall", "cpu"):
            ratios = sorted(x / y for x, y in zip(getattr(a, what), getattr(b, what),
                                                  strict=True))
            out[f"{what}_ratio_median"] = round(statistics.median(ratios), 3)
            out[f"{what}_ratio_min"] = round(ratios[0], 3)
            out[f"{what}_ratio_max"] = round(ratios[-1], 3)
    return out


if __name__ == "__main__":
    raise SystemExit(main())

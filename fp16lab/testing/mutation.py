"""Runs mutmut over every module of fp16lab, one module at a time, and writes the survivors to a report.

Mutation testing plants one small change (a mutant: ``<`` for ``<=``, ``+ 1`` for ``- 1``, a
constant changed) in a function and runs the tests that cover that function. A mutant the tests
notice is *killed*; one they do not notice has *survived*: either a test is missing, or the
change does not alter behaviour (an *equivalent* mutant, recorded with its reason in
``tests/mutation_equivalent.toml``). The score is killed / (killed + survived), equivalents left
out; mutants no test reaches count as survivors.

Which modules, and which tests check each, is :mod:`fp16lab.testing.mutation_targets`; the
score arithmetic and the equivalents file are :mod:`fp16lab.testing.mutation_scores`. A module's
name is its dotted path below fp16lab (``bits.patterns``, ``sweep.engine``), as in the
equivalents file.

Each module runs in its own directory under ``build/mutation/<name>/`` holding a copy of the
package, only that module's fast CPU tests and a ``[tool.mutmut]`` section naming them, with one
worker (``--max-children 1``) so that a shared machine stays usable. The results are kept under
a hash of the module's source and its test files (:func:`cache_key`): an unchanged module is not
run again, a run stopped part way continues where it stopped. The report
(``data/mutation_report.md``) is written from every module that has results, reading the
equivalents file afresh (a ``note`` file in a module's directory is printed under the table)::

    python -m fp16lab.testing.mutation                       # every module (cached), then the report
    python -m fp16lab.testing.mutation bits.patterns waves   # just these, then the report
    python -m fp16lab.testing.mutation --changed             # those changed since the merge-base with main
    python -m fp16lab.testing.mutation --list                # the modules, their tests, cached or not
    python -m fp16lab.testing.mutation --report-only         # the report from the results there are

This is a developer tool for a git checkout (it needs ``tests/``); ``make mutation`` runs it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import time
from typing import Any


from .mutation_scores import COLUMNS, changed_lines, function_of, load_equivalents, summarize
from .mutation_targets import (DESELECTED, EXCLUDED_MARKERS, LEFT_OUT, ROOT, TARGETS, Target,
                               changed_modules)

BUILD = ROOT / "build" / "mutation"
REPORT = ROOT / "data" / "mutation_report.md"
EQUIVALENT = ROOT / "tests" / "mutation_equivalent.toml"


def _status_by_exit_code():
    from mutmut.stats import status_by_exit_code  # the tool's own names for its exit codes

    return status_by_exit_code


def mutmut_version() -> str:
    """Returns the installed mutmut's version, or raises with how to install it."""
    from importlib import metadata

    try:
        return metadata.version("mutmut")
    except metadata.PackageNotFoundError:
        raise SystemExit("mutmut is not installed: `make mutation` installs it "
                         "(or pip install -e '.[mutation]')") from None


def _pytest_section() -> str:
    """Returns the checkout's [tool.pytest.ini_options] section, as text."""
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("[tool.pytest.ini_options]")
    end = text.find("\n[", start + 1)
    return text[start:] if end < 0 else text[start:end + 1]


def _toml_list(items) -> str:
    return "[" + ", ".join(json.dumps(str(i)) for i in items) + "]"


def prepare(target: Target, work: pathlib.Path, keep_results: bool = False,
            keep_stats: bool = False) -> None:
    """Lays out ``work`` for one mutmut run: package copy, the target's tests, its config.

    With ``keep_results`` the earlier run's mutants and verdicts stay (only the package, tests
    and config are refreshed, and the test-coverage map is rebuilt unless ``keep_stats``)."""
    if keep_results:
        for old in ("fp16lab", "tests", *target.data):
            shutil.rmtree(work / old, ignore_errors=True)
        if not keep_stats:
            (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    shutil.copytree(ROOT / "fp16lab", work / "fp16lab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.cubin"))
    (work / "tests").mkdir()
    for rel in ("tests/conftest.py", *{t.split("::")[0] for t in target.tests}, *target.data):
        src, dst = ROOT / rel, work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    args = ["-p", "no:cacheprovider", "-m", EXCLUDED_MARKERS, "--hypothesis-seed=0",
            *(f"--deselect={t}" for t in DESELECTED)]
    (work / "pyproject.toml").write_text(
        _pytest_section()
        + "\n[tool.mutmut]\n"
        + 'source_paths = ["fp16lab"]\n'
        + f"only_mutate = {_toml_list([target.source])}\n"
        + f"also_copy = {_toml_list(target.data)}\n"
        + f"pytest_add_cli_args = {_toml_list(args)}\n"
        + f"pytest_add_cli_args_test_selection = {_toml_list(target.tests)}\n"
        + "use_git_change_detection = false\n")


def cache_key(target: Target) -> str:
    """The content hash a module's results are kept under: its source, its test files, the
    shared conftest, the markers left out and mutmut's version. The equivalents file is not in
    it: the report reads that file afresh each time, so a new reason re-runs nothing."""
    import hashlib

    h = hashlib.sha256()
    for rel in (target.source, "tests/conftest.py", *sorted({t.split("::")[0] for t in target.tests})):
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes() + b"\0")
    h.update(f"{EXCLUDED_MARKERS}\0{' '.join(target.tests)}\0{mutmut_version()}".encode())
    h.update(" ".join(t for t in DESELECTED if t.split("::")[0] in target.tests).encode())
    return h.hexdigest()


def state(target: Target) -> str:
    """``"done"`` (results for this content), ``"partial"`` (a stopped run of this content, to
    continue) or ``"stale"`` (no results, or results for other content)."""
    work = BUILD / target.name
    key = work / "key"
    if not key.exists() or key.read_text().strip() != cache_key(target):
        return "stale"
    return "done" if (work / "done").exists() else "partial"


def run_target(target: Target, rerun_missed: bool = False) -> float:
    """Runs mutmut on one target with one worker; returns the seconds it took (0 when cached).

    A module whose source and tests are unchanged since its finished run is not run again; a
    run stopped part way (Ctrl-C, a killed job) continues with the mutants it had not checked.
    ``rerun_missed`` keeps the last run's verdicts and runs again only the mutants that were
    not caught (or not checked): the quick way to see what new tests kill. It trusts the kept
    kills, so use it after adding tests, not after weakening one."""
    work = BUILD / target.name
    names: list[str] = []
    now = state(target)
    if rerun_missed:
        statuses = load_results(target)
        if not statuses:
            raise SystemExit(f"{target.name} has no earlier run to take the survivors from")
        names = sorted(n for n, st in statuses.items() if st in ("survived", "no tests", "not checked"))
        if not names:  # nothing to re-run: the kept verdicts stand for the tests as they are now
            (work / "key").write_text(cache_key(target) + "\n")
            (work / "done").write_text("")
            return 0.0
        prepare(target, work, keep_results=True)
    elif now == "done":
        return 0.0
    elif now == "partial":
        prepare(target, work, keep_results=True, keep_stats=True)
    else:
        prepare(target, work)
    (work / "done").unlink(missing_ok=True)
    (work / "key").write_text(cache_key(target) + "\n")
    (work / "note").unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # one thread per process: the machine is shared, and forked workers stay simple
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    start = time.monotonic()
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", "1", *names]
    log = work / "mutmut.log"
    try:
        with open(log, "a") as out:
            rc = subprocess.run(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    finally:
        seconds = time.monotonic() - start
        timing = work / "seconds"
        kept = rerun_missed or now == "partial"  # the earlier verdicts stand: so does their time
        earlier = float(timing.read_text()) if kept and timing.exists() else 0.0
        timing.write_text(f"{earlier + seconds:.0f}\n")
    if rc != 0:
        raise SystemExit(f"mutmut failed on {target.name} (exit {rc}); its output is in {log}")
    statuses = load_results(target)
    if statuses and "not checked" not in statuses.values():
        (work / "done").write_text("")
    return seconds


def load_results(target: Target) -> dict[str, str]:
    """Returns {mutant name: status} for a target's last run ({} when it has not run)."""
    meta = BUILD / target.name / "mutants" / (target.source + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    status = _status_by_exit_code()
    return {name: status[code] for name, code in codes.items()}


_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
names = json.load(sys.stdin)
json.dump({n: get_diff_for_mutant(n, path=sys.argv[1]) for n in names}, sys.stdout)
"""


def mutant_diffs(target: Target, names: list[str]) -> dict[str, str]:
    """Returns {mutant name: mutmut's diff of it} (what ``mutmut show`` prints), read in one go."""
    if not names:
        return {}
    out = subprocess.run([sys.executable, "-c", _DIFFS, target.source], cwd=BUILD / target.name,
                         input=json.dumps(names), capture_output=True, text=True, check=True).stdout
    return {name: "\n".join(line for line in diff.splitlines() if line.strip())
            for name, diff in json.loads(out).items()}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


#: What the seconds column of a row taken over from an earlier report says.
CARRIED = "carried over: not run on this checkout"


def earlier_report(path: pathlib.Path) -> dict[str, tuple[str, list[str], dict[str, int]]]:
    """Returns, per module name (``bits.patterns``), the table row, the survivor blocks and the
    counts of the report at ``path`` ({} where there is none): what a report written where
    that module has no results of its own takes over (the cache is per checkout; the report
    is committed)."""
    if not path.exists():
        return {}
    text = path.read_text()
    table, _, rest = text.partition("\n## Survivors\n")
    out: dict[str, tuple[str, list[str], dict[str, int]]] = {}
    for line in table.splitlines():
        m = re.match(r"\| `fp16lab/(.+?)\.py` \|", line)
        if not m:
            continue
        name = m.group(1).removesuffix("/__init__").replace("/", ".")
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        counts = dict(zip((*COLUMNS, "equivalent"), map(int, cells[3:4 + len(COLUMNS)])))
        out[name] = (line, [], counts)
    for block in re.split(r"\n(?=### `)", rest):
        m = re.match(r"### `.+?` \((.+?)\)", block)
        if m and m.group(1) in out:
            out[m.group(1)][1].append(block.strip())
    return out


def _table_line(target: Target, counts: dict[str, Any], seconds: str) -> str:
    """The report's table row of a module run in this checkout."""
    tests = ", ".join(f"`{pathlib.Path(t).name}`" for t in target.tests)
    n = sum(counts[c] for c in COLUMNS)
    rate = f"{n / float(seconds):.2f}" if seconds.isdigit() and float(seconds) > 0 else ""
    return (f"| `{target.source}` | {tests} | {n} | " + " | ".join(str(counts[c]) for c in COLUMNS)
            + f" | {counts['equivalent']} | {_score_text(counts['score'])} | {seconds} | {rate} |")


def _score_text(score: float) -> str:
    """A score for the table: a percentage, or what stands in for one before any mutant is
    checked (a stopped run's next module)."""
    return "no mutant checked yet" if math.isnan(score) else f"{score:.1%}"


def write_report(path: pathlib.Path = REPORT) -> float:
    """Writes the report from every target that has results; returns the overall score.

    A module with no results on this checkout keeps its row and survivors from the report
    already at ``path`` (its seconds column says so, :data:`CARRIED`)."""
    equivalents = load_equivalents(EQUIVALENT)
    earlier = earlier_report(path)
    rows, survivors, totals = [], [], {c: 0 for c in (*COLUMNS, "equivalent")}
    run_here: list[Target] = []  # the modules with results in this checkout
    listed: set[str] = set()  # ... and those the earlier report gave
    carried: list[str] = []
    for target in TARGETS.values():
        statuses = load_results(target)
        if not statuses:
            if target.name in earlier:
                line, blocks, counts = earlier[target.name]
                cells = line.strip().strip("|").split("|")
                rows.append("|" + "|".join(cells[:-2]) + f"| {CARRIED} | |")
                listed.add(target.name)
                carried += blocks
                for c in totals:
                    totals[c] += counts.get(c, 0)
            continue
        equivalent = set()
        missed = sorted(n for n, s in statuses.items() if s in ("survived", "no tests"))
        diffs = mutant_diffs(target, missed)
        for name in missed:
            diff = diffs[name]
            reason = equivalents.get((target.name, function_of(name), changed_lines(diff)))
            if reason:
                equivalent.add(name)
            survivors.append((target.name, name, statuses[name], diff, reason))
        counts = summarize(statuses, equivalent)
        timing = BUILD / target.name / "seconds"
        seconds = timing.read_text().strip() if timing.exists() else "?"
        now = state(target)
        if now == "partial":
            seconds = "unfinished"
        elif now == "stale":
            seconds = f"{seconds} (stale: the module or its tests changed since)"
        rows.append(_table_line(target, counts, seconds))
        run_here.append(target)
        listed.add(target.name)
        for c in totals:
            totals[c] += counts[c]
    caught = totals["killed"] + totals["timeout"] + totals["segfault"]
    missed = totals["survived"] + totals["no tests"] - totals["equivalent"]
    overall = caught / (caught + missed) if caught + missed else float("nan")

    lines = [
        "# Mutation testing report",
        "",
        f"Written {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} by "
        f"`python -m fp16lab.testing.mutation` (`make mutation`) with mutmut {mutmut_version()}, "
        f"Python {platform.python_version()}, one worker, on commit {_git_commit()}.",
        "",
        "Score = caught / (caught + missed): caught = killed + timeout + segfault; missed = survived "
        "+ no tests, less the equivalent mutants (listed below with their reasons, from "
        "`tests/mutation_equivalent.toml`).",
        "",
        "| module | tests | mutants | " + " | ".join(COLUMNS) + " | equivalent | score | seconds | mutants/s |",
        "| --- " * (len(COLUMNS) + 7) + "|",
    ]
    lines += rows
    n = sum(totals[c] for c in COLUMNS)
    lines.append("| **all** | | " + f"{n} | " + " | ".join(str(totals[c]) for c in COLUMNS)
                 + f" | {totals['equivalent']} | **{overall:.1%}** | | |")
    untested = [name for name in TARGETS if name not in listed]
    lines += ["", f"Modules not run yet ({len(untested)}): " + (", ".join(f"`{n}`" for n in untested) or "none") + ".",
              "", "Modules left out, and why:", "",
              *(f"- `{name}`: {why}" for name, why in LEFT_OUT.items())]
    notes = [f"- `{t.source}`: {(BUILD / t.name / 'note').read_text().strip()}"
             for t in run_here if (BUILD / t.name / "note").exists()]
    if notes:
        lines += ["", "Notes on these runs:", "", *notes]
    if DESELECTED:
        lines += ["", "Tests left out (they fail on the unchanged code):", "",
                  *(f"- `{t}`" for t in DESELECTED)]
    lines += ["", "## Survivors", ""]
    if not survivors and not carried:
        lines.append("None.")
    for module, name, status, diff, reason in survivors:
        verdict = f"equivalent: {reason}" if reason else f"**{status}, not explained**"
        lines += [f"### `{name}` ({module})", "", verdict, "", "```diff", diff, "```", ""]
    for block in carried:  # as the earlier report gave them
        lines += [block, ""]
    path.write_text("\n".join(lines).rstrip() + "\n")
    return overall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="module names such as bits.patterns or sweep.engine "
                        "(default: every module; --list lists them)")
    parser.add_argument("--list", action="store_true", help="list the modules, their tests and state")
    parser.add_argument("--report-only", action="store_true", help="write the report, run nothing")
    parser.add_argument("--changed", nargs="?", const="", metavar="BASE",
                        help="only the modules whose source or tests changed since BASE (default: "
                             "the merge-base with origin/main or main, else HEAD~1)")
    parser.add_argument("--deselect", action="append", default=[], metavar="NODEID",
                        help="leave out a test that fails on the unchanged code (repeatable)")
    parser.add_argument("--rerun-missed", action="store_true",
                        help="keep the last verdicts; run only the mutants not caught last time")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; choose from {', '.join(TARGETS)}")
    mutmut_version()
    DESELECTED.extend(args.deselect)
    if args.list:
        for name, t in TARGETS.items():
            print(f"{name:28} {state(t):8} {' '.join(t.tests)}")
        return 0
    names = args.modules or list(TARGETS)
    if args.changed is not None:
        names = [n for n in changed_modules(args.changed or None) if n in names]
        print(f"changed modules: {' '.join(names) or 'none'}")
    if not args.report_only:
        for name in names:
            target = TARGETS[name]
            if state(target) == "done" and not args.rerun_missed:
                print(f"{target.source}: unchanged since its last run (cached)", flush=True)
                continue
            print(f"mutating {target.source} ...", flush=True)
            print(f"  done in {run_target(target, args.rerun_missed):.0f} s", flush=True)
    score = write_report()
    print(f"mutation score {score:.1%}; report in {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs mutmut over fp16lab's core modules, one module at a time, and writes the survivors to a report.

Mutation testing plants one small change (a mutant: ``<`` for ``<=``, ``+ 1`` for ``- 1``, a
constant changed) in a function and runs the tests that cover that function. A mutant the tests
notice is *killed*; one they do not notice has *survived*: either a test is missing, or the
change does not alter behaviour (an *equivalent* mutant, recorded with its reason in
``tests/mutation_equivalent.toml``). The score is killed / (killed + survived), equivalents left
out; mutants no test reaches count as survivors.

Each module in ``TARGETS`` runs in its own directory under ``build/mutation/<name>/`` holding a
copy of the package, only that module's fast CPU tests and a ``[tool.mutmut]`` section naming
them, with one worker (``--max-children 1``) so that a shared machine stays usable. Results stay
there, so modules can be run one by one; the report (``data/mutation_report.md``) is written
from every module that has results (a ``note`` file in a module's directory, say on a run cut
short, is printed under the table)::

    python -m fp16lab.testing.mutation                 # every module, then the report
    python -m fp16lab.testing.mutation bits scaling    # just these two, then the report
    python -m fp16lab.testing.mutation --report-only   # the report from the results there are

This is a developer tool for a git checkout (it needs ``tests/``); ``make mutation`` runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "mutation"
REPORT = ROOT / "data" / "mutation_report.md"
EQUIVALENT = ROOT / "tests" / "mutation_equivalent.toml"

#: Tests with these markers never run under mutation: they need a GPU, nvcc, a browser, or minutes.
EXCLUDED_MARKERS = "not gpu and not nvcc and not notebook and not browser and not slow"


@dataclasses.dataclass(frozen=True)
class Target:
    """One module to mutate: its file, the fast tests that check it, and which functions."""

    name: str
    source: str
    tests: tuple[str, ...]
    #: mutant-name globs (``fp16lab.diagnostics.x_locate*``); empty means every function.
    functions: tuple[str, ...] = ()
    #: extra files or folders the tests read, relative to the checkout.
    data: tuple[str, ...] = ()


_SWEEP_STORE_TESTS = ("tests/test_sweep_results.py",) + tuple(f"tests/test_sweep.py::{t}" for t in (
    "test_results_file_must_be_parquet", "test_rows_carry_measurements_and_provenance_on_cpu",
    "test_interrupt_keeps_finished_points_and_rerun_resumes",
    "test_load_reference_says_when_the_file_is_absent"))
_SWEEP_RESUME_TESTS = tuple(f"tests/test_sweep.py::{t}" for t in (
    "test_rows_carry_measurements_and_provenance_on_cpu", "test_oom_is_recorded_and_the_sweep_goes_on",
    "test_other_failures_are_recorded_with_their_message",
    "test_interrupt_keeps_finished_points_and_rerun_resumes",
    "test_stop_event_ends_the_sweep_between_points", "test_repeats_are_interleaved_round_robin",
    "test_without_a_file_the_rows_are_returned_and_no_bar_unless_asked",
    "test_run_sweep_hands_the_protocol_on_and_the_bar_counts_skipped_repeats",
    "test_a_sweep_stopped_before_its_first_point_returns_an_empty_table_with_the_columns",
    "test_file_inputs_get_their_image_folder_written_before_any_point")) + (
    "tests/test_hostile_runs.py::test_resume_does_not_measure_a_failed_point_again",)

TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("formats", "fp16lab/formats.py", ("tests/test_formats.py", "tests/test_hostile.py")),
    Target("bits", "fp16lab/bits.py", ("tests/test_bits.py", "tests/test_hostile.py")),
    Target("census", "fp16lab/census.py", ("tests/test_census.py", "tests/test_hostile.py")),
    Target("scaling", "fp16lab/scaling.py", ("tests/test_scaling.py", "tests/test_hostile.py")),
    Target("recipes", "fp16lab/recipes.py", ("tests/test_recipes.py",)),
    Target("sweep-store", "fp16lab/sweep/results.py", _SWEEP_STORE_TESTS),
    Target("sweep-resume", "fp16lab/sweep/engine.py", _SWEEP_RESUME_TESTS,
           ("fp16lab.sweep.engine.x_run_sweep*",)),
    Target("locator", "fp16lab/diagnostics/locator.py",
           ("tests/test_diagnostics.py", "tests/test_diagnostics_locator.py",
            "tests/test_hostile_runs.py::test_locator_does_not_blame_a_nan_gradient_left_by_an_earlier_step",
            "tests/test_hostile_runs.py::test_locator_says_when_the_input_batch_itself_holds_nan_or_inf")),
    Target("monitor-bins", "fp16lab/diagnostics/histogram.py", ("tests/test_diagnostics.py",),
           ("fp16lab.diagnostics.histogram.x__bin_of_exponent*",
            "fp16lab.diagnostics.histogram.x__bin_codes*",
            "fp16lab.diagnostics.histogram.x_exponent_of_bin*")),
    Target("fp8-scales", "fp16lab/fp8/scales.py", ("tests/test_fp8.py",)),
    Target("sweep-tables", "fp16lab/sweep/report.py",
           tuple(f"tests/test_sweep.py::{t}" for t in (
               "test_throughput_table_pivots_by_batch",
               "test_throughput_table_leaves_out_every_non_default_scaler_setting",
               "test_throughput_table_keeps_ok_default_points_of_the_model_and_takes_their_median",
               "test_ratio_table_divides_by_the_baseline",
               "test_ratio_table_per_model_per_group_with_named_columns_and_a_clear_error"))
           + ("tests/test_exercises_ch04.py",),
           ("fp16lab.sweep.report.x_throughput_table*", "fp16lab.sweep.report.x_ratio_table*"),
           ("data",)),
)}


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


def prepare(target: Target, work: pathlib.Path, keep_results: bool = False) -> None:
    """Lays out ``work`` for one mutmut run: package copy, the target's tests, its config.

    With ``keep_results`` the earlier run's mutants and verdicts stay (only the package, tests
    and config are refreshed, and the test-coverage map is rebuilt)."""
    if keep_results:
        for old in ("fp16lab", "tests"):
            shutil.rmtree(work / old, ignore_errors=True)
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
    args = ["-p", "no:cacheprovider", "-m", EXCLUDED_MARKERS, "--hypothesis-seed=0"]
    (work / "pyproject.toml").write_text(
        _pytest_section()
        + "\n[tool.mutmut]\n"
        + 'source_paths = ["fp16lab"]\n'
        + f"only_mutate = {_toml_list([target.source])}\n"
        + f"also_copy = {_toml_list(target.data)}\n"
        + f"pytest_add_cli_args = {_toml_list(args)}\n"
        + f"pytest_add_cli_args_test_selection = {_toml_list(target.tests)}\n"
        + "use_git_change_detection = false\n")


def run_target(target: Target, rerun_missed: bool = False) -> float:
    """Runs mutmut on one target with one worker; returns the seconds it took.

    ``rerun_missed`` keeps the last run's verdicts and runs again only the mutants that were
    not caught (or not checked): the quick way to see what new tests kill."""
    work = BUILD / target.name
    names = list(target.functions)
    if rerun_missed:
        statuses = load_results(target)
        if not statuses:
            raise SystemExit(f"{target.name} has no earlier run to take the survivors from")
        names = sorted(n for n, st in statuses.items() if st in ("survived", "no tests", "not checked"))
        if not names:
            return 0.0
    prepare(target, work, keep_results=rerun_missed)
    (work / "note").unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # one thread per process: the machine is shared, and forked workers stay simple
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    start = time.monotonic()
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", "1", *names]
    log = work / "mutmut.log"
    with open(log, "w") as out:
        rc = subprocess.run(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - start
    if rc != 0:
        raise SystemExit(f"mutmut failed on {target.name} (exit {rc}); its output is in {log}")
    timing = work / "seconds"
    earlier = float(timing.read_text()) if rerun_missed and timing.exists() else 0.0
    timing.write_text(f"{earlier + seconds:.0f}\n")
    return seconds


def load_results(target: Target) -> dict[str, str]:
    """Returns {mutant name: status} for a target's last run ({} when it has not run)."""
    import fnmatch

    meta = BUILD / target.name / "mutants" / (target.source + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    status = _status_by_exit_code()
    return {name: status[code] for name, code in codes.items()
            if not target.functions or any(fnmatch.fnmatch(name, g) for g in target.functions)}


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


def changed_lines(diff: str) -> str:
    """Returns the changed lines of a diff, stripped: what identifies a mutant across renumbering."""
    return "\n".join(line[0] + line[1:].strip() for line in diff.splitlines()
                     if line[:1] in "+-" and not line.startswith(("+++", "---")))


def function_of(name: str) -> str:
    """Returns the function part of a mutant name (``fp16lab.bits.x_next_up__mutmut_3`` -> ``x_next_up``)."""
    return name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[-1]


def load_equivalents(path: pathlib.Path = EQUIVALENT) -> dict[tuple[str, str, str], str]:
    """Returns {(module, function, changed lines): reason} from the equivalents file."""
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("equivalent", [])
    out = {}
    for e in entries:
        missing = {"module", "function", "change", "reason"} - set(e)
        if missing:
            raise ValueError(f"{path}: an [[equivalent]] entry lacks {sorted(missing)}: {e}")
        out[(e["module"], e["function"], changed_lines(e["change"]))] = e["reason"].strip()
    return out


COLUMNS = ("killed", "survived", "no tests", "timeout", "suspicious", "skipped", "segfault",
           "not checked")


def summarize(statuses: dict[str, str], equivalent: set[str]) -> dict[str, float]:
    """Returns the counts per status, the equivalents and the score for one module.

    Survivors and mutants no test reaches count against the score unless recorded as
    equivalent; timeouts and segfaults count as killed (the tests noticed), as mutmut counts them.
    """
    counts = {c: 0 for c in COLUMNS}
    for name, status in statuses.items():
        if status not in counts:
            raise ValueError(f"mutant {name} has status {status!r}; rerun that module")
        counts[status] += 1
    counts["equivalent"] = len(equivalent)
    caught = counts["killed"] + counts["timeout"] + counts["segfault"]
    missed = counts["survived"] + counts["no tests"] - counts["equivalent"]
    counts["score"] = caught / (caught + missed) if caught + missed else float("nan")
    return counts


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_report(path: pathlib.Path = REPORT) -> float:
    """Writes the report from every target that has results; returns the overall score."""
    equivalents = load_equivalents()
    rows, survivors, totals = [], [], {c: 0 for c in (*COLUMNS, "equivalent")}
    for target in TARGETS.values():
        statuses = load_results(target)
        if not statuses:
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
        seconds = timing.read_text().strip() if timing.exists() else "unfinished"
        rows.append((target, counts, seconds))
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
        "| module | functions | tests | mutants | " + " | ".join(COLUMNS) + " | equivalent | score | seconds |",
        "| --- " * (len(COLUMNS) + 7) + "|",
    ]
    for target, counts, seconds in rows:
        funcs = ", ".join(f"`{g.rsplit('.', 1)[-1]}`" for g in target.functions) or "all"
        files = dict.fromkeys(pathlib.Path(t.split("::")[0]).name for t in target.tests)
        tests = ", ".join(f"`{f}`" + (" (some)" if any("::" in t for t in target.tests) else "")
                          for f in files)
        n = sum(counts[c] for c in COLUMNS)
        lines.append(f"| `{target.source}` | {funcs} | {tests} | {n} | "
                     + " | ".join(str(counts[c]) for c in COLUMNS)
                     + f" | {counts['equivalent']} | {counts['score']:.1%} | {seconds} |")
    n = sum(totals[c] for c in COLUMNS)
    lines.append("| **all** | | | " + f"{n} | " + " | ".join(str(totals[c]) for c in COLUMNS)
                 + f" | {totals['equivalent']} | **{overall:.1%}** | |")
    notes = [f"- `{t.source}`: {(BUILD / t.name / 'note').read_text().strip()}"
             for t, _, _ in rows if (BUILD / t.name / "note").exists()]
    if notes:
        lines += ["", "Notes on these runs:", "", *notes]
    lines += ["", "## Survivors", ""]
    if not survivors:
        lines.append("None.")
    for module, name, status, diff, reason in survivors:
        verdict = f"equivalent: {reason}" if reason else f"**{status}, not explained**"
        lines += [f"### `{name}` ({module})", "", verdict, "", "```diff", diff, "```", ""]
    path.write_text("\n".join(lines).rstrip() + "\n")
    return overall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"which of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--report-only", action="store_true", help="write the report, run nothing")
    parser.add_argument("--rerun-missed", action="store_true",
                        help="keep the last verdicts; run only the mutants not caught last time")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; choose from {', '.join(TARGETS)}")
    mutmut_version()
    if not args.report_only:
        for name in args.modules or TARGETS:
            print(f"mutating {TARGETS[name].source} ...", flush=True)
            print(f"  done in {run_target(TARGETS[name], args.rerun_missed):.0f} s", flush=True)
    score = write_report()
    print(f"mutation score {score:.1%}; report in {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared test set-up: GPU tests skip with the reason; required suites may not; counts per marker.

``FP16LAB_REQUIRE`` (comma-separated marker names, e.g. ``browser,nvcc``; CI sets it) turns a
skip of a test carrying one of those markers into a failure, so that a run cannot go green
because Chromium or nvcc was missing. At the end, a table counts the tests run per marker, and
the skip reasons are listed, grouped, the most frequent first.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU here (torch.cuda.is_available() is False); run `make test-gpu` on a GPU machine"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: The markers the summary counts, in its order; "other" is a test with none of them.
COUNTED_MARKERS = ("gpu", "notebook", "browser", "nvcc", "slow")
_outcomes: collections.Counter = collections.Counter()
_skip_reasons: collections.Counter = collections.Counter()
_REQUIRED = pytest.StashKey[set]()


def required_markers() -> set[str]:
    """Returns the markers whose tests must run here (from ``FP16LAB_REQUIRE``)."""
    wanted = {m.strip() for m in os.environ.get("FP16LAB_REQUIRE", "").split(",") if m.strip()}
    unknown = wanted - set(COUNTED_MARKERS)
    if unknown:
        raise pytest.UsageError(f"FP16LAB_REQUIRE names unknown markers {sorted(unknown)}; "
                                f"allowed: {', '.join(COUNTED_MARKERS)}")
    return wanted


def pytest_configure(config):
    config.stash[_REQUIRED] = required_markers()



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    markers = [m for m in COUNTED_MARKERS if m in item.keywords] or ["other"]
    required = item.config.stash[_REQUIRED] & set(markers)
    if report.skipped and required and not hasattr(report, "wasxfail"):
        reason = skip_reason(report)
        report.outcome = "failed"
        report.longrepr = (f"FP16LAB_REQUIRE={','.join(sorted(item.config.stash[_REQUIRED]))}: "
                           f"a {'/'.join(sorted(required))} test may not skip here, but it did: {reason}")
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        for m in markers:
            _outcomes[(m, report.outcome)] += 1
        if report.skipped and not hasattr(report, "wasxfail"):
            _skip_reasons[skip_reason(report)] += 1


def skip_reason(report) -> str:
    """Returns a skipped test's reason, without pytest's "Skipped: " prefix."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    if not _outcomes:
        return
    tr = terminalreporter
    tr.section("tests per marker")
    tr.write_line(f"{'marker':<10}{'passed':>8}{'failed':>8}{'skipped':>9}")
    for m in (*COUNTED_MARKERS, "other"):
        row = [_outcomes[(m, o)] for o in ("passed", "failed", "skipped")]
        if any(row):
            tr.write_line(f"{m:<10}{row[0]:>8}{row[1]:>8}{row[2]:>9}")
    if _skip_reasons:
        tr.section("skip reasons")
        for reason, n in sorted(_skip_reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            tr.write_line(f"{n:>6}  {reason}")


@pytest.fixture(scope="session")
def root() -> pathlib.Path:
    return ROOT


@pytest.fixture(scope="session")
def lab_executed() -> dict:
    """The notebooks a browser test ran with Run All in JupyterLab this session, without an error:
    {file name: (the notebook's JSON as JupyterLab holds it, outputs included; seconds)}.
    tests/test_notebooks.py reads their outputs instead of executing them a second time."""
    return {}


# ------------------------------------------------------------ the exercises' feedback, word for word

#: Every message an exercise's check gave in the exercise tests, per test, in order: what a
#: learner reads, reviewed as text. A test of an exercise asserts the verdict and the words that
#: matter; this transcript holds the rest of the message to what it was when last reviewed.
FEEDBACK = ROOT / "tests" / "fixtures" / "exercise_feedback.json"
#: ``FP16LAB_WRITE_FEEDBACK=1 pytest tests/test_exercises*.py`` rewrites the transcripts of the
#: tests it runs (read the diff before you commit it).
_WRITE_FEEDBACK = os.environ.get("FP16LAB_WRITE_FEEDBACK") == "1"
_written_feedback: dict[str, list] = {}


def _normal(message: str) -> str:
    """The message less what changes from run to run: object addresses."""
    return re.sub(r" at 0x[0-9a-f]+", " at 0x…", message)


@functools.lru_cache(maxsize=1)
def _transcripts() -> dict[str, list]:
    return json.loads(FEEDBACK.read_text()) if FEEDBACK.exists() else {}


def _is_exercise_test(module: str) -> bool:
    return module == "test_exercises" or module.startswith(("test_exercises_",
                                                            "test_mutation_kills_exercises_"))


@pytest.fixture(autouse=True)
def _exercise_feedback(request, monkeypatch):
    name = request.module.__name__.rsplit(".", 1)[-1]
    if not _is_exercise_test(name):
        yield
        return
    from fp16lab.exercises import core

    seen: list[list[str]] = []
    check = core.Exercise.check

    def recording_check(self, *args, **kwargs):
        feedback = check(self, *args, **kwargs)
        seen.append([f"{self._checker.__module__.rsplit('.', 1)[-1]}.{self.name}", feedback.kind,
                     _normal(feedback.message)])
        return feedback

    monkeypatch.setattr(core.Exercise, "check", recording_check)
    yield
    key = f"{name}::{request.node.name}"
    if _WRITE_FEEDBACK:
        _written_feedback[key] = seen
        return
    expected = _transcripts().get(key)
    if expected is None:
        assert not seen, (f"{key} gave exercise feedback that {FEEDBACK.name} has no transcript "
                          "for: run it with FP16LAB_WRITE_FEEDBACK=1 and review the diff")
        return
    assert len(seen) == len(expected), (f"{key}: {len(seen)} checks gave feedback, the "
                                        f"transcript has {len(expected)}")
    for got, want in zip(seen, expected):
        assert got == want, f"{key}: the feedback changed\n got: {got}\nwant: {want}"


def pytest_sessionfinish(session):
    if _WRITE_FEEDBACK and _written_feedback:
        old = dict(_transcripts())
        old.update(_written_feedback)
        FEEDBACK.parent.mkdir(parents=True, exist_ok=True)
        FEEDBACK.write_text(json.dumps(dict(sorted(old.items())), indent=1, ensure_ascii=False) + "\n")

"""The suite's own guard: FP16LAB_REQUIRE turns skips of required suites into failures."""

from __future__ import annotations

import pathlib

import pytest

pytest_plugins = ["pytester"]

CONFTEST = pathlib.Path(__file__).with_name("conftest.py").read_text()
TESTS = """
import pytest

@pytest.mark.browser
def test_needs_chromium():
    pytest.skip("no Chromium here")

@pytest.mark.nvcc
def test_needs_nvcc():
    pytest.skip("no nvcc here")

def test_plain():
    pass
"""


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    gpu: g\n    notebook: n\n    browser: b\n"
                     "    nvcc: c\n    slow: s\n")
    pytester.makepyfile(test_suite=TESTS)
    return pytester


def test_without_requirement_skips_stay_skips(suite, monkeypatch):
    monkeypatch.delenv("FP16LAB_REQUIRE", raising=False)
    result = suite.runpytest_inprocess()
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.re_match_lines([r"browser\s+0\s+0\s+1", r"nvcc\s+0\s+0\s+1", r"other\s+1\s+0\s+0"])


def test_required_suite_that_skips_fails(suite, monkeypatch):
    monkeypatch.setenv("FP16LAB_REQUIRE", "browser")
    result = suite.runpytest_inprocess()
    result.assert_outcomes(passed=1, skipped=1, failed=1)
    result.stdout.fnmatch_lines(["*a browser test may not skip here, but it did: *no Chromium here*"])
    result.stdout.re_match_lines([r"browser\s+0\s+1\s+0"])


def test_both_required(suite, monkeypatch):
    monkeypatch.setenv("FP16LAB_REQUIRE", "browser, nvcc")
    suite.runpytest_inprocess().assert_outcomes(passed=1, failed=2)


def test_unknown_required_marker_is_a_usage_error(suite, monkeypatch):
    monkeypatch.setenv("FP16LAB_REQUIRE", "browsr")
    result = suite.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("unknown markers ['browsr']; allowed: gpu, notebook, browser, nvcc, slow"
            in result.stderr.str())


SKIPS = """
import pytest

@pytest.mark.parametrize("i", range(3))
def test_no_gpu(i):
    pytest.skip("no GPU here")

@pytest.mark.skipif(True, reason="needs nvcc")
def test_no_nvcc():
    pass

@pytest.mark.xfail(reason="known bug")
def test_known():
    assert False

def test_plain():
    pass
"""


def test_skip_reasons_are_listed_grouped_most_frequent_first(suite, monkeypatch):
    monkeypatch.delenv("FP16LAB_REQUIRE", raising=False)
    suite.makepyfile(test_skips=SKIPS)
    result = suite.runpytest_inprocess()
    result.assert_outcomes(passed=2, skipped=6, xfailed=1)
    lines = result.stdout.lines
    start = next(i for i, ln in enumerate(lines) if "skip reasons" in ln)
    # test_suite.py's two skips (Chromium, nvcc) and these: one group per reason, counted
    assert [ln.split(None, 1) for ln in lines[start + 1:start + 5]] == [
        ["3", "no GPU here"], ["1", "needs nvcc"], ["1", "no Chromium here"], ["1", "no nvcc here"]]
    assert "known bug" not in "\n".join(lines[start:])  # an xfail is not a skip


def test_no_skips_no_reasons_section(pytester, monkeypatch):
    monkeypatch.delenv("FP16LAB_REQUIRE", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_one="def test_plain():\n    pass\n")
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1)
    assert "skip reasons" not in result.stdout.str()


def test_a_required_skip_is_not_listed_as_a_skip(suite, monkeypatch):
    monkeypatch.setenv("FP16LAB_REQUIRE", "browser")
    result = suite.runpytest_inprocess()
    result.stdout.re_match_lines([r"=+ skip reasons =+", r"\s+1  no nvcc here$"])
    assert not [ln for ln in result.stdout.lines if ln.strip() == "1  no Chromium here"]

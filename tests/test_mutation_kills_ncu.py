"""Tests that kill the mutants of fp16lab.ncu the behaviour tests of tests/test_ncu.py let live:
the names in its messages, its bounds at their edges, and what profile and profile_callable pass
on to ncu (read back from a fake ncu on PATH)."""

from __future__ import annotations

import inspect
import math
import os
import stat
import types
from pathlib import Path

import pytest

from fp16lab import ncu

FIXTURE = Path(__file__).parent / "fixtures" / "ncu_ladder_4096_h200.csv"
LAMBDA = lambda: None  # noqa: E731 - a top-level lambda: its qualname has no dot


def top_level():
    """A function profile_callable takes."""


class Holder:
    @staticmethod
    def method():
        """A qualname with a dot and no '<'."""


def _fake(tmp_path, monkeypatch, body: str) -> Path:
    """A fake ncu (and nvidia-smi) first on PATH; ncu records its arguments (NUL-separated),
    $PYTHONPATH and $MARK, then runs ``body``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    record = (f"printf '%s\\0' \"$@\" > {tmp_path}/args; printf '%s' \"$PYTHONPATH\" > "
              f"{tmp_path}/pythonpath; printf '%s' \"$MARK\" > {tmp_path}/mark\n")
    for name, text in (("ncu", record + body), ("nvidia-smi", "exit 0")):
        path = bin_ / name
        path.write_text("#!/bin/sh\n" + text + "\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def _args(tmp_path) -> list[str]:
    return (tmp_path / "args").read_text().split("\0")[:-1]


# ----------------------------------------------------------------------------- parse_csv

def test_a_table_with_only_the_three_needed_columns_parses():
    text = '"ID","Metric Name","Metric Value"\n"4","gpu__time_duration.sum","7"\n'
    (k,) = ncu.parse_csv(text)
    assert (k.id, k.name, k.block, k.grid, k["duration_ns"]) == (4, "#4", "", "", 7.0)


@pytest.mark.parametrize("column", ["Range Name", "Name"])
def test_a_range_is_named_from_its_column(column):
    text = f'"ID","{column}","Metric Name","Metric Value"\n"0","step","gpu__time_duration.sum","1"\n'
    assert ncu.parse_csv(text)[0].name == "step"


def test_parse_says_which_header_it_expected():
    with pytest.raises(ValueError, match=r'expected the header "ID",...,"Metric Name","Metric '
                                         r'Unit","Metric Value"\)$'):
        ncu.parse_csv("")


# ----------------------------------------------------------------------------- why ncu failed

def test_failure_messages_in_full():
    assert ncu._why_failed("ERR_NVGPUCTRPERM", 1) == (
        "this user may not read the GPU's performance counters (ERR_NVGPUCTRPERM): run as root, "
        "or load the driver with NVreg_RestrictProfilingToAdminUsers=0")
    assert ncu._why_failed("==WARNING== No kernels were profiled.", 0) == (
        "no kernel was profiled: the program launched none inside the profiled range")
    assert ncu._why_failed("a\nb\n\nc\nd\ne\n", 2) == "ncu exited with status 2: c | d | e"
    assert ncu._why_failed("1\n2\n3\n4\n5", 2) == "ncu exited with status 2: 2 | 3 | 4 | 5"
    assert ncu._why_failed("", 7) == "ncu exited with status 7: no message"


# ----------------------------------------------------------------------------- reading counters

def test_bottleneck_at_the_bound_and_its_words():
    at = ncu.KernelCounters(0, "k", values={"tensor": 60.0, "dram": 10.0, "sm": 10.0})
    assert ncu.bottleneck(at) == ("tensor pipes", "tensor pipes busy 60% of the time")
    dram = ncu.KernelCounters(0, "k", values={"tensor": 1.0, "dram": 60.0, "sm": 10.0})
    assert ncu.bottleneck(dram)[0] == "DRAM bandwidth"
    sm = ncu.KernelCounters(0, "k", values={"tensor": 1.0, "dram": 1.0, "sm": 72.4})
    assert ncu.bottleneck(sm) == ("SM throughput", "an SM unit at 72% of its peak")


def _stalls(issued, **ratios):
    return ncu.KernelCounters(0, "k", values={"issued": issued,
                                              **{f"stall_{r}": v for r, v in ratios.items()}})


def test_moved_leaves_out_issuing_and_reasons_read_on_one_side_only():
    before = _stalls(1000.0, selected=10.0, barrier=5.0, long_scoreboard=math.nan)
    after = _stalls(10.0, selected=1.0, barrier=1.0, long_scoreboard=1.0)
    assert ncu.moved(before, after) == ("barrier", 5000.0, 10.0)
    with pytest.raises(ValueError, match="^no stall counters to compare: profile with the "
                                         "stall_\\* metrics and issued$"):
        ncu.moved(_stalls(1.0), _stalls(1.0))


def test_weighted_takes_durations_below_one():
    ks = [ncu.KernelCounters(0, "a", values={"duration_ns": 0.25, "sm": 4.0}),
          ncu.KernelCounters(1, "b", values={"duration_ns": 0.5, "sm": 1.0})]
    assert ncu.weighted(ks, "sm") == pytest.approx(2.0)


def test_roofline_and_peak_bounds_and_names():
    assert ncu.roofline(0, 2, 1) == (0.0, 0.0)
    assert ncu.roofline(0.5, 0.25, 0.5) == (2.0, 1.0)
    assert ncu.implied_peak(0, 50) == 0 and ncu.implied_peak(0.5, 0.5) == 100.0
    for call, name in ((lambda: ncu.roofline(-1, 1, 1), "flops"),
                       (lambda: ncu.roofline(1, 0, 1), "dram_bytes"),
                       (lambda: ncu.roofline(1, 1, 0), "seconds"),
                       (lambda: ncu.roofline(1, 1, -1), "seconds"),
                       (lambda: ncu.implied_peak(-1, 1), "rate"),
                       (lambda: ncu.implied_peak(1, 0), "percent")):
        with pytest.raises(ValueError, match=f"^{name} must be"):
            call()


# ----------------------------------------------------------------------------- finding ncu

def test_find_ncu_takes_the_first_executable_known_path(tmp_path, monkeypatch):
    plain, exe = tmp_path / "plain", tmp_path / "exe"
    plain.write_text("")
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    monkeypatch.setattr(ncu, "_NCU_PATHS", (str(tmp_path / "missing"), str(plain), str(exe)))
    assert ncu.find_ncu() == str(exe)


def test_a_gpu_device_file_is_enough_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/x/ncu")
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    monkeypatch.setattr(ncu.os.path, "exists", lambda p: p == "/dev/nvidia0")
    assert ncu.unavailable() is None


# ----------------------------------------------------------------------------- the command line

def test_command_names_each_bad_value(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/x/ncu")
    for kwargs, name in (({"metrics": ["x"]}, "metric"), ({"replay": "app"}, "replay"),
                         ({"kernel_regex": 3}, "kernel_regex"),
                         ({"launch_count": 0}, "launch_count")):
        with pytest.raises((TypeError, ValueError), match=f"^{name} must be"):
            ncu.command(["a"], **kwargs)
    with pytest.raises(ValueError, match=r"^argv\[0\] must be"):
        ncu.command([""])
    cmd = ncu.command(["a"], replay="app-range")
    assert cmd[cmd.index("--replay-mode") + 1] == "app-range"


def test_command_without_ncu_says_so(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: None)
    monkeypatch.setattr(ncu, "unavailable", lambda: None)
    with pytest.raises(ncu.NcuUnavailable, match="^ncu is missing$"):
        ncu.command(["a"])
    monkeypatch.setattr(ncu, "unavailable", lambda: "why")
    with pytest.raises(ncu.NcuUnavailable, match="^why$"):
        ncu.command(["a"])


# ----------------------------------------------------------------------------- profile

def test_profile_passes_every_setting_to_ncu(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, f"cat {FIXTURE}")
    got = ncu.profile(["prog"], ["duration_ns"], kernel_regex="nv", from_start=True,
                      replay="app-range", launch_count=3, timeout=0.5 + 30)
    assert all(set(k.values) == {"duration_ns"} for k in got)
    args = _args(tmp_path)
    assert args[args.index("--metrics") + 1] == "gpu__time_duration.sum"
    assert args[args.index("--kernel-name") + 1] == "regex:nv"
    assert args[args.index("--launch-count") + 1] == "3"
    assert args[args.index("--replay-mode") + 1] == "app-range"
    assert "--profile-from-start" not in args
    ncu.profile(["prog"])
    args = _args(tmp_path)
    assert args[args.index("--profile-from-start") + 1] == "off"  # by default: the range only
    ncu.profile(["prog"], from_start=True)
    assert "--profile-from-start" not in _args(tmp_path)
    assert inspect.signature(ncu.profile).parameters["timeout"].default == 600


def test_profile_stops_ncu_at_its_timeout(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, "sleep 5")
    with pytest.raises(ncu.NcuUnavailable, match="^ncu did not finish within 0.5 s$"):
        ncu.profile(["prog"], timeout=0.5)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="^timeout must be"):
            ncu.profile(["prog"], timeout=bad)


def test_profile_checks_the_machine_before_running_ncu(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, f"cat {FIXTURE}")
    monkeypatch.setattr(ncu, "unavailable", lambda: "no GPU today")
    with pytest.raises(ncu.NcuUnavailable, match="^no GPU today$"):
        ncu.profile(["prog"])
    assert not (tmp_path / "args").exists()


# ----------------------------------------------------------------------------- profile_callable

def test_profile_callable_passes_its_settings_and_environment(tmp_path, monkeypatch):
    _fake(tmp_path, monkeypatch, f"cat {FIXTURE}")
    got = ncu.profile_callable(top_level, ["tensor"], kernel_regex="nv",
                               env={"PYTHONPATH": "/else", "MARK": "kept"})
    assert all(set(k.values) == {"tensor"} for k in got)
    args = _args(tmp_path)
    assert args[-2:] == [f"{__name__}:top_level", "1"]  # one warm-up call by default
    assert args[args.index("--kernel-name") + 1] == "regex:nv"
    assert (tmp_path / "mark").read_text() == "kept"
    assert (tmp_path / "pythonpath").read_text().split(os.pathsep)[1:] == ["/else"]
    ncu.profile_callable(top_level, warmup=0)
    assert _args(tmp_path)[-1] == "0"
    with pytest.raises(ValueError, match="^warmup must be"):
        ncu.profile_callable(top_level, warmup=-1)


@pytest.mark.parametrize("fn", [
    LAMBDA, Holder.method, types.SimpleNamespace(__module__="tests", __qualname__="f"),
    types.SimpleNamespace(__module__="tests", __qualname__="f", __call__=None),
], ids=["top-level lambda", "a method", "not callable", "no qualname"])
def test_profile_callable_refuses_what_a_fresh_process_cannot_import(fn):
    with pytest.raises(ValueError, match="top level of an importable module"):
        ncu.profile_callable(fn)


def test_profile_callable_refuses_a_function_of_the_main_module():
    def main_function():
        pass

    main_function.__qualname__ = "main_function"
    main_function.__module__ = "__main__"
    with pytest.raises(ValueError, match="top level of an importable module"):
        ncu.profile_callable(main_function)


class _Callable:
    def __call__(self):
        pass


def test_profile_callable_refuses_an_instance_without_a_name():
    with pytest.raises(ValueError, match="top level of an importable module"):
        ncu.profile_callable(_Callable())

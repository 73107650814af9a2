"""A hostile run over the whole public API and every CLI flag: bad values must be refused, clearly.

Functions: every public function and class (each module's ``__all__``; a module without one
contributes the public names it defines), found by walking the package. For each parameter that
takes a number, a flag, a name or a path (read from its annotation and default), the call is made
with one bad value at a time (NaN, inf, -1, 0, a fractional count, the wrong type, an empty name,
a file where a folder is wanted), the other parameters at valid values. It passes if it raises
TypeError, ValueError or OSError naming the parameter, within a time limit. Returning normally is
silent acceptance; any other exception is a crash; running past the limit is a hang.

CLI: every sub-command and flag of ``fp16lab`` and of each benchmark, fed bad values, must exit 2
with a one-line message that names the flag and no traceback, within the time limit (so before
any work starts).

Where a parameter legitimately takes such a value (a seed of 0, a signed quantity), the
allow-lists below say so, with the reason; a flag's value taken so (CLI_VALID) must get past
its command's parser.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import inspect
import io
import math
import pkgutil
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch._dynamo  # noqa: F401 imported whole now: a time limit landing mid-import breaks it

import fp16lab
from fp16lab.exercises.core import alarm

#: Seconds one probe may run; a call past it is a hang (or work started before the check).
LIMIT_S = 1.0

# ----------------------------------------------------------------------------- what is probed

#: Modules not probed as functions, with the reason.
NOT_PROBED = {
    "fp16lab.bench": "benchmarks are probed through their command lines below",
    "fp16lab.testing": "test helpers, not a user's API",
    "fp16lab.cli": "probed through its command line below",
    "fp16lab.sweep.cli": "probed through its command line below",
    "fp16lab.claims.cli": "probed through its command line below",
    "fp16lab.distributed_worker": "the body of a spawned worker process",
    "fp16lab.exercises.ch": "the exercises' own checkers take any answer by design",
}

#: Classes that are records fp16lab returns (or a checker builds), not values a user passes.
RECORDS = {"Feedback", "ImageFolderInfo", "KernelSpec", "Quantized", "InputPipeline", "Backend",
           "Wrong", "CorruptImageError", "Point", "DeviceInfo"}



def _public_callables():
    seen = {}
    for info in pkgutil.walk_packages(fp16lab.__path__, "fp16lab."):
        if any(info.name.startswith(p) for p in NOT_PROBED):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (cupy, dali) is missing
            continue
        names = getattr(module, "__all__", None)
        for name in names if names is not None else [n for n in vars(module) if n[:1] != "_"]:
            obj = getattr(module, name, None)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            home = getattr(obj, "__module__", "") or ""
            if not home.startswith("fp16lab.") or any(home.startswith(p) for p in NOT_PROBED):
                continue
            if names is None and home != module.__name__:
                continue
            if inspect.isclass(obj) and (obj.__name__ in RECORDS or issubclass(obj, BaseException)):
                continue
            seen.setdefault(f"{home}.{obj.__qualname__}", obj)
    return dict(sorted(seen.items()))


# ------------------------------------------------------------------- kinds of value, bad values

def _kind(param: inspect.Parameter) -> str | None:
    """Returns the kind of value ``param`` takes (number, count, flag, name, path) or None."""
    ann = param.annotation if isinstance(param.annotation, str) else getattr(
        param.annotation, "__name__", str(param.annotation))
    ann = ann.replace("'", "")
    parts = {p.strip() for p in ann.split("|")} - {"None"}
    default = param.default
    if not parts or parts == {"inspect._empty"} or parts == {"_empty"}:
        if isinstance(default, bool):
            return "flag"
        if isinstance(default, int):
            return "count"
        if isinstance(default, float):
            return "number"
        return None
    if parts == {"bool"}:
        return "flag"
    if parts == {"int"}:
        return "count"
    if parts <= {"float", "int"}:
        return "number"
    if parts <= {"str", "Path", "str | Path", "os.PathLike"} and "Path" in ann:
        return "path"
    if parts == {"str"}:
        return "name"
    return None


class _Hang(BaseException):
    """Raised inside a probe that ran past LIMIT_S (a BaseException: no ``except`` swallows it)."""


def _bad_values(kind: str, tmp: Path) -> dict[str, object]:
    a_file = tmp / "a_file"
    a_file.write_text("x")
    values = {
        "number": {"nan": math.nan, "inf": math.inf, "-1": -1, "0": 0, "'abc'": "abc",
                   "True": True},
        "count": {"nan": math.nan, "inf": math.inf, "-1": -1, "0": 0, "2.5": 2.5, "'abc'": "abc",
                  "True": True},
        "flag": {"'yes'": "yes", "1": 1, "nan": math.nan},
        "name": {"''": "", "'abc'": "no-such-name-abc", "7": 7},
        "path": {"''": "", "7": 7, "a file": a_file},
    }[kind]
    return dict(values)


#: (parameter name, value label) pairs taken by design everywhere, with the reason.
ALLOWED_BY_NAME = {
    ("seed", "0"): "0 is a seed like any other",
    ("index", "0"): "the first index is 0",
    ("device_index", "0"): "the first GPU is index 0",
    ("step", "0"): "the first step is 0",
    ("margin", "0"): "a margin of 0 (no headroom) is the default",
    ("repeat", "0"): "the first repeat is 0",
    ("warmup", "0"): "no warm-up is a valid choice",
    ("min_seconds", "0"): "no minimum time is the default",
    ("contraction_dim", "0"): "dimension 0 is a valid contraction dimension",
    ("passes", "0"): "a planted slow pipeline with no blur passes is its fast, clean twin",
    ("momentum", "0"): "SGD without momentum is plain SGD",
    ("weight_decay", "0"): "no weight decay is a common choice (AdamW's default is 0.01)",
}
#: Free-text parameters: any string is a valid title or message.
FREE_TEXT = {"name", "title", "description", "what", "label", "message", "question", "hint",
             "solution", "solution_code", "text", "kind", "code", "prog", "tag", "caption",
             "where",  # check_precision: the phrase naming the engine in its message
             "category",  # profile.trace.classify: torch.profiler's category, any text
             "skips"}  # device.banner: why tests skip, shown as given
#: Words a message may use for a parameter instead of its name.
ALIASES = {"fmt": ("format",), "recipe": ("recipe",), "precision": ("precision",)}
#: (qualified name, parameter, value label) taken by design, with the reason.
ALLOWED = {
    ("fp16lab.measure.provenance.is_read_only", "path", "a file"):
        "it asks whether a file or a folder can be written: a file is a fair question",
    ("fp16lab.widgets.sweep_panel.SweepPanel", "out", "a file"):
        "out is a results file to append to and resume from: an existing file is the usual case",
    **{("fp16lab.widgets.bit_explorer.BitExplorer", "value", v):
       "showing the bits of NaN, inf, a negative number and zero is what the explorer is for"
       for v in ("nan", "inf", "-1", "0")},
    ("fp16lab.inputs.augment.flip_draw", "p", "0"): "p=0 never flips, as in torchvision",
    ("fp16lab.widgets.scaler_playground.ScalerPlayground", "spread", "0"):
        "no spread: every gradient at the step's largest value, a valid (if dull) playground",
    **{("fp16lab.widgets.scaler_playground.ScalerPlayground", "grad_log2_max", v):
       "a log2 of the largest gradient: -1 and 0 are gradients of 0.5 and 1" for v in ("-1", "0")},
    ("fp16lab.widgets.scaler_playground.ScalerPlayground", "noise", "0"):
        "no noise: the largest gradient follows grad_log2_max exactly",
    ("fp16lab.distributed.points.DistPoint", "profile_steps", "0"): "0 profiles no step (the default)",
    ("fp16lab.distributed.points.DistPoint", "fault", "''"): "'' plants no fault (the default)",
    ("fp16lab.claims.run.device_slug", "gpu_name", "''"): "no GPU name is the 'cpu' slug",
    ("fp16lab.claims.run.device_slug", "gpu_name", "'abc'"): "any GPU's name makes a slug",
    ("fp16lab.inputs.settings.InputSettings", "num_workers", "0"):
        "0 workers: the dataloader loads in the main process",
    ("fp16lab.inputs.settings.InputSettings", "cpu_decode_share", "0"):
        "0 (the default) decodes everything on the GPU",
}

# ----------------------------------------------------------------------- valid calls, by name

VALID_BY_NAME = {
    "m": 64, "n": 64, "k": 64, "tile_m": 128, "tile_n": 128, "sms": 132, "tiles": 8,
    "in_features": 16, "out_features": 16, "fmt": "e4m3", "recipe": "tensorwise",
    "precision": "fp32", "device": "cpu", "backend": "synthetic", "batch": 8, "size": 32,
    "height": 64, "width": 64, "seed": 0, "index": 0, "step": 0, "steps": 2,
    "granularity": "tensorwise", "role": "input", "model_name": "small_cnn", "model": "small_cnn",
    "init_scale": 1024.0, "scale": 1024.0, "cores": 4, "device_index": 0, "threads": 2,
    "depth": 2, "what": "x", "name": "x", "ranks": 2, "gpus": 2, "world_size": 2,
    "execution": "eager", "claim_id": 1, "gpu_name": "NVIDIA H200",
    "arch": "sm_90a", "include_dir": ".", "filename": "census.cu",
    "method": "fp32-master", "params": [torch.nn.Parameter(torch.ones(4))],
}


def _valid_value(qualname: str, param: inspect.Parameter, tmp: Path):
    """Returns a valid value for ``param``, or raises LookupError when none is known."""
    if param.default is not inspect.Parameter.empty:
        return param.default
    ann = str(param.annotation)
    if "Module" in ann:
        return torch.nn.Sequential(torch.nn.Linear(16, 16))  # FP8 can take it: 16 x 16
    if "Tensor" in ann:
        return torch.ones(8, 16)
    if param.name == "workload" or "Workload" in ann:  # a small user workload, built fresh
        from fp16lab.workload import Workload
        from fp16lab.workloads.batches import synthetic_batch
        return Workload(name="probe-mlp", build=lambda: torch.nn.Sequential(torch.nn.Linear(16, 4)),
                        batch=synthetic_batch((16,), 4))
    if param.name in VALID_BY_NAME:
        return VALID_BY_NAME[param.name]
    if "Path" in ann:
        return tmp
    raise LookupError(param.name)


_BASELINE: dict[str, str | None] = {}


def _valid_call_fails(qualname: str, call) -> str | None:
    """Returns why the valid call cannot be made here (once per function), or None."""
    if qualname not in _BASELINE:
        try:
            start = time.monotonic()
            with _time_limit(LIMIT_S), contextlib.redirect_stdout(io.StringIO()):
                call()
            took = time.monotonic() - start
            # a valid call near the limit would make its probes' verdicts depend on the load
            _BASELINE[qualname] = (f"a valid call takes {took:.2f} s, too near the {LIMIT_S:g} s "
                                   "limit to tell a hang" if took > LIMIT_S / 2 else None)
        except _Hang:
            _BASELINE[qualname] = f"a valid call runs past {LIMIT_S:g} s"
        except Exception as exc:  # noqa: BLE001 a GPU-only function, or a value we lack
            _BASELINE[qualname] = f"a valid call fails here: {type(exc).__name__}: {str(exc)[:80]}"
    return _BASELINE[qualname]


def _probes():
    """(qualified name, parameter name, kind) for every probed parameter."""
    out = []
    for qualname, obj in _public_callables().items():
        try:
            params = list(inspect.signature(obj).parameters.values())
        except (TypeError, ValueError):
            continue
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("self", "cls"):
                continue
            kind = _kind(p)
            if kind is not None and not (kind == "name" and p.name in FREE_TEXT):
                out.append((qualname, p.name, kind))
    return out


PROBES = _probes()
CALLABLES = _public_callables()


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raises _Hang in a probe past ``seconds`` (the exercises' alarm: one that lands in a
    finalizer is not reported, and the next, 0.1 s on, stops the probe)."""
    if threading.current_thread() is not threading.main_thread():  # pragma: no cover
        yield
        return
    with alarm(seconds, _Hang):
        yield


def _judge(call, param_name: str) -> str | None:
    """Runs ``call()``; returns None if it refused the value naming ``param_name``, else the finding."""
    try:
        with _time_limit(LIMIT_S), contextlib.redirect_stdout(io.StringIO()):
            result = call()
            if hasattr(result, "__exit__") and not isinstance(result, Path):
                with result:  # a context manager checks its arguments as it is entered
                    pass
    except _Hang:
        return f"hang: still running after {LIMIT_S:g} s"
    except (TypeError, ValueError, OSError) as exc:
        names = (param_name.lstrip("-").replace("-", "_"), *ALIASES.get(param_name, ()))
        if any(n in str(exc).replace("-", "_") for n in names):
            return None
        return f"poor message: {type(exc).__name__}: {str(exc)[:120]} (does not name {param_name})"
    except Exception as exc:  # noqa: BLE001 every other exception is a crash
        return f"crash: {type(exc).__name__}: {str(exc)[:120]}"
    return "silent acceptance"


# ----------------------------------------------------------------------- known findings (xfail)

SWEEP = "owned by the sweep helper: "
LEAD = "owned by the lead (in no helper's files): "
HERE = "owned here, not fixed yet (issue 28): "

#: (qualified name without 'fp16lab.', parameter) -> who owns it and what the run found; each
#: fails today (strict: a fix makes it pass, and then its line must go).
# BEGIN XFAIL
XFAIL: dict[tuple[str, str], str] = {
}
# END XFAIL


def _params():
    for qualname, param, kind in PROBES:
        reason = XFAIL.get((qualname[8:], param))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        yield pytest.param(qualname, param, kind, id=f"{qualname[8:]}:{param}", marks=marks)


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(autouse=True)
def claims_at_their_cpu_sizes(monkeypatch):
    """The claims' experiments at the sizes they use when exercised on a CPU (32 x 32 GEMMs).

    The time limit interrupts Python between operations, not one long C call: a valid call of
    experiment_alignment() at its full size multiplies 4096 x 4096 fp16 matrices on the CPU,
    over a minute each where the CPU has no fast fp16 arithmetic, and the probe could not tell
    that from a hang. The probes check arguments; test_claims runs the experiments."""
    from fp16lab.claims import core
    monkeypatch.setattr(core, "EXERCISE_ON_CPU", True)


@pytest.mark.parametrize("qualname, param, kind", list(_params()))
def test_a_bad_value_is_refused_naming_the_parameter(qualname, param, kind, tmp_module,
                                                     monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_module / "data"))
    monkeypatch.chdir(tmp_module)
    obj = CALLABLES[qualname]
    sig = inspect.signature(obj)
    base = {}
    try:
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == param:
                continue
            base[p.name] = _valid_value(qualname, p, tmp_module)
        base[param] = _valid_value(qualname, sig.parameters[param], tmp_module)
    except LookupError as missing:
        pytest.skip(f"no valid value known for {missing} (add it to VALID_BY_NAME)")
    why = _valid_call_fails(qualname, lambda: obj(**base))
    if why:
        pytest.skip(why)
    del base[param]
    findings = []
    for label, bad in _bad_values(kind, tmp_module).items():
        if (param, label) in ALLOWED_BY_NAME or (qualname, param, label) in ALLOWED:
            continue
        # a fresh copy of any module per call: a function may change it in place (FP8 swaps its
        # linear layers), and the next bad value must meet the valid module, not the changed one
        args = {k: copy.deepcopy(v) if isinstance(v, torch.nn.Module) else v
                for k, v in dict(base, **{param: bad}).items()}
        positional = [args.pop(p.name) for p in sig.parameters.values()
                      if p.kind == p.POSITIONAL_ONLY and p.name in args]
        finding = _judge(lambda: obj(*positional, **args), param)
        if finding:
            findings.append(f"{param}={label}: {finding}")
    assert not findings, f"{qualname}:\n  " + "\n  ".join(findings)


# ------------------------------------------------------------------------------- the CLI

#: Seconds one command line may run before it must have refused its bad value.
CLI_LIMIT_S = 3.0
#: Bad values for a flag that takes a value; the path ones are filled in per run.
CLI_BAD = ("nan", "-1", "0", "", "abc")
#: Flags that take any text (a result's name, a note), so 'abc', '0' and '-1' are fine there.
CLI_FREE_TEXT = {"--name", "--host-note"}
#: Arguments a command needs before any flag can be probed.
CLI_REQUIRED = {("sweep",): ["--out", "{tmp}/r.parquet"], ("report",): ["{results}"],
                ("doctor",): ["small_cnn"]}
#: A real results file (the committed reference sweep's), for ``report``'s positional.
CLI_RESULTS = Path(__file__).resolve().parents[1] / "data" / "sweep_reference_h200.parquet"
#: Flags that name folders; a file there is a wrong path (for a flag whose type names no check).
CLI_FOLDERS = {"--data", "--data-dir", "--trace-dir", "--images-dir", "--out"}
#: The wrong paths for each kind of path flag, by the check its type runs (validate.argument's
#: ``check``); the labels are filled in per run.
CLI_PATHS = {"existing_dir": ("a file", "missing", "under a file"),
             "existing_file": ("a folder", "missing", "under a file"),
             "output_dir": ("a file", "under a file"),
             "images_folder": ("a file", "under a file"),  # read where it holds images, else made
             "output_file": ("a folder", "under a file"),
             "results_file": ("a file", "a folder", "under a file")}  # a file: not sweep results
_MADE = "a folder of that name can be made (relative to the working folder)"
_OFF = "the sweep's on/off flags read 0 as off (and 1 as on), as they always have"
#: (what, bad value) taken by design, with the reason; ``what`` is the kind of path (as in
#: CLI_PATHS) or one command's flag (``"bench gemm --warmup"``). Such probes are not generated.
CLI_VALID = {
    **{(kind, v): _MADE for kind in ("output_dir", "images_folder")
       for v in ("nan", "-1", "0", "abc")},
    ("sweep --warmup", "0"): "no warm-up step is a valid protocol (the tests' sweeps use it)",
    ("sweep --num-workers", "0"): "0 workers: the dataloader loads in the main process",
    **{(f"sweep {flag}", "0"): _OFF
       for flag in ("--cudnn-benchmark", "--pin-memory", "--non-blocking")},
    ("bench alignment --warmup", "0"): "no untimed call before the timed ones",
    ("bench alignment --max-d", "0"): "d = 0 only: N = --base exactly",
    ("bench gemm --warmup", "0"): "no untimed call before each block",
    ("bench gemm --sustained", "0"): "0 skips the sustained runs, as its help says",
    ("bench sweep_engine_vs_loop --warmup", "0"): "no warm-up step is a valid protocol",
    ("bench workloads --warmup", "0"): "no warm-up step is a valid protocol",
    ("bench counters --launch-count", "0"): "0 reads no kernel one by one, as its help says",
    ("bench state16 --seed-only", "0"): "0 is a seed like any other",
    ("bench state16 --first-seed", "0"): "0 is a seed like any other (the default)",
}


class _Work(BaseException):
    """Raised when a command line starts measuring before refusing a bad value."""


class _Captured(BaseException):
    pass


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _bench_parser(name: str) -> argparse.ArgumentParser | None:
    """Returns benchmark ``name``'s parser, caught as its main() parses (nothing runs)."""
    module = importlib.import_module(f"fp16lab.bench.{name}")
    real = argparse.ArgumentParser.parse_args

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture
    try:
        module.main([])
    except _Captured as caught:
        return caught.args[0]
    except BaseException:  # noqa: BLE001 a benchmark that builds no parser
        return None
    finally:
        argparse.ArgumentParser.parse_args = real
    return None


def _cli_candidates():
    """(command prefix, flag or positional, bad value label, why it is taken or None) for every
    CLI value."""
    from fp16lab import cli
    from fp16lab.bench import BENCHMARKS

    parsers = {(name,): p for name, p in _subparsers(cli.build_parser()).items() if name != "bench"}
    for name in BENCHMARKS:
        parser = _bench_parser(name)
        if parser is not None:
            parsers[("bench", name)] = parser
    out = []
    for prefix, parser in parsers.items():
        for action in parser._actions:
            if action.nargs == 0 or isinstance(action, argparse._HelpAction):
                continue
            if action.nargs == argparse.REMAINDER:
                continue
            flag = action.option_strings[0] if action.option_strings else action.dest
            labels = [v for v in CLI_BAD if not (flag in CLI_FREE_TEXT and v not in ("",))]
            kind = getattr(getattr(action.type, "check", None), "__name__", None)
            if kind in CLI_PATHS:
                labels += CLI_PATHS[kind]
            elif flag in CLI_FOLDERS:
                labels += ["a file", "under a file"]
            elif action.type is Path:
                labels += ["missing", "under a file"]
            what = f"{' '.join(prefix)} {flag}"
            for label in labels:
                why = CLI_VALID.get((what, label), CLI_VALID.get((kind, label)))
                out.append((prefix, flag, label, why))
    return out


CLI_CANDIDATES = _cli_candidates()
#: The probes: every bad value not taken by design.
CLI_PROBES = [(prefix, flag, label) for prefix, flag, label, why in CLI_CANDIDATES if why is None]
#: The values CLI_VALID takes, with the reason: each must get past the parser.
CLI_TAKEN = [c for c in CLI_CANDIDATES if c[3] is not None]


def _cli_params():
    for prefix, flag, label in CLI_PROBES:
        yield pytest.param(prefix, flag, label, id=f"{' '.join(prefix)} {flag}={label!r}")


_WORK = ("time_cpu", "time_cuda", "time_cuda_interleaved", "time_cuda_sustained", "step_times_ms",
         "cuda_kernels", "copy_bandwidth_gbs", "write_result", "run_sweep", "measure_point",
         "make_image_folder", "check_all")


def _forbid_work(monkeypatch):
    """Replaces, in every fp16lab module loaded, the functions that measure or write results."""
    def refuse(*args, **kwargs):
        raise _Work

    for name, module in list(sys.modules.items()):
        if not name.startswith("fp16lab") or module is None:
            continue
        for attr in _WORK:
            if callable(getattr(module, attr, None)):
                monkeypatch.setattr(module, attr, refuse)


def _cli_argv(prefix, flag, label, tmp: Path, monkeypatch) -> list[str]:
    """Returns the command line ``PREFIX FLAG=VALUE`` for a value's label, run in ``tmp``."""
    monkeypatch.setenv("FP16LAB_DATA", str(tmp / "data"))
    monkeypatch.chdir(tmp)
    a_file = tmp / "a_file"
    a_file.write_text("x")
    (tmp / "a_folder").mkdir(exist_ok=True)
    value = {"a file": str(a_file), "under a file": f"{a_file}/out", "missing":
             str(tmp / "no" / "such"), "a folder": str(tmp / "a_folder")}.get(label, label)
    required = [a.format(tmp=tmp, results=CLI_RESULTS) for a in CLI_REQUIRED.get(prefix, [])]
    if flag.startswith("-"):
        return [*prefix, *required, f"{flag}={value}"]
    return [*prefix, value]  # a positional: the bad value takes its place


def _cli_finding(prefix, flag, label, tmp: Path, monkeypatch, capsys) -> str | None:
    """Runs ``fp16lab PREFIX FLAG=BAD``; returns None if it exited 2 with one line, else the finding."""
    from fp16lab import cli

    argv = _cli_argv(prefix, flag, label, tmp, monkeypatch)
    _forbid_work(monkeypatch)
    shown = f"fp16lab {' '.join(argv)}"
    capsys.readouterr()
    try:
        with _time_limit(CLI_LIMIT_S):
            status = cli.main(argv)
    except SystemExit as exit_:
        status = exit_.code
    except _Hang:
        return f"hang: {shown} still running after {CLI_LIMIT_S:g} s"
    except _Work:
        return f"late check: {shown} started measuring or writing before refusing"
    except Exception as exc:  # noqa: BLE001 a traceback for the user
        return f"crash: {shown}: {type(exc).__name__}: {str(exc)[:120]}"
    err = capsys.readouterr().err.strip()
    if status != 2:
        return f"silent acceptance: {shown} exited {status!r}, not 2; stderr: {err[-200:]}"
    message = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]
    if len(message) != 1 or "Traceback" in err:
        return f"poor message: {shown}: {err[-300:]}"
    name = flag.lstrip("-").replace("-", "_")
    if name not in message[0].replace("-", "_"):  # "needs a GPU", say: not this flag's own message
        return f"poor message: {shown}: {message[0][:200]} (does not name {flag})"
    return None


@pytest.mark.parametrize("prefix, flag, label", list(_cli_params()))
def test_a_bad_cli_value_exits_2_with_one_line_and_before_any_work(prefix, flag, label,
                                                                    tmp_module, monkeypatch,
                                                                    capsys):
    finding = _cli_finding(prefix, flag, label, tmp_module, monkeypatch, capsys)
    assert finding is None, finding


class _Parsed(BaseException):
    """Raised once a command line's parsers have all taken their arguments."""


def _stop_when_parsed(monkeypatch, parses: int) -> None:
    """Makes the ``parses``-th outermost parse_args (the benchmark's, after fp16lab's) raise _Parsed
    as it returns: the value got past every check made while parsing, and nothing ran."""
    from fp16lab import bench

    depth, done = [0], [0]

    def wrap(real):
        def parse_args(self, *args, **kwargs):
            depth[0] += 1
            try:
                result = real(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                done[0] += 1
                if done[0] == parses:
                    raise _Parsed
            return result
        return parse_args

    for cls in (argparse.ArgumentParser, bench._BenchParser):  # each defines its parse_args
        monkeypatch.setattr(cls, "parse_args", wrap(cls.__dict__["parse_args"]))


@pytest.mark.parametrize("prefix, flag, label, why", [
    pytest.param(*c, id=f"{' '.join(c[0])} {c[1]}={c[2]!r}") for c in CLI_TAKEN])
def test_a_value_taken_by_design_gets_past_the_parser(prefix, flag, label, why, tmp_module,
                                                      monkeypatch, capsys):
    from fp16lab import cli

    argv = _cli_argv(prefix, flag, label, tmp_module, monkeypatch)
    _stop_when_parsed(monkeypatch, parses=2 if prefix[0] == "bench" else 1)
    capsys.readouterr()
    with pytest.raises(_Parsed):
        cli.main(argv)


def test_every_cli_exception_names_a_flag_that_is_probed():
    whats = {f"{' '.join(prefix)} {flag}" for prefix, flag, _, _ in CLI_CANDIDATES}
    stale = [key for key in CLI_VALID if key[0] not in CLI_PATHS and key[0] not in whats]
    assert not stale, f"CLI_VALID names flags no command has: {stale}"

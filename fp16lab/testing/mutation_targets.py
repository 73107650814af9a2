"""What a mutation run mutates: every module of fp16lab and the tests that check it.

The modules are found in the tree (:func:`discover`): every .py file under fp16lab/ except
fp16lab/testing/, __init__ files that only re-export, and the GPU-only modules of ``EXCLUDED``
(each with its reason). A module's tests follow the convention that tests mirror the package
(fp16lab/x/y.py -> tests/test_x_y.py, else tests/test_y.py, else tests/test_x.py), with
``OVERRIDES`` where it does not hold, and tests/test_mutation_kills_x_y.py where it exists.
:func:`changed_modules` picks those whose source or tests changed since a git base.
:mod:`fp16lab.testing.mutation` runs them.
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Tests with these markers never run under mutation: they need a GPU, nvcc, a browser, or minutes.
EXCLUDED_MARKERS = "not gpu and not nvcc and not notebook and not browser and not slow"

#: Tests left out of every run (``--deselect`` adds more): mutmut needs the module's tests to pass
#: before it plants anything, so a test failing on the unchanged code is named here, with the
#: failure, until it is fixed (the report lists them).
DESELECTED: list[str] = []


@dataclasses.dataclass(frozen=True)
class Target:
    """One module to mutate: its file and the fast tests that check it."""

    name: str
    source: str
    tests: tuple[str, ...]
    #: extra files or folders the tests read, relative to the checkout.
    data: tuple[str, ...] = ("data", "tests/fixtures")


#: Modules left out, each with the reason: nothing in them runs without a GPU (or a GPU library),
#: so the CPU tests cannot reach them and every mutant would be "no tests".
EXCLUDED: dict[str, str] = {
    "bench.alignment": "times cuBLAS matmuls on the GPU; no CPU path",
    "bench.diagnostics_overhead": "times ResNet-50 training steps on the GPU; no CPU test",
    "bench.distributed_bare": "one torchrun + NCCL rank of the bare DDP loop; runs only under torchrun on GPUs",
    "bench.gemm": "times the CUDA GEMM kernels against cuBLAS; needs CuPy and a GPU",
    "bench.gemm_ceiling": "times register-only and mma.sync CUDA kernels; needs CuPy and a GPU",
    "bench.sweep_engine_vs_loop": "times the sweep engine against a bare loop with CUDA events; GPU only",
    "bench.wgmma_cluster": "builds and times sm_90a cluster kernels with nvcc; Hopper GPU only",
    "bench.wgmma_probe": "checks the sm_90a wgmma kernels element by element; Hopper GPU only",
    "inputs.dali": "an NVIDIA DALI pipeline; DALI and a GPU only (its unavailable-check is tested through inputs.registry)",
    "inputs.gpu_decode": "nvJPEG decoding on the GPU (torchvision.io.decode_jpeg(device='cuda'))",
    "inputs.hw_decode": "the GPU's hardware JPEG engines through nvImageCodec; GPU only",
    "kernels.cubin": "compiles .cu files with nvcc for sm_90a; needs nvcc (its tests are marked nvcc)",
    "kernels.launch": "launches compiled kernels on torch's CUDA stream through CuPy; GPU only",
    "kernels.measure": "runs the GEMM ladder's checks and benchmark on the local GPU",
}

#: Where the convention (fp16lab/x/y.py -> tests/test_x_y.py, else tests/test_y.py, else the
#: package's tests/test_x.py) does not find a module's tests, or finds the wrong ones: the tests
#: named here are used instead.
OVERRIDES: dict[str, tuple[str, ...]] = {
    "alignment": ("tests/test_claims.py", "tests/test_exercises_ch03.py"),
    "bench.census": ("tests/test_bench.py",),  # test_census.py tests fp16lab.census
    "exercises.ch01": ("tests/test_exercises_ch01.py", "tests/test_exercises.py"),  # q1, q2 there
    # RecordingScaler is the scaler notebook 02's q3 check drives
    "exercises.recording": ("tests/test_exercises.py", "tests/test_exercises_ch02.py",
                            "tests/test_mutation_kills_exercises_ch02.py"),
    # the two end-to-end --tiny runs take 40 s each: the kills file checks main() on stand-ins
    "bench.workloads": ("tests/test_bench_workloads.py::test_summary_ratios_by_hand",),
    "bench.distributed_report": ("tests/test_bench_distributed.py",),
    "bench.wave_quantization": ("tests/test_waves.py",),
    "bits.patterns": ("tests/test_bits.py", "tests/test_census.py", "tests/test_hostile.py"),
    "census": ("tests/test_census.py", "tests/test_hostile.py"),
    "claims.cli": ("tests/test_claims.py", "tests/test_hostile_runs.py"),
    "claims.run": ("tests/test_claims.py", "tests/test_hostile_runs.py"),
    "claims.scaling": ("tests/test_claims.py",),  # test_scaling.py tests fp16lab.scaling
    "claims.training": ("tests/test_claims.py",),  # test_training.py tests fp16lab.training
    "cli": ("tests/test_bench.py", "tests/test_claims.py", "tests/test_device.py",
            "tests/test_sweep_cli.py"),
    "diagnostics.locator": ("tests/test_diagnostics_locator.py", "tests/test_diagnostics.py",
                            "tests/test_hostile_runs.py"),
    "distributed_worker": ("tests/test_distributed.py",),
    "formats": ("tests/test_formats.py", "tests/test_hostile.py"),
    "fp8.training": ("tests/test_fp8.py", "tests/test_recipes.py"),  # not test_training.py
    "kernels.emulate": ("tests/test_kernels.py", "tests/test_bounds.py"),
    # step 7's launcher checks are tested beside the FP8 code that calls them
    "kernels.wgmma": ("tests/test_kernels_wgmma.py",
                      *(f"tests/test_fp8.py::{t}" for t in (
                          "test_step7_operand_checks_name_each_problem",
                          "test_step7_refuses_what_it_cannot_multiply_before_any_gpu_work"))),
    "models": ("tests/test_recipes.py", "tests/test_execution.py"),
    "sweep.engine": ("tests/test_sweep.py", "tests/test_hostile_runs.py"),
    "workload": ("tests/test_workload.py", "tests/test_sweep_workloads.py", "tests/test_memory.py"),
    "workloads": ("tests/test_workloads_text.py", "tests/test_workloads_vision.py",
                  "tests/test_workload.py"),
    "workloads.builtin": ("tests/test_workload.py",),
    "workloads.batches": ("tests/test_workload.py", "tests/test_workloads_text.py"),
    "sweep.plots": ("tests/test_plots.py",),
    # test_sweep.py takes a minute: only its tests of points and grids (under a second each)
    "sweep.point": ("tests/test_sweep_workloads.py", "tests/test_sweep_axes.py",
                    *(f"tests/test_sweep.py::{t}" for t in (
                        "test_bad_spec_is_refused_with_what_is_allowed",
                        "test_scaler_settings_out_of_range_are_refused",
                        "test_cuda_without_gpu_is_refused_before_running",
                        "test_point_refuses_channels_last_for_a_non_image_model",
                        "test_grid_is_the_product_with_layouts_and_scalers_only_where_they_apply",
                        "test_point_keys_are_stable_and_distinguish_settings",
                        "test_scaler_columns_are_empty_without_a_scaler"))),
    "sweep.report": ("tests/test_sweep.py", "tests/test_exercises_ch04.py"),
    # the workload points' steps (eager, compiled, captured) are built in test_sweep_workloads
    "sweep.steps": ("tests/test_sweep.py", "tests/test_sweep_workloads.py"),
    "sweep.results": ("tests/test_sweep_results.py", "tests/test_sweep.py"),
    "widgets": ("tests/test_bit_explorer.py", "tests/test_scaler_playground.py"),
}
#: Packages whose every module is also checked by these tests (the hostile-input tests).
ALSO: dict[str, tuple[str, ...]] = {
    "bits": ("tests/test_hostile.py",),
    "scaling": ("tests/test_hostile.py",),
}


def module_name(path: pathlib.Path) -> str:
    """fp16lab/bits/patterns.py -> ``bits.patterns``; fp16lab/widgets/__init__.py -> ``widgets``."""
    parts = path.relative_to(ROOT / "fp16lab").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def only_reexports(path: pathlib.Path) -> bool:
    """True for a file of nothing but a docstring, imports and ``__all__``: nothing to mutate."""
    import ast

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.Assign) and all(getattr(t, "id", "") == "__all__" for t in node.targets):
            continue
        return False
    return True


def conventional_tests(name: str) -> tuple[str, ...]:
    """The first of tests/test_x_y.py, tests/test_y.py, tests/test_x.py that exists, for ``x.y``."""
    parts = name.split(".")
    for candidate in ("_".join(parts), parts[-1], parts[0]):
        if (ROOT / "tests" / f"test_{candidate}.py").is_file():
            return (f"tests/test_{candidate}.py",)
    return ()


def discover(root: pathlib.Path | None = None) -> tuple[dict[str, Target], dict[str, str]]:
    """Returns ({name: Target} for every module to mutate, {name: why} for each one left out).

    Every .py file under fp16lab/ is one or the other: fp16lab/testing/ (the tools that run the
    tests), the package's own __init__ and __init__ files that only re-export are left out with
    that reason, GPU-only modules with theirs (``EXCLUDED``)."""
    root = root or ROOT / "fp16lab"
    targets, left_out = {}, {}
    for path in sorted(root.rglob("*.py")):
        name = module_name(path)
        if name == "" or name.startswith("testing"):
            left_out[name or "fp16lab"] = ("developer tools that run the tests (fp16lab/testing/)"
                                          if name else "the package's __init__: its version and re-exports")
        elif path.name == "__init__.py" and only_reexports(path):
            left_out[name] = "an __init__ that only re-exports its modules"
        elif name in EXCLUDED:
            left_out[name] = EXCLUDED[name]
        else:
            tests = OVERRIDES.get(name) or conventional_tests(name)
            tests += tuple(t for t in ALSO.get(name.split(".")[0], ()) if t not in tests)
            kills = f"tests/test_mutation_kills_{name.replace('.', '_')}.py"
            if (ROOT / kills).is_file():  # tests written to kill this module's survivors
                tests += (kills,)
            targets[name] = Target(name, str(path.relative_to(ROOT)), tests)
    return targets, left_out


TARGETS, LEFT_OUT = discover()


def changed_modules(base: str | None = None) -> list[str]:
    """The targets whose source or tests changed since ``base`` (default: the merge-base with
    origin/main, else with main, else HEAD~1), uncommitted changes included."""
    def git(*args):
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    if base is None:
        base = next((mb for ref in ("origin/main", "main") if (mb := git("merge-base", "HEAD", ref))
                     and mb != git("rev-parse", "HEAD")), None) or "HEAD~1"
    changed = git("diff", "--name-only", base, "--")
    if changed is None:
        raise SystemExit(f"git cannot diff against {base!r}")
    files = set(changed.split()) | set((git("ls-files", "--others", "--exclude-standard") or "").split())
    return [name for name, t in TARGETS.items()
            if t.source in files or any(x.split("::")[0] in files for x in t.tests)]

"""The benchmarks: each module measures on the local GPU and writes a result file to data/.

Every module here is one benchmark, runnable as ``python -m fp16lab.bench.NAME`` or
``fp16lab bench NAME`` (``fp16lab bench --list`` lists them); what they rest on (timing,
measured files with provenance) is :mod:`fp16lab.measure`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import measure, validate

#: The benchmarks, in the order ``make benchmarks`` runs them, with what each measures.
BENCHMARKS = {
    "census": "census throughput against the copy bandwidth",
    "gemm": "the kernel ladder against cuBLAS",
    "gemm_ceiling": "what holds the mma.sync kernels back",
    "alignment": "cuBLAS at N = 4096 + d: which kernels run",
    "wave_quantization": "a Linear(4096, 4096) at batch 64..2048: tiles, waves and TFLOP/s",
    "diagnostics_overhead": "step-time cost of the per-layer gradient monitor",
    "sweep_engine_vs_loop": "the sweep engine against a bare training loop",
    "sweep_reference": "the reference sweep grid whose results ship in data/",
    "claims": "the twelve claims of notebook 05, verdicts for this GPU",
    "wgmma_cluster": "step 6 (wgmma) with thread-block clusters taken apart (Hopper)",
    "profile_step": "idle fraction and samples/s per execution mode (notebook 06)",
    "input_pipeline": "input backends alone and feeding ResNet-50 training (notebook 07)",
    "distributed": "two GPUs against one: DDP and FSDP2 settings (notebook 08; needs 2 GPUs)",
    "fp8": "FP8 GEMM against fp16/bf16 cuBLAS and FP8 training per recipe (notebook 09)",
    "workloads": "BERT, GPT-2, ViT: AMP speed, memory predicted and measured, engine vs a bare loop",
    "notebook_times": "minutes per notebook and per section, executed with nbclient",
    "doctor": "the doctor on planted problems, and its advice against an exhaustive sweep",
    "state16": "weights and optimizer state in 16 bits, trained side by side (notebook 11)",
    "counters": "Nsight Compute's counters: the ladder's roofline, a training step's kernels",
}



def output_folder(args: argparse.Namespace) -> Path:
    """Returns the folder a benchmark writes its result to: ``--out`` or ``--data-dir`` when
    given, else the committed data folder with ``--replace``, else this machine's results folder."""
    for flag in ("out", "data_dir"):
        if getattr(args, flag, None) is not None:  # '' is given too (and refused)
            return Path(getattr(args, flag))
    return measure.data_dir() if getattr(args, "replace", False) else measure.local_dir()


class _BenchParser(argparse.ArgumentParser):
    """An argument parser that checks the benchmark's output folder as it parses, before any measuring."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        parsed = super().parse_args(args, namespace)
        flag = "--out" if getattr(parsed, "out", None) is not None else \
            "--data-dir" if getattr(parsed, "data_dir", None) is not None else "the results folder"
        validate.output_dir(flag, output_folder(parsed))  # a file or a read-only place: now
        return parsed


def argument_parser(name: str, description: str) -> argparse.ArgumentParser:
    """Returns the argument parser of benchmark ``name``, its usage line ``fp16lab bench NAME``.

    Without ``prog`` argparse names the running program, ``fp16lab`` for the console command,
    so ``fp16lab bench fp8 --help`` would print a usage line that does not run the benchmark.
    Its ``parse_args`` checks the folder the result goes to (:func:`output_folder`: ``--out``,
    ``--data-dir``, ``$FP16LAB_DATA``'s folders) with :func:`fp16lab.validate.output_dir`, so a
    file or a read-only place there fails before minutes of measuring, not after.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"no benchmark {name!r}; the benchmarks are: {', '.join(BENCHMARKS)}")
    return _BenchParser(prog=f"fp16lab bench {name}", description=description)


def add_output_arguments(parser: argparse.ArgumentParser, default_name: str,
                         out_default: str = "data/local/, or data/ with --replace") -> None:
    """Adds the three flags that say where a benchmark's result goes: ``--name`` (the file's
    stem, ``default_name`` unless given), ``--replace`` (write the file shipped with fp16lab in
    data/) and ``--out`` (a folder), each checked as it is parsed (:func:`output_folder`)."""
    parser.add_argument("--name", type=validate.argument(validate.text), default=None,
                        help=f"result file stem (default: {default_name})")
    parser.add_argument("--replace", action="store_true",
                        help="write the file shipped with fp16lab in data/ instead of data/local/")
    parser.add_argument("--out", type=validate.argument(validate.output_dir), default=None,
                        help=f"folder to write the result to (default: {out_default})")


__all__ = ["BENCHMARKS", "add_output_arguments", "argument_parser", "output_folder"]

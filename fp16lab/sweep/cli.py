"""The ``fp16lab sweep`` and ``fp16lab report`` sub-commands."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .. import validate
from ..models import MODELS
from ..scaling import ScalerSettings
from ..scaling.settings import check_scale
from ..workload import workload_name
from .axes import BACKENDS, COMPILE_MODES, EXECUTIONS, SWEEP_PRECISIONS
from .engine import run_sweep
from .report import format_report
from .results import check_results_path, read_results
from .point import LAYOUTS
from .spec import SweepSpec, check_images_dir, check_tolerance


def images_folder(name: str, value: Any) -> Path:
    """Returns ``value`` as a Path if file inputs can read it, or make_image_folder write it there.

    ``--images-dir``'s check (:func:`~fp16lab.sweep.spec.check_images_dir`), for
    :func:`fp16lab.validate.argument`; the benchmarks that make an image folder use it too.
    """
    return check_images_dir(value, name)


def results_file(name: str, value: Any) -> Path:
    """Returns ``value`` as a Path once a sweep can append to it (:func:`check_results_path`)."""
    try:
        return check_results_path(validate.output_file(name, value))
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def results_to_read(name: str, value: Any) -> Path:
    """Returns ``value`` as a Path if it names a sweep results file that exists and can be read.

    :func:`read_results` says what is wrong with a folder, another kind of file or a damaged
    one; the report reads the rows again after parsing.
    """
    if isinstance(value, str) and value:  # an empty path is refused as every path is
        try:
            read_results(value)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    return validate.existing_file(name, value)


def _tolerance(name: str, value: Any) -> float:
    """Returns ``value`` if it is a repeat-spread tolerance (:func:`check_tolerance`)."""
    check_tolerance(value, name)
    return value


def _list_of(check: Any, *args: Any, **kwargs: Any) -> Any:
    """Returns the type of a comma-separated grid flag whose every item ``check`` takes."""
    return validate.argument(check, *args, many=True, **kwargs)


def _cmd_sweep(args: Any) -> int:
    scalers = tuple(
        ScalerSettings(init_scale=i, growth_factor=args.growth_factor,
                       backoff_factor=args.backoff_factor, growth_interval=args.growth_interval)
        for i in args.init_scale)
    models = (*(args.model or ()), *(args.workload or ())) or ("small_cnn",)
    spec = SweepSpec(models=models, batches=args.batch, layouts=args.layout,
                     precisions=args.precision, scalers=scalers,
                     cudnn_benchmark=args.cudnn_benchmark, executions=args.execution,
                     compile_modes=args.compile_mode, inputs=args.input,
                     num_workers=args.num_workers, pin_memory=args.pin_memory,
                     non_blocking=args.non_blocking, normalize_on=args.normalize_on,
                     gpus=args.gpus,
                     images_dir=None if args.images_dir is None else str(args.images_dir),
                     images=args.images, device=args.device,
                     warmup=args.warmup, steps=args.steps, repeats=args.repeats,
                     tolerance=args.tolerance, telemetry=not args.no_telemetry)
    n = len(spec.points())
    print(f"sweep: {n} points x {spec.repeats} repeats on {spec.resolved_device()}, "
          f"results appended to {args.out}")
    t0 = time.perf_counter()
    measured: list[dict[str, Any]] = []
    try:
        rows = run_sweep(spec, args.out, progress=True,
                         on_result=lambda row, done, total: measured.append(row))
    except KeyboardInterrupt:
        kept = len(read_results(args.out))
        print(f"\ninterrupted: {args.out} keeps {kept} finished rows; run the same command "
              f"again to resume")
        return 130
    earlier = len(rows) - len(measured)
    print(f"measured {len(measured)} rows in {time.perf_counter() - t0:.1f} s"
          + (f"; {earlier} rows were already in {args.out} (same points, {spec.warmup} warm-up "
             f"+ {spec.steps} steps), measured earlier, at the times in its finished_at column"
             if earlier else ""))
    print(format_report(rows))
    return 0


def _cmd_report(args: Any) -> int:
    p = args.file  # a readable file, and --tolerance a fraction: checked as parsed
    rows = read_results(p)
    if not len(rows):
        raise ValueError(f"{p}: holds no rows yet")
    print(format_report(rows, args.tolerance))
    return 0


def register_cli(subparsers: Any) -> None:
    """Adds the ``sweep`` and ``report`` sub-commands to the fp16lab command line."""
    p = subparsers.add_parser("sweep", help="measure training steps over a grid (headless)")
    p.add_argument("--model", default=None, type=_list_of(validate.choice, MODELS),
                   help=f"comma-separated; one of: {', '.join(MODELS)} (default small_cnn, "
                        "unless --workload is given)")
    p.add_argument("--workload", default=None, type=_list_of(workload_name),
                   help="comma-separated workloads: built-in ones (bert-base, gpt2-small, llama, "
                        "vit-b16, torchvision-resnet50) or package.module:function, importable "
                        "here (PYTHONPATH=. for a module in this folder)")
    p.add_argument("--batch", default="8,16", type=_list_of(validate.count),
                   help="comma-separated batch sizes, e.g. 64,128,256")
    p.add_argument("--layout", default="nchw", type=_list_of(validate.choice, LAYOUTS),
                   help=f"comma-separated; of {', '.join(LAYOUTS)}")
    p.add_argument("--precision", "--precisions", default="fp32",
                   type=_list_of(validate.choice, SWEEP_PRECISIONS),
                   help=f"comma-separated; of {', '.join(SWEEP_PRECISIONS)}")
    d = ScalerSettings()  # GradScaler's defaults, written once in fp16lab.scaling
    # the factors: finite numbers here; ScalerSettings says which range each one takes
    p.add_argument("--init-scale", default=f"{d.init_scale:g}",
                   type=_list_of(check_scale, numeric=True),
                   help="comma-separated GradScaler init_scale")
    p.add_argument("--growth-factor", type=validate.argument(validate.number),
                   default=d.growth_factor)
    p.add_argument("--backoff-factor", type=validate.argument(validate.number),
                   default=d.backoff_factor)
    p.add_argument("--growth-interval", type=validate.argument(validate.count),
                   default=d.growth_interval)
    p.add_argument("--cudnn-benchmark", default="off", type=_list_of(validate.boolean),
                   help="on, off or on,off")
    p.add_argument("--execution", default="eager", type=_list_of(validate.choice, EXECUTIONS),
                   help=f"comma-separated; of {', '.join(EXECUTIONS)}")
    p.add_argument("--compile-mode", default="default",
                   type=_list_of(validate.choice, COMPILE_MODES),
                   help=f"comma-separated torch.compile modes for --execution compile; of "
                        f"{', '.join(COMPILE_MODES)}")
    p.add_argument("--input", default="synthetic", type=_list_of(validate.choice, BACKENDS),
                   help=f"comma-separated; of {', '.join(BACKENDS)}")
    p.add_argument("--images-dir", default=None, type=validate.argument(images_folder),
                   help="image folder the file inputs read (written first if it holds no images)")
    p.add_argument("--images", type=validate.argument(validate.count), default=SweepSpec.images,
                   help="JPEGs to write into an empty --images-dir")
    p.add_argument("--num-workers", default="auto",
                   type=_list_of(validate.count, low=0, words={"auto": None}),
                   help="comma-separated input workers; 'auto' is 75%% of the cores")
    p.add_argument("--pin-memory", default="on", type=_list_of(validate.boolean),
                   help="dataloader input: on, off or on,off")
    p.add_argument("--non-blocking", default="on", type=_list_of(validate.boolean),
                   help="dataloader input: on, off or on,off")
    p.add_argument("--normalize-on", default="cpu", type=_list_of(validate.choice, ("cpu", "gpu")),
                   help="dataloader input: cpu, gpu or cpu,gpu")
    p.add_argument("--gpus", default="1", type=_list_of(validate.count),
                   help="comma-separated GPU counts, 1 up to the GPUs torch sees, e.g. 1,2 "
                        "(batch is per GPU)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto, cpu or cuda")
    p.add_argument("--warmup", type=validate.argument(validate.count, low=0), default=3)
    p.add_argument("--steps", type=validate.argument(validate.count), default=10,
                   help="timed steps per repeat")
    p.add_argument("--repeats", type=validate.argument(validate.count), default=3,
                   help="interleaved repeats of every point")
    p.add_argument("--tolerance", type=validate.argument(_tolerance, numeric=True), default=0.03,
                   help="flag a point whose repeat medians differ by more than this fraction")
    p.add_argument("--no-telemetry", action="store_true", help="do not sample NVML")
    p.add_argument("--out", required=True, type=validate.argument(results_file),
                   help="results file (.parquet; a .csv copy is written)")
    p.set_defaults(func=_cmd_sweep)

    r = subparsers.add_parser("report", help="print a sweep's results file as a table")
    r.add_argument("file", type=validate.argument(results_to_read),
                   help="a .parquet (or .csv) file written by `fp16lab sweep`")
    r.add_argument("--tolerance", type=validate.argument(_tolerance, numeric=True), default=None,
                   help="repeat-spread tolerance for the UNSTABLE flag (default: the sweep's)")
    r.set_defaults(func=_cmd_report)

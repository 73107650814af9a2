"""Training-step sweeps over batch size, memory layout, precision and loss-scaler settings.

A sweep is a grid of :class:`Point` s built from a :class:`SweepSpec` (:mod:`.spec`). Each
point is one full training step (:func:`fp16lab.recipes.make_train_step`; :mod:`.steps` for
the later axes of :mod:`.axes`: execution, input, gpus, fp8) on synthetic data already on the
device, timed by :mod:`.engine` (which states the measurement protocol).

Repeats of a point are interleaved with the other points (repeat r of every point before repeat
r+1 of any), so a slow drift of clocks or temperature spreads over all points instead of biasing
one; a point whose repeat medians differ by more than ``tolerance`` is flagged ``unstable``.
Every finished repeat is appended to a parquet file (with a CSV copy, :mod:`.results`) as soon
as it finishes, atomically and under a lock, so several sweeps may share one file. :mod:`.report`
and :mod:`.plots` read the rows; :mod:`.cli` is the command line.
"""

from ..recipes import PRECISIONS, SCALED_PRECISIONS
from ..scaling import ScalerSettings
from .axes import AXIS_DEFAULTS, SWEEP_PRECISIONS, variant_label
from .engine import LR, MOMENTUM, FaultInjector, is_oom, measure_point, run_sweep
from .plots import plot_results, plot_style
from .report import (describe_rows, engine_check, format_report, load_reference, ratio_table,
                     scaler_table, summarize_results, throughput_table)
from .results import (META_COLUMNS, ROW_COLUMNS, STATUSES, append_rows, check_results_path,
                      read_results)
from .point import LAYOUTS, Point
from .spec import GPU_PROTOCOL, Protocol, SweepSpec

__all__ = ["AXIS_DEFAULTS", "GPU_PROTOCOL", "LAYOUTS", "LR", "META_COLUMNS", "MOMENTUM", "PRECISIONS",
           "ROW_COLUMNS", "SCALED_PRECISIONS", "STATUSES", "SWEEP_PRECISIONS", "FaultInjector",
           "Point", "Protocol", "ScalerSettings", "SweepSpec", "append_rows", "check_results_path",
           "describe_rows", "engine_check", "format_report", "is_oom", "load_reference",
           "measure_point", "plot_results", "plot_style",
           "ratio_table", "read_results", "run_sweep", "scaler_table", "summarize_results",
           "throughput_table", "variant_label"]

"""Where a training step's time goes: a torch.profiler trace, its event table, and a timeline plot.

:func:`profile_steps` runs a few steps of any step callable under ``torch.profiler`` and writes
the Chrome/Perfetto trace (open it in https://ui.perfetto.dev or chrome://tracing).
:func:`read_trace` turns such a trace (a file, or the JSON dict) into one table of events in two
lanes: ``cpu`` (the host: operators and, on a GPU, the kernel launches) and ``gpu`` (kernels,
copies and fills as the device ran them). Every event gets a *kind*:

- ``gemm-conv``: matrix multiplies and convolutions (on tensor cores in fp16, bf16 and tf32),
- ``elementwise``: pointwise maths (activations, adds, casts, the optimizer's foreach updates),
- ``reduction``: sums, means, norms, softmax, losses,
- ``copy``: memory copies and fills,
- ``nccl``: collective communication between GPUs,
- ``other``: everything else.

:func:`gpu_time_summary` says where the device time went and what fraction of the window the
device sat idle: 1 - (time covered by at least one kernel) / (window length), the window running
from the first device event to the last unless given. A launch-bound step shows up as a large
idle fraction: the GPU finishes each small kernel before the host has launched the next.

:func:`phase` marks a region (forward, backward, unscale, optimizer step) for both torch.profiler
(``record_function``) and Nsight Systems (an NVTX range), so ``nsys profile`` of the same program
shows the same names.

One idea per module: :mod:`~fp16lab.profile.trace` (the event table and the kinds),
:mod:`~fp16lab.profile.intervals` (checked intervals and their union, ``busy_us``),
:mod:`~fp16lab.profile.summary` (where a lane's time went), :mod:`~fp16lab.profile.record`
(phase marks and recording steps) and :mod:`~fp16lab.profile.timeline` (the plot).
"""

from .intervals import busy_us
from .record import (ONE_CYCLE_WARNING, PHASES, PROFILER_START_MARK, STEP_MARK, StepProfile,
                     gpu_kernels, phase, profile_steps, torch_profiler)
from .summary import GpuTimeSummary, gpu_time_summary
from .timeline import plot_timeline
from .trace import KINDS, classify, events_from_table, read_trace

__all__ = ["KINDS", "ONE_CYCLE_WARNING", "PHASES", "PROFILER_START_MARK", "STEP_MARK",
           "GpuTimeSummary", "StepProfile", "busy_us", "classify", "events_from_table",
           "gpu_kernels", "gpu_time_summary", "phase", "plot_timeline", "profile_steps",
           "read_trace", "torch_profiler"]

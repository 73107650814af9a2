"""Training on several GPUs: a point's ranks launched with torchrun, one measured row back.

PyTorch does the distributed work: ``torchrun`` (``python -m torch.distributed.run``) starts one
process per GPU, DDP or FSDP2 (``fully_shard`` with a ``MixedPrecisionPolicy``) averages the
gradients. fp16lab adds three things:

- :class:`DistPoint` (:mod:`.points`), one measured configuration: model, batch per GPU, precision (``fp32``,
  ``amp-fp16``, ``amp-bf16``), optimizer, number of GPUs, DDP or FSDP, and the settings that decide how
  gradients travel (comm hook, bucket size, ``gradient_as_bucket_view``, ``static_graph``, FSDP
  ``reduce_dtype``) and DDP's ``broadcast_buffers``;
- :func:`measure_points` (:mod:`.launcher`), which launches the ranks (``fp16lab.distributed_worker`` does the
  work in each), waits at most ``timeout_s`` per point and returns one row per point; a rank that
  raises or hangs makes that point's row ``status='error'`` with the rank's message, and the
  caller goes on;
- the arithmetic of communication (:mod:`.comm`): :func:`comm_overlap` (how much of a step the collectives
  take, how much of that no compute kernel hides, and how long the GPU runs nothing),
  :func:`allreduce_seconds` (ring all-reduce time from bytes, ranks and bus bandwidth) and
  :func:`bus_bandwidth_gbs` (the other way round, from a measured time).

The files a launch leaves in its work folder are the protocol between the launcher and the
ranks: ``job.json`` (what to run), ``progress_rank<r>.json`` (which point and phase a rank is
in, with its pid), ``error_rank<r>.json`` (what a rank raised), ``row_<i>.json`` (rank 0's row
for point ``i``).
"""

from .comm import allreduce_seconds, bus_bandwidth_gbs, comm_overlap, scaling_efficiency
from .launcher import (CHECKS, DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_TIMEOUT_S, NCCL_ENV, Launch,
                       launch_command, measure_point, measure_points, run_check, run_checks,
                       run_ranks)
from .points import (COMM_HOOKS, CUDNN_BENCHMARK, DIST_MODELS, FAULTS, REDUCE_DTYPES,
                     STEPS, STRATEGIES, WARMUP, DistPoint, point_fields)

__all__ = ["CHECKS", "COMM_HOOKS", "CUDNN_BENCHMARK", "DEFAULT_STARTUP_TIMEOUT_S",
           "DEFAULT_TIMEOUT_S", "DIST_MODELS", "FAULTS", "NCCL_ENV", "REDUCE_DTYPES",
           "STEPS", "STRATEGIES", "WARMUP", "DistPoint", "Launch", "allreduce_seconds",
           "bus_bandwidth_gbs", "comm_overlap", "launch_command", "measure_point",
           "measure_points", "point_fields", "run_check", "run_checks", "run_ranks",
           "scaling_efficiency"]

"""Measuring that can be trusted: CUDA-event timing, and measured result files with provenance."""

from .provenance import (check_can_write, data_dir, describe_source, find_result, local_dir,
                         merge_with_previous, read_result, write_result)
from .timing import (Timing, copy_bandwidth_gbs, cuda_kernels, cuda_missing, nvidia_smi_id,
                     round_orders, step_times_ms, summarize, time_cpu, time_cuda,
                     time_cuda_interleaved, time_cuda_sustained)

__all__ = ["Timing", "check_can_write", "copy_bandwidth_gbs", "cuda_kernels", "cuda_missing",
           "data_dir", "describe_source", "find_result", "local_dir", "merge_with_previous",
           "nvidia_smi_id", "read_result", "round_orders", "step_times_ms", "summarize", "time_cpu", "time_cuda",
           "time_cuda_interleaved", "time_cuda_sustained", "write_result"]

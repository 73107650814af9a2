"""The benchmarks: each module measures on the local GPU and writes a result file to data/.

Every module here is one benchmark, runnable as ``python -m fp16lab.bench.NAME`` or
``fp16lab bench NAME`` (``fp16lab bench --list`` lists them); what they rest on (timing,
measured files with provenance) is :mod:`fp16lab.measure`.
"""

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
    "notebook_times": "minutes per notebook and per section, executed with nbclient",
}

__all__ = ["BENCHMARKS"]

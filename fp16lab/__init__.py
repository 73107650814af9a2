"""fp16lab: FP16 and mixed-precision training, bit by bit, on your own GPU.

Modules by concept: ``validate`` (checks for what a user passes), ``formats`` (number formats),
``bits`` (encode/decode/explain), ``census`` (where a tensor's values fall), ``scaling`` (loss
scalers), ``recipes`` (the precisions and the training step of each), ``training`` (notebook 02's
runs), ``diagnostics`` (per-layer gradient health), ``kernels`` (every CUDA kernel, compiled and
launched through CuPy), ``alignment`` (the cuBLAS alignment lesson), ``measure`` (timing,
measured files), ``inputs`` (the input pipeline), ``sweep`` (training sweeps), ``distributed``,
``fp8``, ``claims``, ``bench`` (the benchmarks), ``models``, ``widgets``, ``plots``, ``device``,
``cli``."""

__version__ = "0.1.0"

# The numerics API, re-exported (numpy only: torch is imported where a function needs it).
from .bits import decode, encode, explain  # noqa: E402
from .census import census, census_model  # noqa: E402
from .formats import FORMATS, FormatInfo, format_info  # noqa: E402

__all__ = ["FORMATS", "FormatInfo", "format_info", "decode", "encode", "explain",
           "census", "census_model", "__version__"]

"""FP8 training made transparent: per-tensor, per-row and per-tile scales, delayed scaling, Float8Linear.

``scales`` computes scales and casts (e4m3 forward; gradients e5m2, or e4m3 under the blockwise
recipe); ``linear`` holds the FP8 matmul (``torch._scaled_mm`` on GPUs that have it, an fp32
emulation elsewhere; step 7 of the kernel ladder for the blockwise recipe's product) and
:class:`Float8Linear`; ``training`` a small GPT-style model and the training step per recipe.
"""

from .linear import (BACKENDS, BLOCKWISE_K, FALLBACKS, GEMM_MULTIPLE, RECIPES, Float8Linear,
                     blockwise_support, convert_to_fp8, fp8_mm, grad_format, granularity,
                     scaled_mm_available, wgmma_blockwise_mm)
from .scales import (DTYPES, EPS, GRANULARITIES, DelayedScaling, Quantized, amax, compile_casts,
                     dequantize, fp8_max, quantize, scale_from_amax, tile_shape)

__all__ = ["BACKENDS", "BLOCKWISE_K", "DTYPES", "EPS", "FALLBACKS", "GEMM_MULTIPLE",
           "GRANULARITIES", "RECIPES", "DelayedScaling", "Float8Linear", "Quantized", "amax",
           "blockwise_support", "compile_casts", "convert_to_fp8", "dequantize", "fp8_max",
           "fp8_mm", "grad_format", "granularity", "quantize", "scale_from_amax",
           "scaled_mm_available", "tile_shape", "wgmma_blockwise_mm"]

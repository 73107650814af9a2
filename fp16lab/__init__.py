"""fp16lab: FP16 and mixed-precision training, bit by bit, on your own GPU.

Modules by concept: ``formats`` (number formats), ``bits`` (encode/decode/explain),
``census`` (where a tensor's values fall), ``scaling`` (loss scalers), ``diagnostics``
(per-layer gradient health), ``kernels`` (tensor-core GEMMs through CuPy), ``bench``
(timing), ``sweep`` (training sweeps), ``models``, ``widgets``, ``plots``, ``device``, ``cli``.
"""

__version__ = "0.1.0"

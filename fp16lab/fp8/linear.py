"""Float8Linear: a linear layer whose three matmuls run in FP8, through ``torch._scaled_mm`` or emulated.

Forward, ``y = x @ W^T`` casts the activations ``x`` and the weights ``W`` to e4m3; backward,
``dx = dy @ W`` and ``dW = dy^T @ x`` cast the gradient ``dy`` to :func:`grad_format`: e5m2 for
one scale per tensor or row (more range, less precision: gradients span more binades than
activations), e4m3 for the blockwise recipe, whose 1x128 and 128x128 scales follow the values
closely enough that e4m3's range holds them (DeepSeek-V3, arXiv 2412.19437, section 3.3, keeps
every tensor in e4m3 so). Each cast takes its scales from the layer's recipe (see :data:`RECIPES`).

Two backends compute an FP8 matmul of two scaled operands:

* ``scaled_mm``: ``torch._scaled_mm`` (GPUs of compute capability 8.9 and up: Ada, Hopper), for
  tensorwise and rowwise scales, and for blockwise ones (1x128 on the left operand, 128x128 on
  the right, both e4m3: the forward's and ``dx``'s products) where :func:`blockwise_support`
  finds that this torch and GPU run them. Every dimension must be a multiple of 16 (of 128 for
  blockwise): a Float8Linear raises at construction when its features are not, and pads the
  token dimension with zero rows (zeros change no amax) and slices the output back.
* ``emulate``: the same cast (torch's float8 dtypes), the codes divided by their scales back to
  fp32, a matmul in fp32. It is what runs on a CPU, and for scale layouts ``_scaled_mm`` does not
  take (the blockwise ``dW = dy^T @ x``, whose operands both carry 1x128 scales along the
  contraction), so it is the reference the GPU path is checked against.

``auto`` picks ``scaled_mm`` where it can and says in :data:`FALLBACKS` why it did not. Inside
``torch.compile`` it decides from the operands alone (tensorwise or rowwise scales, or blockwise
ones where :func:`blockwise_support` already found them supported, CUDA tensors, multiples of
16: ``scaled_mm``; else ``emulate``), with no fallback bookkeeping, so the casts, amaxes and
scales compile into the neighbouring kernels (see ``training.compile_blocks``).

Neither backend is bit-exact with the other: on Hopper, ``_scaled_mm``'s FP8 tensor cores keep
13 mantissa bits while they accumulate (the rest is truncated; SageAttention2, arXiv 2411.10958;
DeepSeek-V3, arXiv 2412.19437, sec. 3.3.2), and cuBLAS promotes the partial sums to fp32 every
few MMAs unless ``fast_accum`` asks it not to. The emulation accumulates in fp32 throughout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import validate
from ..kernels import wgmma as _wgmma
from ..kernels.compiler import require_cupy
from ..recipes import FP8_RECIPES as RECIPES  # a precision fp8-<recipe> each: named there once
from .scales import DelayedScaling, Quantized, _quantize, amax, dequantize

__all__ = ["BACKENDS", "BLOCKWISE_K", "FALLBACKS", "GEMM_MULTIPLE", "RECIPES", "Float8Linear",
           "blockwise_support", "convert_to_fp8", "fp8_mm", "grad_format", "granularity",
           "scaled_mm_available", "wgmma_blockwise_mm"]

#: How an FP8 matmul is computed (see the module docstring).
BACKENDS = ("auto", "scaled_mm", "emulate")
#: torch._scaled_mm needs every dimension to be a multiple of this.
GEMM_MULTIPLE = 16
#: Blockwise tiles are this long, so blockwise layers need multiples of it.
BLOCK = 128
#: torch._scaled_mm's blockwise path is used only where K is a multiple of this. With torch
#: 2.11 on an H200 (2026-12-02) it returned wrong values wherever K was 256 (off by 0.1 to
#: 1e34 relative, at M and N of 256 and 512) and right ones at K = 512, 2048 and 4096, with
#: no error raised. K = 512 is the smallest K measured right: K/128 scales per row, 16 bytes,
#: the alignment cuBLAS asks of a matrix's leading dimension (which is plausibly the cause).
BLOCKWISE_K = 4 * BLOCK
#: Why ``auto`` emulated instead of calling torch._scaled_mm, one line per case met in this process.
FALLBACKS: dict[str, str] = {}


def granularity(recipe: str, role: str) -> str:
    """Returns the scale granularity a recipe gives a tensor of ``role`` ("data" or "weight")."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown FP8 recipe {recipe!r}; allowed: {', '.join(RECIPES)}")
    if role not in ("data", "weight"):
        raise ValueError(f"role must be 'data' or 'weight', got {role!r}")
    if recipe == "blockwise":
        return "1x128" if role == "data" else "128x128"
    return "rowwise" if recipe == "rowwise" else "tensorwise"


def grad_format(recipe: str) -> str:
    """Returns the FP8 format a recipe casts gradients to: e4m3 for blockwise (its fine scales
    make e5m2's extra range unneeded, as in DeepSeek-V3), e5m2 for the others."""
    granularity(recipe, "data")
    return "e4m3" if recipe == "blockwise" else "e5m2"


def scaled_mm_available(device: torch.device | str) -> bool:
    """Returns True where torch._scaled_mm runs: a CUDA device of compute capability 8.9 or newer."""
    device = torch.device(device)
    return (device.type == "cuda" and torch.cuda.is_available() and hasattr(torch, "_scaled_mm")
            and torch.cuda.get_device_capability(device) >= (8, 9))


#: Whether torch._scaled_mm runs blockwise scales on a device: (yes, why not), probed once each.
_BLOCKWISE: dict[str, tuple[bool, str]] = {}


def _scaled_mm_kind(qa: Quantized, qb: Quantized) -> str | None:
    """Returns "tensorwise", "rowwise" or "blockwise" where _scaled_mm takes these scales (by
    their layout alone), else None."""
    (m, k), n = qa.data.shape, qb.data.shape[1]
    if qa.scale.numel() == 1 and qb.scale.numel() == 1:
        return "tensorwise"
    if qa.tile == (1, k) and qb.tile == (k, 1):
        return "rowwise"
    if (qa.tile == (1, BLOCK) and qb.tile == (BLOCK, BLOCK) and qa.fmt == qb.fmt == "e4m3"
            and not any(d % BLOCK for d in (m, k, n))):
        return "blockwise"
    return None


def blockwise_support(device: torch.device | str) -> tuple[bool, str]:
    """Returns (whether ``torch._scaled_mm`` runs DeepSeek-style blockwise scales on ``device``,
    why not): found by running it once on a 256 x 512 x 256 product (K = :data:`BLOCKWISE_K`,
    the smallest K it is used at) and comparing with the emulation (a torch or GPU without the
    kernel raises, and one that computes it wrongly is refused too); cached per device, so
    later calls, and ``torch.compile``, read the answer."""
    device = torch.device(device)
    key = str(device)
    if key in _BLOCKWISE:
        return _BLOCKWISE[key]
    if not scaled_mm_available(device):
        result = (False, f"torch._scaled_mm needs a CUDA GPU of compute capability 8.9+, not {key}")
    else:
        gen = torch.Generator(device).manual_seed(0)
        a = torch.randn(256, BLOCKWISE_K, device=device, generator=gen)
        b = torch.randn(BLOCKWISE_K, 256, device=device, generator=gen)
        qa = _quantize(a, "e4m3", "1x128", contraction_dim=1)
        qb = _quantize(b, "e4m3", "128x128", contraction_dim=0)
        try:
            got = _run_scaled_mm(qa, qb, "blockwise", torch.float32, False)
        except (RuntimeError, ValueError, TypeError) as exc:
            result = (False, "torch._scaled_mm refused blockwise scales: "
                             + str(exc).splitlines()[0][:200])
        else:
            want = (dequantize(qa) @ dequantize(qb)).double()
            err = float((got.double() - want).norm() / want.norm())  # float64: no overflow
            result = (err < 1e-2, "" if err < 1e-2 else
                      f"torch._scaled_mm's blockwise result is off by {err:.2g} of the emulation's")
    _BLOCKWISE[key] = result
    return result


def _check_operands(qa: Quantized, qb: Quantized) -> None:
    if not isinstance(qa, Quantized) or not isinstance(qb, Quantized):
        raise TypeError("fp8_mm multiplies two Quantized operands (see fp8.quantize)")
    if qa.data.shape[1] != qb.data.shape[0]:
        raise ValueError(f"cannot multiply {tuple(qa.data.shape)} by {tuple(qb.data.shape)}: "
                         "the inner dimensions differ")


def _check_multiples(shape: tuple[int, int, int]) -> None:
    bad = [f"{name}={n}" for name, n in zip("MKN", shape) if n % GEMM_MULTIPLE]
    if bad:
        raise ValueError(f"torch._scaled_mm needs M, K and N to be multiples of {GEMM_MULTIPLE}; "
                         f"{', '.join(bad)} are not (pad them, or use backend='emulate')")


def _run_scaled_mm(qa: Quantized, qb: Quantized, kind: str, out_dtype: torch.dtype,
                   fast_accum: bool) -> torch.Tensor:
    a = qa.data if qa.data.is_contiguous() else qa.data.contiguous()  # row-major
    b = qb.data if qb.data.stride(0) == 1 else qb.data.t().contiguous().t()  # column-major
    # _scaled_mm multiplies the codes by scale_a and scale_b: the inverse of our scales
    if kind == "blockwise":
        # (M, K/128) for the left operand and (K/128, N/128) for the right, both column-major:
        # the layout torch 2.11 takes for 1x128 x 128x128 scales (others raise "Invalid
        # scaling configuration"); the kernel writes bf16
        sa = qa.scale.reciprocal().t().contiguous().t()
        sb = qb.scale.reciprocal().t().contiguous().t()
        out = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                               use_fast_accum=fast_accum)
        return out.to(out_dtype)
    if kind == "tensorwise":
        sa, sb = qa.scale.reshape(()).reciprocal(), qb.scale.reshape(()).reciprocal()
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                                use_fast_accum=fast_accum)
    # rowwise scales: (M, 1) and (1, N); the kernel writes bf16 only
    out = torch._scaled_mm(a, b, scale_a=qa.scale.reciprocal().contiguous(),
                           scale_b=qb.scale.reciprocal().contiguous(), out_dtype=torch.bfloat16,
                           use_fast_accum=fast_accum)
    return out.to(out_dtype)


def fp8_mm(qa: Quantized, qb: Quantized, *, out_dtype: torch.dtype = torch.float32,
           backend: str = "auto", fast_accum: bool = False) -> torch.Tensor:
    """Returns ``dequantize(qa) @ dequantize(qb)`` in ``out_dtype``, computed in FP8 where it can be.

    Args:
        qa: the left operand (M, K), scaled along K (``contraction_dim=1``).
        qb: the right operand (K, N), scaled along K (``contraction_dim=0``).
        backend: "auto", "scaled_mm" (raises where it cannot run) or "emulate".
        fast_accum: let _scaled_mm keep its partial sums in lower precision (faster; forward only).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    _check_operands(qa, qb)
    shape = (qa.data.shape[0], qa.data.shape[1], qb.data.shape[1])
    kind = _scaled_mm_kind(qa, qb)
    device = qa.data.device
    if backend == "scaled_mm":
        if not scaled_mm_available(device):
            raise RuntimeError(f"torch._scaled_mm needs a CUDA GPU of compute capability 8.9+, "
                               f"not {device}; use backend='emulate'")
        if kind is None:
            raise ValueError(f"torch._scaled_mm takes tensorwise, rowwise or blockwise (1x128 x "
                             f"128x128, e4m3) scales, not tiles of {qa.tile} and {qb.tile} "
                             f"({qa.fmt} x {qb.fmt}); use backend='emulate'")
        if kind == "blockwise" and not blockwise_support(device)[0]:
            raise RuntimeError(blockwise_support(device)[1] + "; use backend='emulate'")
        if kind == "blockwise" and shape[1] % BLOCKWISE_K:
            raise ValueError(f"the blockwise torch._scaled_mm is used only where K is a multiple "
                             f"of {BLOCKWISE_K} (see BLOCKWISE_K), not K={shape[1]}; use "
                             "backend='emulate'")
        _check_multiples(shape)
        return _run_scaled_mm(qa, qb, kind, out_dtype, fast_accum)
    if backend == "auto" and torch.compiler.is_compiling():
        # no try/except or FALLBACKS inside a graph: the operands decide (see the module docstring)
        supported = kind is not None and (kind != "blockwise" or (
            _BLOCKWISE.get(str(device), (False, ""))[0] and not shape[1] % BLOCKWISE_K))
        if supported and device.type == "cuda" and not any(n % GEMM_MULTIPLE for n in shape):
            return _run_scaled_mm(qa, qb, kind, out_dtype, fast_accum)
    elif backend == "auto" and scaled_mm_available(device):
        key = f"{kind or 'tiles ' + str(qa.tile) + ' x ' + str(qb.tile)} {qa.fmt} x {qb.fmt}"
        if kind is None:
            FALLBACKS.setdefault(key, "emulated: torch._scaled_mm takes no such scale layout")
        elif kind == "blockwise" and not blockwise_support(device)[0]:
            FALLBACKS.setdefault(key, "emulated: " + blockwise_support(device)[1])
        elif kind == "blockwise" and shape[1] % BLOCKWISE_K:
            FALLBACKS.setdefault(f"{key}, K={shape[1]}", f"emulated: K={shape[1]} is not a "
                                 f"multiple of {BLOCKWISE_K} (see BLOCKWISE_K)")
        elif any(n % GEMM_MULTIPLE for n in shape):
            FALLBACKS.setdefault(key, f"emulated: shape {shape} is not a multiple of {GEMM_MULTIPLE}")
        elif key not in FALLBACKS:
            try:
                return _run_scaled_mm(qa, qb, kind, out_dtype, fast_accum)
            except (RuntimeError, ValueError, TypeError) as exc:  # e.g. a format pair it lacks
                FALLBACKS[key] = f"emulated: torch._scaled_mm raised {str(exc).splitlines()[0]}"
    return (dequantize(qa) @ dequantize(qb)).to(out_dtype)


def wgmma_blockwise_mm(qa: Quantized, qb: Quantized, *, out_dtype: torch.dtype = torch.bfloat16,
                       overlap: bool = True, schedule: str = "tile per block") -> torch.Tensor:
    """Returns ``dequantize(qa) @ dequantize(qb)`` computed by step 7 of notebook 03's kernel
    ladder (``fp16lab/kernels/wgmma_fp8.cu``): e4m3 codes on Hopper's FP8 tensor cores, each K
    block of 128 promoted to fp32 with its two factors, as DeepGEMM does.

    Args:
        qa: (M, K) with 1 x 128 e4m3 tiles (``quantize(a, "e4m3", "1x128")``).
        qb: (K, N) with 128 x 128 e4m3 tiles (``contraction_dim=0``).
        out_dtype: torch.bfloat16 or torch.float32.
        overlap: multiply K block k + 1 while block k is promoted (False: one after the other,
            the kernel before that change, for comparison).
        schedule: how blocks take their tiles, a key of
            ``fp16lab.kernels.wgmma.FP8_SCHEDULES`` (the first, one tile per block, is step 7;
            the others are its measured variants: persistent, clusters of 2 multicasting B).

    Raises:
        ValueError: other tiles, formats or output dtypes.
        fp16lab.kernels.KernelUnavailable: no Hopper GPU, nvcc or cuda-bindings here (says which).
    """
    _check_step7(qa, qb, out_dtype)
    overlap = validate.boolean("overlap", overlap)
    validate.choice("schedule", schedule, _wgmma.FP8_SCHEDULES)
    _wgmma.require()
    return launch_step7(*step7_operands(qa, qb, out_dtype), overlap=overlap, schedule=schedule)


def step7_operands(qa: Quantized, qb: Quantized,
                   out_dtype: torch.dtype) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Returns the output of step 7's ``qa @ qb`` (empty, ``out_dtype``) and the kernel's operands
    laid out as it takes them: the codes of A (M, K) and B (N, K), K contiguous, as bytes; the
    factors of A (K/128, M) and B (N/128, K/128); the output's bits. :func:`wgmma_blockwise_mm`
    makes them on every call; a benchmark of the kernel alone makes them once."""
    _check_step7(qa, qb, out_dtype)
    (m, _), n = qa.data.shape, qb.data.shape[1]
    a = qa.data.contiguous().view(torch.uint8)        # (M, K), K contiguous
    b = qb.data.t().contiguous().view(torch.uint8)    # (N, K), K contiguous
    # the kernel multiplies the codes by factors: the inverses of the scales they were made with
    sa = qa.scale.reciprocal().t().contiguous()       # (K/128, M)
    sb = qb.scale.reciprocal().t().contiguous()       # (N/128, K/128)
    out = torch.empty(m, n, dtype=out_dtype, device=qa.data.device)
    bits = out if out_dtype == torch.float32 else out.view(torch.int16)
    return out, (a, b, sa, sb, bits)


def _check_step7(qa: Quantized, qb: Quantized, out_dtype: torch.dtype) -> None:
    """Raises where step 7 cannot multiply ``qa`` by ``qb`` into ``out_dtype``."""
    _check_operands(qa, qb)
    if qa.tile != (1, BLOCK) or qb.tile != (BLOCK, BLOCK) or not qa.fmt == qb.fmt == "e4m3":
        raise ValueError(f"step 7 multiplies 1x{BLOCK} by {BLOCK}x{BLOCK} e4m3 tiles, not tiles "
                         f"of {qa.tile} and {qb.tile} ({qa.fmt} x {qb.fmt})")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"step 7 writes torch.bfloat16 or torch.float32, not {out_dtype}")


def launch_step7(out: torch.Tensor, operands: tuple[torch.Tensor, ...],
                 **launch: Any) -> torch.Tensor:
    """Runs step 7 on :func:`step7_operands`' operands on torch's current stream (``launch``:
    ``fp16lab.kernels.wgmma.launch_fp8``'s options) and returns ``out``."""
    cupy = require_cupy()
    stream = torch.cuda.current_stream(out.device)  # CuPy launches on torch's stream
    with (cupy.cuda.Stream.from_external(stream) if hasattr(stream, "__cuda_stream__")
          else cupy.cuda.ExternalStream(stream.cuda_stream)):
        _wgmma.launch_fp8(*(cupy.asarray(t) for t in operands), **launch)
    return out


class _Fp8Matmul(torch.autograd.Function):
    """``x @ w.T`` with e4m3 operands forward and :func:`grad_format` gradients backward, scaled
    by the layer's recipe."""

    @staticmethod
    def forward(ctx, x, w, recipe, backend, out_dtype, scalers):
        # plain arguments (strings, a dtype, the delayed recipe's scalers or None): torch.compile
        # traces this function and its backward into the model's graph
        gd, gw = granularity(recipe, "data"), granularity(recipe, "weight")
        delayed = recipe == "delayed"
        sx = sw = None
        if delayed:
            sx, sw = scalers["input"].scale, scalers["weight"].scale
        qx = _quantize(x, "e4m3", gd, contraction_dim=1, scale=sx, saturate=delayed)
        qw = _quantize(w.t(), "e4m3", gw, contraction_dim=0, scale=sw, saturate=delayed)
        if delayed:
            scalers["input"].update(amax(x, tuple(x.shape)))
            scalers["weight"].update(amax(w, tuple(w.shape)))
        y = fp8_mm(qx, qw, out_dtype=out_dtype, backend=backend, fast_accum=True)
        ctx.recipe, ctx.backend, ctx.scalers = recipe, backend, scalers
        ctx.dtypes = (x.dtype, w.dtype)
        if recipe in ("tensorwise", "delayed"):
            # one scale per tensor: the forward's codes serve the backward too (transposed)
            ctx.save_for_backward(qx.data, qx.scale, qw.data, qw.scale)
        else:
            ctx.save_for_backward(x, w)
        return y

    @staticmethod
    def backward(ctx, g):
        recipe, backend = ctx.recipe, ctx.backend
        gd, gw = granularity(recipe, "data"), granularity(recipe, "weight")
        delayed = recipe == "delayed"
        g = g.contiguous()
        sg = ctx.scalers["grad"].scale if delayed else None
        gfmt = grad_format(recipe)
        qg = _quantize(g, gfmt, gd, contraction_dim=1, scale=sg, saturate=delayed)
        if delayed:
            ctx.scalers["grad"].update(amax(g, tuple(g.shape)))
        if recipe in ("tensorwise", "delayed"):
            xd, xs, wd, ws = ctx.saved_tensors
            qx = Quantized(xd, xs, tuple(xd.shape), "e4m3")
            qw = Quantized(wd, ws, tuple(wd.shape), "e4m3").t()  # (N, K)
            qg_t = qg.t()
        else:
            x, w = ctx.saved_tensors
            qw = _quantize(w, "e4m3", gw, contraction_dim=0)
            qg_t = _quantize(g.t(), gfmt, gd, contraction_dim=1)
            qx = _quantize(x, "e4m3", gd, contraction_dim=0)
        grad_x = fp8_mm(qg, qw, out_dtype=ctx.dtypes[0], backend=backend)
        grad_w = fp8_mm(qg_t, qx, out_dtype=ctx.dtypes[1], backend=backend)
        return grad_x, grad_w, None, None, None, None


def _feature_multiple(recipe: str) -> int:
    return BLOCK if recipe == "blockwise" else GEMM_MULTIPLE


class Float8Linear(nn.Linear):
    """A ``nn.Linear`` whose matmuls run in FP8 with the scales of ``recipe`` (see :data:`RECIPES`).

    The weights stay in their own dtype (the master copy); they are cast at every forward. Under
    autocast the output has the autocast dtype, otherwise the input's. The bias is added after the
    FP8 matmul, in the output dtype.

    Args:
        recipe: "tensorwise", "rowwise", "blockwise" or "delayed".
        backend: "auto", "scaled_mm" or "emulate" (see the module docstring).
        history_len, margin: the delayed recipe's amax history length and power-of-two margin.

    Raises:
        ValueError: when in_features or out_features is not a multiple of 16 (of 128 for
            blockwise), or for an unknown recipe or backend.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: str = "tensorwise", backend: str = "auto", history_len: int = 16,
                 margin: int = 0, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        granularity(recipe, "data")
        in_features = validate.count("in_features", in_features)
        out_features = validate.count("out_features", out_features)
        bias = validate.boolean("bias", bias)
        history_len = validate.count("history_len", history_len)
        margin = validate.count("margin", margin, low=0)
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
        mult = _feature_multiple(recipe)
        if in_features % mult or out_features % mult:
            raise ValueError(f"an FP8 {recipe} linear layer needs in_features and out_features "
                             f"that are multiples of {mult}; got {in_features} -> {out_features}")
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe, self.backend = recipe, backend
        self.scalers: dict[str, DelayedScaling] = {}
        if recipe == "delayed":
            self.scalers = {"input": DelayedScaling("e4m3", history_len, margin),
                            "weight": DelayedScaling("e4m3", history_len, margin),
                            "grad": DelayedScaling("e5m2", history_len, margin)}

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "Float8Linear":
        """Returns a Float8Linear sharing ``linear``'s weight and bias parameters."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                  device="meta", **kwargs)
        new.weight, new.bias = linear.weight, linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, k = x.shape
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        for s in self.scalers.values():
            if s.scale.device != x.device:
                s.to(x.device)
        x2d = x.reshape(-1, k)
        m = x2d.shape[0]
        if m == 0:  # an empty batch has no amax to scale by: an empty product, as nn.Linear's
            y = x2d.to(out_dtype) @ self.weight.to(out_dtype).t()
            if self.bias is not None:
                y = y + self.bias.to(y.dtype)
            return y.reshape(*lead, self.out_features)
        pad = -m % _feature_multiple(self.recipe)
        if pad:  # zero rows change no amax; the output rows they make are sliced off
            x2d = F.pad(x2d, (0, 0, 0, pad))
        with torch.autocast(dev, enabled=False):
            y = _Fp8Matmul.apply(x2d, self.weight, self.recipe, self.backend, out_dtype,
                                 self.scalers or None)
        if pad:
            y = y[:m]
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}, backend={self.backend}"


def convert_to_fp8(model: nn.Module, recipe: str, *, backend: str = "auto", history_len: int = 16,
                   margin: int = 0, skip: tuple[str, ...] = ("head",)) -> list[str]:
    """Swaps every eligible ``nn.Linear`` of ``model`` for a :class:`Float8Linear`; returns their names.

    Eligible: exactly ``nn.Linear`` (not subclasses such as attention's packed projections, whose
    weights are used without calling the module), features multiples of 16 (128 for blockwise),
    and a name whose last part is not in ``skip`` (the output layer stays in high precision, as
    the usual recipes keep it).
    """
    granularity(recipe, "data")
    validate.choice("backend", backend, BACKENDS)
    validate.count("history_len", history_len)
    validate.count("margin", margin, low=0)
    mult = _feature_multiple(recipe)
    converted = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if (type(child) is nn.Linear and child_name not in skip
                    and not child.in_features % mult and not child.out_features % mult):
                setattr(module, child_name, Float8Linear.from_linear(
                    child, recipe=recipe, backend=backend, history_len=history_len, margin=margin))
                converted.append(f"{name}.{child_name}" if name else child_name)
    return converted

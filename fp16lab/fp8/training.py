"""Training in FP8: a small GPT-style model, a learnable token task, and one training step per recipe.

``make_fp8_step`` is what a sweep point ``fp8-<recipe>`` runs: the model's eligible linear layers
become :class:`~fp16lab.fp8.linear.Float8Linear` and everything else runs under bf16 autocast,
exactly as ``amp-bf16`` does, so the two differ only in the matmuls. ``train_curve`` trains the
same model from the same seed in bf16 (or fp32) or in FP8 and returns its loss per step.

On a CPU, bf16 matmuls are emulated slowly by most builds (a 512^3 bf16 matmul took 20x the fp32
time here), so the CPU default runs the non-FP8 parts in fp32 (``autocast=False``) and compares
FP8 with ``fp32``; on a GPU the default is bf16 autocast and the baseline ``amp-bf16``.

Speed: eager, every FP8 cast is its own few kernels (amax, scale, multiply, convert), launched
from Python for each of the three matmuls of every layer, and at d_model 2048 they cost more than
FP8 saves. ``compile=True`` compiles each block with ``torch.compile`` (as torchao's float8
training and torchtitan do), so amax, scale and cast fuse into the layer norms, GELUs and adds
around the matmuls, and the identical blocks share one compiled graph. Compare it with a compiled
``amp-bf16`` run: compiling speeds up the bf16 model too.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import validate
from ..recipes import PRECISIONS, check_precision, make_train_step, precisions
from .linear import BACKENDS, convert_to_fp8, scaled_mm_available

__all__ = ["CURVE_PRECISIONS", "GPTConfig", "TinyGPT", "compile_blocks", "make_batch",
           "make_fp8_step", "train_curve"]

#: What train_curve accepts: the FP8 precisions and their baselines, fp32 and amp-bf16 (the
#: step is AdamW's without a loss scaler, so no scaled precision).
CURVE_PRECISIONS = tuple(n for n in PRECISIONS if n in precisions(fp8=True)
                         or n in precisions(autocast_recipe=True, scaled=False))
LR = 3e-3
WEIGHT_DECAY = 0.0


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of :class:`TinyGPT` and its task; the defaults train on a CPU in seconds."""

    d_model: int = 128
    n_layers: int = 1
    n_heads: int = 4
    seq_len: int = 32
    vocab: int = 32
    batch: int = 16

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            validate.count(f"GPTConfig.{name}", value)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")


class Block(nn.Module):
    """Pre-norm causal self-attention and a 4x MLP, every projection an ``nn.Linear``."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """Token and position embeddings, ``n_layers`` blocks, a final norm and a linear head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def make_batch(cfg: GPTConfig, step: int, *, seed: int = 0,
               device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (tokens, targets) of one batch: target t is a fixed permutation of token t-1.

    The rule needs attention to the previous token, so the loss falls from ln(vocab) as the model
    learns it (the first position's target is the permutation of itself). Batch ``step`` of
    ``seed`` is the same on every device and every run.
    """
    perm = torch.randperm(cfg.vocab, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
    tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq_len), generator=gen)
    previous = torch.cat([tokens[:, :1], tokens[:, :-1]], dim=1)
    return tokens.to(device), perm[previous].to(device)


def compile_blocks(model: nn.Module) -> int:
    """Compiles each block of ``model.blocks`` in place with ``torch.compile``; returns how many.

    One block at a time, not the whole model: identical blocks reuse one compiled graph, so the
    compile time does not grow with the depth. Shapes are static (``dynamic=False``): a second
    model of another size compiles a graph of its own. With dynamic shapes torch's dynamo fails
    on the FP8 layers' autograd.Function (torch 2.11 on an H200, recompiling for a second size:
    an AssertionError in ``overwrite_tensor_vt_proxy``; torch 2.14 with ``dynamic=True``: in
    ``lift_tracked_freevar_to_input``). Raises for a model without ``blocks``, for the delayed
    recipe, whose amax history lives in Python objects updated at every step, and for the
    blockwise recipe, whose compiled blocks were measured wrong (see the message).
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or not len(blocks):
        raise ValueError(f"compile_blocks needs a model with a non-empty nn.ModuleList `blocks`, "
                         f"not {type(model).__name__}")
    recipes = {getattr(m, "recipe", None) for m in model.modules()}
    if "delayed" in recipes:
        raise ValueError("the delayed recipe keeps its amax history in Python state and runs "
                         "eagerly only; compile tensorwise or rowwise")
    if "blockwise" in recipes:
        raise ValueError("the blockwise recipe runs eagerly only: compiled, its blocks returned "
                         "zero input gradients on an H200 (torch 2.11, inductor, 2026-12-02), "
                         "and torch's CPU inductor fails on its tile reshapes; compile "
                         "tensorwise or rowwise")
    for block in blocks:
        block.compile(dynamic=False)
    return len(blocks)


def make_fp8_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: str, *,
                  optimizer: torch.optim.Optimizer | None = None, backend: str = "auto",
                  history_len: int = 16, margin: int = 0,
                  autocast: bool | None = None, lr: float = LR,
                  compile: bool = False) -> Callable[[], torch.Tensor]:
    """Returns a closure running one training step of ``model`` on (x, y) with FP8 matmuls.

    The model's eligible linear layers are converted in place (see ``convert_to_fp8``; raises
    if none is); the step zeroes the gradients, runs forward under bf16 autocast (``autocast``:
    None means on a GPU only), takes the cross-entropy of the logits (flattened for token models)
    and steps the optimizer (AdamW at ``LR`` if none is given). ``step.optimizer`` and
    ``step.converted`` say what it uses. ``compile`` compiles the blocks after the conversion
    (see :func:`compile_blocks`).
    """
    if autocast is not None:
        validate.boolean("autocast", autocast)
    compile = validate.boolean("compile", compile)
    lr = validate.number("lr", lr, low=0, low_open=True)
    if compile and x.device.type == "cuda" and not scaled_mm_available(x.device):
        backend = "emulate"  # compiled "auto" would call _scaled_mm on any CUDA device
    converted = convert_to_fp8(model, recipe, backend=backend, history_len=history_len,
                               margin=margin)
    if not converted:
        raise ValueError(f"{type(model).__name__} has no linear layer an FP8 {recipe} recipe can "
                         "convert (features must be multiples of 16, or 128 for blockwise)")
    step = _plain_step(model, x, y, optimizer=optimizer, autocast=autocast, lr=lr, compile=compile)
    step.converted = converted
    return step


def _plain_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                optimizer: torch.optim.Optimizer | None = None,
                autocast: bool | None = None, lr: float = LR,
                compile: bool = False) -> Callable[[], torch.Tensor]:
    """Returns fp16lab.recipes' amp-bf16 step (fp32 when autocast is off), loss detached;
    ``compile`` compiles the model's blocks first (see :func:`compile_blocks`)."""
    if compile:
        compile_blocks(model)
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
    dev = x.device.type
    enabled = dev == "cuda" if autocast is None else bool(autocast)
    run, _ = make_train_step("amp-bf16" if enabled else "fp32", model, x, y, device=dev,
                             optimizer=lambda _: opt, loss_fn=_token_loss)

    def step() -> torch.Tensor:
        return run().detach()

    step.optimizer = opt
    return step


def _token_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in fp32 over every position (a classifier's (N, C) logits work too)."""
    return F.cross_entropy(out.float().flatten(0, -2), y.flatten())


def train_curve(precision: str, cfg: GPTConfig = GPTConfig(), *, steps: int = 40, seed: int = 0,
                device: torch.device | str = "cpu", backend: str = "auto",
                history_len: int = 16, margin: int = 0, warmup: int = 0,
                autocast: bool | None = None, lr: float = LR,
                compile: bool = False) -> dict[str, Any]:
    """Returns {"precision", "losses", "step_ms", ...} of ``steps`` training steps of TinyGPT from ``seed``.

    Every precision trains the same initial weights on the same batches. ``amp-bf16`` runs under
    bf16 autocast, ``fp32`` without; an FP8 precision runs its non-FP8 parts under bf16 autocast
    where ``autocast`` says so (None: on a GPU only). ``step_ms`` is the
    median wall time of the steps after ``warmup`` (each followed by a synchronize on a GPU).
    ``compile`` compiles the model's blocks (see :func:`compile_blocks`); the first steps then
    include the compile time, so give it a ``warmup``.
    """
    check_precision(precision, CURVE_PRECISIONS, where="by train_curve")
    steps = validate.count("steps", steps)
    warmup = validate.count("warmup", warmup, low=0, high=steps - 1)
    seed = validate.count("seed", seed, low=0)
    validate.choice("backend", backend, BACKENDS)
    history_len = validate.count("history_len", history_len)
    margin = validate.count("margin", margin, low=0)
    if autocast is not None:
        validate.boolean("autocast", autocast)
    lr = validate.number("lr", lr, low=0, low_open=True)
    validate.boolean("compile", compile)
    device = torch.device(validate.device("device", device))
    torch.manual_seed(seed)
    model = TinyGPT(cfg).to(device)
    batches = [make_batch(cfg, i, seed=seed, device=device) for i in range(min(steps, 64))]
    x = torch.empty_like(batches[0][0])
    y = torch.empty_like(batches[0][1])
    recipe = PRECISIONS[precision].fp8_recipe
    if recipe is None:
        step = _plain_step(model, x, y, autocast=precision == "amp-bf16", lr=lr, compile=compile)
    else:
        step = make_fp8_step(model, x, y, recipe, backend=backend,
                             history_len=history_len, margin=margin, autocast=autocast, lr=lr,
                             compile=compile)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses, times = [], []
    for i in range(steps):
        bx, by = batches[i % len(batches)]
        x.copy_(bx)
        y.copy_(by)
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
        losses.append(float(loss))
    kept = sorted(times[warmup:])
    return {"precision": precision, "losses": losses, "step_ms": kept[len(kept) // 2],
            "steps": steps, "seed": seed, "lr": lr, "config": asdict(cfg),
            "converted": getattr(step, "converted", []), "compiled": compile}

"""Weights and optimizer state in 16 bits, trained side by side: the loss, the updates that
vanished, the bytes held (notebook 11).

A GPT-2-style model (``transformers.GPT2LMHeadModel``, the class of the ``gpt2-small``
workload, built from a configuration with random weights) learns a synthetic language whose
loss has a known floor: each token is followed by one of ``BRANCHES`` successors drawn once
from the vocabulary, each equally likely, so the best possible loss is ln(BRANCHES). Every way
to hold the weights trains on the same batches from the same initial weights (per seed):

- ``ours``: :class:`fp16lab.state16.AdamW16`, the teaching version: fp32-master (FP32 weights,
  the forward under BF16 autocast), bf16-nearest, bf16-stochastic, bf16-kahan;
- ``field``: the field's packages (:func:`fp16lab.state16.field_optimizer`): torch's AdamW
  (fp32-master), torchao's stochastically rounded AdamW, torch-optimi's Kahan-summed AdamW and
  torchao's 8-bit AdamW (bf16-8bit-state), where they are installed.

Per run: the loss of every step, the share of weights a step left unchanged (among those whose
gradient was not zero), the bytes the weights, gradients and optimizer state hold (counted) and,
on CUDA, the measured peak (``torch.cuda.max_memory_allocated`` from before the model is built).
The summary gives each way's final loss (mean of the last 50 steps), its mean and spread over
the seeds and its distance from fp32-master's.

    python -m fp16lab.bench.state16             # GPU: 2,000 steps, 3 seeds
    python -m fp16lab.bench.state16 --jobs 3    # the same, the three seeds at once
    python -m fp16lab.bench.state16 --quick     # CPU: a tiny model, 40 steps, 1 seed
    python -m fp16lab.bench.state16 --seeds 1 --first-seed 2 --merge   # one more seed, kept
                                                # beside the file's others
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fp16lab import measure, validate
from fp16lab.bench import add_output_arguments, argument_parser, output_folder
from fp16lab.state16 import (FIELD, METHODS, AdamW16, bytes_per_parameter, concat_flat,
                             field_optimizer, field_unavailable, state_bytes)

#: How many successors each token has: the loss floor is ln(BRANCHES).
BRANCHES = 4
#: The teaching optimizer's ways and how each rounds (the weights are FP32 for fp32-master,
#: BF16 for the rest).
OURS = {"fp32-master": "nearest", "bf16-nearest": "nearest", "bf16-stochastic": "stochastic",
        "bf16-kahan": "kahan"}
SIZES = {  # (layers, width, heads, vocabulary, sequence, batch)
    "gpu": (4, 384, 6, 8192, 256, 32),
    "tiny": (2, 32, 2, 64, 16, 8),
}


def language(vocab: int, seq: int, batch: int, steps: int, seed: int = 1234) -> torch.Tensor:
    """Returns ``steps`` batches of token sequences (steps, batch, seq + 1) of the synthetic
    language: a fixed table gives each token ``BRANCHES`` successors, one drawn uniformly."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab, size=(vocab, BRANCHES))
    n = steps * batch
    tokens = np.empty((n, seq + 1), dtype=np.int64)
    tokens[:, 0] = rng.integers(0, vocab, size=n)
    for i in range(seq):
        tokens[:, i + 1] = successors[tokens[:, i], rng.integers(0, BRANCHES, size=n)]
    return torch.from_numpy(tokens).view(steps, batch, seq + 1)


def build(size: str) -> torch.nn.Module:
    import transformers  # local: optional heavy dependency (the models extra)

    layers, width, heads, vocab, seq, _ = SIZES[size]
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=seq, n_layer=layers, n_embd=width,
                                  n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def train(method: str, source: str, data: torch.Tensor, size: str, seed: int, device: str,
          lr: float) -> dict[str, Any]:
    """Returns one run's row: its losses, unchanged shares, bytes and peak."""
    cuda = device == "cuda"
    dtype = torch.float32 if method == "fp32-master" else torch.bfloat16
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    torch.manual_seed(seed)
    model = build(size).to(device, dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    if source == "ours":
        opt = AdamW16(params, lr=lr, weight_decay=0.0, rounding=OURS[method],
                      generator=torch.Generator(device).manual_seed(seed))
    else:
        opt = field_optimizer(method, params, lr)
    losses, counts = [], []
    t0 = time.perf_counter()
    for batch in data:
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == torch.float32):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                 batch[:, 1:].flatten())
        loss.backward()
        with torch.no_grad():
            # before the step: an optimizer may reuse the gradient's memory (torch-optimi does)
            old = concat_flat(params)
            live = concat_flat([p.grad for p in params]) != 0
            opt.step()
            # kept on the device and read after the run: a read per step would make the host
            # wait for the GPU at every step
            counts.append(torch.stack([((concat_flat(params) == old) & live).sum(), live.sum()]))
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    losses = torch.stack(losses).tolist()
    same, moved = torch.stack(counts).T.tolist()
    unchanged = [s / m if m else 0.0 for s, m in zip(same, moved)]
    n = sum(p.numel() for p in params)
    row = {"method": method, "source": source, "seed": seed, "losses": losses,
           "unchanged": unchanged, "seconds": time.perf_counter() - t0, "parameters": n,
           "weight_bytes": sum(p.numel() * p.element_size() for p in params),
           "state_bytes": state_bytes(opt), "predicted_bytes_per_parameter":
               bytes_per_parameter(method)}
    row["counted_bytes_per_parameter"] = (2 * row["weight_bytes"] + row["state_bytes"]) / n
    if cuda:
        row["peak_bytes"] = torch.cuda.max_memory_allocated() - before
    return row


def summary(rows: list[dict[str, Any]], tail: int = 50) -> list[dict[str, Any]]:
    """Returns one line per (source, method): the final loss (mean of the last ``tail`` steps)
    over the seeds (mean, standard deviation), its distance from fp32-master's of the same
    source, the unchanged share over the same steps, and the bytes."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["source"], r["method"]), []).append(r)
    finals = {k: [statistics.fmean(r["losses"][-tail:]) for r in g] for k, g in groups.items()}
    out = []
    for (source, method), g in groups.items():
        f = finals[(source, method)]
        ref = finals.get((source, "fp32-master")) or finals.get(("ours", "fp32-master"))
        out.append({
            "source": source, "method": method, "seeds": len(g),
            "final_loss": statistics.fmean(f),
            "final_loss_std": statistics.stdev(f) if len(f) > 1 else math.nan,
            "vs_fp32_master": statistics.fmean(f) / statistics.fmean(ref) - 1 if ref else None,
            "unchanged_last": statistics.fmean(statistics.fmean(r["unchanged"][-tail:]) for r in g),
            "counted_bytes_per_parameter": g[0]["counted_bytes_per_parameter"],
            "predicted_bytes_per_parameter": g[0]["predicted_bytes_per_parameter"],
            "peak_bytes": statistics.fmean(r["peak_bytes"] for r in g) if "peak_bytes" in g[0]
            else None})
    return out


def _kept_rows(path: Path, meta: dict[str, Any], runs: list[tuple[str, str]],
               seeds: list[int]) -> list[dict[str, Any]]:
    """Returns the rows of the result file at ``path`` (none where there is no file) that this
    run, training ``runs`` on ``seeds``, does not train again; raises ValueError, before any
    training, where that file's runs are not comparable with this one's."""
    try:
        old = measure.read_result(path)
    except FileNotFoundError:
        return []
    for key in ("size", "steps", "lr", "branches"):
        if old["meta"].get(key) != meta[key]:
            raise ValueError(f"--merge: {path} was trained with {key} {old['meta'].get(key)!r}, "
                             f"this run with {meta[key]!r}; runs of different {key} cannot be "
                             "summarised together (drop --merge, or use the same settings)")
    again = {(source, method, seed) for source, method in runs for seed in seeds}
    return [r for r in old["rows"] if (r["source"], r["method"], r["seed"]) not in again]


def _seeds_in_parallel(argv: list[str], seeds: list[int], jobs: int) -> list[dict[str, Any]]:
    """Returns the rows of every seed of ``seeds``, each seed trained by a child process
    (``jobs`` at once), in seed order."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        pending = list(seeds)
        running: dict[int, subprocess.Popen] = {}
        while pending or running:
            while pending and len(running) < jobs:
                seed = pending.pop(0)
                # --jobs 1 last (argparse keeps the last): a child never starts children
                cmd = [sys.executable, "-m", "fp16lab.bench.state16", *_without_output(argv),
                       "--seed-only", str(seed), "--out", tmp, "--name", f"seed{seed}",
                       "--jobs", "1"]
                running[seed] = subprocess.Popen(cmd)
            seed, proc = next(iter(running.items()))
            if proc.wait() != 0:
                for p in running.values():
                    p.kill()
                raise RuntimeError(f"seed {seed}'s run failed (exit status {proc.returncode})")
            del running[seed]
        for seed in seeds:
            rows += measure.read_result(Path(tmp) / f"seed{seed}.json")["rows"]
    return rows


def _without_output(argv: list[str]) -> list[str]:
    """argv less the options the parent decides for its children (output, jobs)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        key = a.split("=", 1)[0]
        if key in ("--out", "--name", "--jobs", "--seed-only", "--first-seed"):
            skip = "=" not in a
            continue
        if key in ("--replace", "--merge"):
            continue
        out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argument_parser("state16", __doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model on the CPU, 40 steps")
    ap.add_argument("--steps", type=validate.argument(validate.count, low=2), default=None,
                    help="training steps per run (default 2000, 40 with --quick)")
    ap.add_argument("--seeds", type=validate.argument(validate.count), default=None,
                    help="seeds per way (default 3, 1 with --quick)")
    ap.add_argument("--lr", type=validate.argument(validate.number, low=0, low_open=True),
                    default=1e-4, help="AdamW's learning rate (default 1e-4)")
    ap.add_argument("--sources", default=["ours", "field"],
                    type=validate.argument(validate.choice, ["ours", "field"], many=True),
                    help="ours, field or both (comma-separated)")
    ap.add_argument("--methods", default=list(METHODS),
                    type=validate.argument(validate.choice, list(METHODS), many=True),
                    help=f"the ways to train (comma-separated; default all: {', '.join(METHODS)})")
    ap.add_argument("--jobs", type=validate.argument(validate.count), default=1,
                    help="seeds trained at once, one process each, sharing the GPU (default 1; "
                         "the processes take turns on the GPU: on an H200, 3 at once ran each "
                         "step about 2.5x slower than one alone)")
    ap.add_argument("--first-seed", type=validate.argument(validate.count, low=0), default=0,
                    help="the first seed (default 0): the run trains seeds first-seed, "
                         "first-seed + 1, ...")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of the existing result file that this run does not "
                         "train again (the same steps, size and learning rate only): a run's "
                         "seeds split over several invocations")
    ap.add_argument("--seed-only", type=validate.argument(validate.count, low=0), default=None,
                    help=argparse.SUPPRESS)  # one seed, in a child process of --jobs
    add_output_arguments(ap, "state16_h200 on a GPU, state16_quick on a CPU")
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.quick
    device, size = ("cuda", "gpu") if gpu else ("cpu", "tiny")
    steps = args.steps or (2000 if gpu else 40)
    seeds = args.seeds or (3 if gpu else 1)
    _, _, _, vocab, seq, batch = SIZES[size]
    data = language(vocab, seq, batch, steps)
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    runs = [("ours", m) for m in OURS if m in args.methods] if "ours" in args.sources else []
    if "field" in args.sources:
        for m in (m for m in FIELD if m in args.methods):
            why = field_unavailable(m)
            if why:
                skipped[f"field {m}"] = why
            else:
                runs.append(("field", m))
    name = args.name or ("state16_h200" if gpu else "state16_quick")
    out = output_folder(args)
    meta = {"size": dict(zip(("layers", "width", "heads", "vocab", "seq", "batch"), SIZES[size])),
            "steps": steps, "seeds": seeds, "lr": args.lr, "branches": BRANCHES,
            "loss_floor": math.log(BRANCHES), "skipped": skipped,
            "field": {m: FIELD[m][1] for m in FIELD}}
    seed_list = list(range(args.first_seed, args.first_seed + seeds))
    try:
        kept = _kept_rows(out / f"{name}.json", meta, runs, seed_list) if args.merge else []
    except ValueError as exc:  # an unreadable file, or runs that cannot be merged
        ap.error(str(exc))
    meta["jobs"] = min(args.jobs, seeds)

    def write(rows: list[dict[str, Any]]) -> None:
        every = kept + rows
        measure.write_result(name, every, data_dir=out, meta={
            **meta, "seeds": len({r["seed"] for r in every}), "summary": summary(every)})

    if meta["jobs"] > 1 and args.seed_only is None:
        rows = _seeds_in_parallel(sys.argv[1:] if argv is None else argv, seed_list,
                                  meta["jobs"])
        write(rows)
    for seed in ([] if meta["jobs"] > 1 and args.seed_only is None else
                 [args.seed_only] if args.seed_only is not None else seed_list):
        for source, method in runs:
            rows.append(train(method, source, data, size, seed, device, args.lr))
            r = rows[-1]
            print(f"{source:5s} {method:16s} seed {seed}: last loss "
                  f"{statistics.fmean(r['losses'][-10:]):.4f}, unchanged "
                  f"{statistics.fmean(r['unchanged'][-10:]):.1%}, {r['seconds']:.0f} s", flush=True)
            write(rows)  # after every run: a run cut short keeps what it trained
    rows = kept + rows
    lines = summary(rows)
    seeds = len({r["seed"] for r in rows})
    print(f"\nloss floor ln {BRANCHES} = {math.log(BRANCHES):.4f}; {steps} steps, {seeds} seed(s)")
    print(f"{'source':6s} {'method':16s} {'final loss':>18s} {'vs fp32-master':>15s} "
          f"{'unchanged':>9s} {'B/param':>8s} {'peak MiB':>9s}")
    for s in lines:
        std = "" if math.isnan(s["final_loss_std"]) else f" +- {s['final_loss_std']:.4f}"
        peak = f"{s['peak_bytes'] / 2**20:9.0f}" if s["peak_bytes"] else f"{'-':>9s}"
        print(f"{s['source']:6s} {s['method']:16s} {s['final_loss']:.4f}{std:>11s} "
              f"{100 * (s['vs_fp32_master'] or 0):+14.2f}% {s['unchanged_last']:9.1%} "
              f"{s['counted_bytes_per_parameter']:8.2f} {peak}")
    for what, why in skipped.items():
        print(f"not run: {what}: {why}")
    print(f"wrote {out / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

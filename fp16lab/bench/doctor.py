"""The doctor checked: does it find planted problems, and is its advice near the best?

Two parts, in this order (``--budget-s`` stops starting new runs; what ran is written):

1. ``planted``: the doctor on each workload of :data:`fp16lab.doctor.planted.PLANTED`, started in
   the configuration given there; a hit is a first finding of the planted problem's kind;
2. ``real``: the doctor on real models started in fp32 (BERT-base, GPT-2 small, ViT-B/16,
   ResNet-50), then an exhaustive sweep of the axes precision (fp32, tf32, amp-fp16, amp-bf16,
   FP8 where the GPU has it) x batch (the one given, 2x, 4x) x layout (channels_last too for
   a model that convolves), every point measured by the doctor's own protocol
   (:class:`fp16lab.doctor.probe.Probe`: a fresh model, the first steps' losses, then the
   median of the timed steps). The sweep's best is the fastest point whose loss is within
   the doctor's tolerance of fp32's; the doctor's configuration is its combined one. The
   doctor also changes the optimizer's kernels and ``torch.compile``: the time of that full
   grid is extrapolated (said so in the row) from the sweep points' mean and, for its
   compiled half, the mean time of the compiled configurations the doctor measured
   (:func:`full_grid_seconds`). The doctor's configuration and the sweep's best are then
   raced side by side, so their ratio comes from one run.

Writes ``NAME.json`` (rows; every doctor report in ``meta.reports``) and ``NAME.md`` (the
planted table, the real models' lines and their reports).

    python -m fp16lab.bench.doctor               # GPU, about 10 minutes on an H200
    python -m fp16lab.bench.doctor --quick       # tiny configurations on the CPU, planted only
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any

import torch

from fp16lab import measure, validate
from fp16lab.bench import add_output_arguments, argument_parser, output_folder
from fp16lab.doctor import doctor
from fp16lab.doctor.planted import PLANTED
from fp16lab.doctor.probe import Config, Probe
from fp16lab.doctor.report import DoctorReport
from fp16lab.fp8.linear import scaled_mm_available
from fp16lab.workload import build_model, load_workload
from fp16lab.workloads import missing_package

#: (workload, batch) of the real models.
REAL = (("bert-base", 64), ("gpt2-small", 8), ("vit-b16", 64), ("torchvision-resnet50", 64))
PARTS = ("planted", "real")


def run_planted(names: list[str], device: str, tiny: bool, budget_s: float,
                reports: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        p = PLANTED[name]
        t0 = time.perf_counter()
        try:
            report = doctor(load_workload(p.reference, tiny=tiny), device,
                            batch_size=p.tiny_batch_size if tiny else p.batch_size,
                            precision=p.precision_on(device), layout=p.layout, budget_s=budget_s,
                            progress=False)
        except Exception as e:  # noqa: BLE001 - one workload's failure is a row, not the end
            print(f"{name}: {type(e).__name__}: {e}")
            rows.append({"part": "planted", "workload": name, "error": f"{type(e).__name__}: {e}",
                         "hit": False, "shows_here": True, "expected": p.expected})
            continue
        first = report.first
        rows.append({"part": "planted", "workload": name, "problem": p.problem,
                     "expected": p.expected, "first": first.kind if first else None,
                     "first_title": first.title if first else None,
                     "hit": bool(first and first.kind == p.expected),
                     "shows_here": p.shows_on_cpu or device == "cuda",
                     "findings": [f.kind for f in report.findings],
                     "seconds": time.perf_counter() - t0})
        reports[f"planted-{name}"] = report.as_dict()
        print(f"{name:14s} expected {p.expected:9s} first {rows[-1]['first']!s:9s} "
              f"{'hit' if rows[-1]['hit'] else 'MISS'}  {rows[-1]['seconds']:.0f} s  "
              f"{rows[-1]['first_title']}", flush=True)
    return rows


def sweep_precisions(device: str) -> list[str]:
    """Returns the precision axis of the sweep and of the full grid: TF32 on a GPU, FP8 where
    the GPU runs FP8 matmuls."""
    precisions = ["fp32", "amp-fp16", "amp-bf16"]
    if device == "cuda":
        precisions.insert(1, "tf32")
        if scaled_mm_available(device):
            precisions.append("fp8-tensorwise")
    return precisions


def sweep_configs(workload: Any, batch: int, device: str) -> list[Config]:
    """Returns the exhaustive grid of the axes the module's docstring names."""
    precisions = sweep_precisions(device)
    model = build_model(workload)
    layouts = workload.accepted_layouts(model)
    return [Config(p, lay, b if b != batch else None) for p, lay, b in
            itertools.product(precisions, layouts, (batch, 2 * batch, 4 * batch))]


def full_grid_points(workload: Any, device: str) -> int:
    """Returns how many points an exhaustive grid of every axis the doctor changes has:
    precision x layout x batch (1x, 2x, 4x) x fused optimizer x torch.compile."""
    layouts = len(workload.accepted_layouts(build_model(workload)))
    return len(sweep_precisions(device)) * layouts * 3 * 2 * 2


def full_grid_seconds(points: int, point_s: float, compiled_point_s: list[float]) -> float:
    """Returns the seconds an exhaustive grid of ``points`` (the doctor's axes, half of them
    compiled) would take: the uncompiled half at ``point_s`` each (the sweep's measured mean),
    the compiled half at the mean of ``compiled_point_s`` (the doctor's own measurements of
    compiled configurations, compilation included), or at ``point_s`` where it compiled none."""
    compiled = sum(compiled_point_s) / len(compiled_point_s) if compiled_point_s else point_s
    return points / 2 * point_s + points / 2 * compiled


def run_real(name: str, batch: int, device: str, tiny: bool, budget_s: float,
             reports: dict[str, Any], loss_steps: int = 12) -> dict[str, Any]:
    settings = {"tiny": True} if tiny else {}
    w = load_workload(name, **settings)
    t0 = time.perf_counter()
    report = doctor(w, device, batch_size=batch, budget_s=budget_s, progress=False,
                    loss_steps=loss_steps)
    doctor_s = time.perf_counter() - t0
    reports[name] = report.as_dict()
    print(f"{name}: the doctor took {doctor_s:.0f} s; now the sweep", flush=True)
    t1 = time.perf_counter()
    probe = Probe(w, device, batch, loss_steps=loss_steps)
    points = []
    for config in sweep_configs(w, batch, device):
        m = probe.measure(config)
        ok, _ = probe.loss_within_tolerance(m) if m.ran else (False, None)
        points.append({"config": config.describe(), "batch": m.batch_size,
                       "samples_per_s": m.samples_per_s, "within_tolerance": ok,
                       "error": m.error})
    sweep_s = time.perf_counter() - t1
    fine = [p for p in points if p["within_tolerance"]]
    best = max(fine, key=lambda p: p["samples_per_s"]) if fine else None
    # the doctor's configuration and the sweep's best, raced side by side in one probe: their
    # ratio from one run (the two figures above were measured minutes apart)
    ours = report.combined or report.baseline
    raced: dict[str, float] = {}
    if best is not None:
        best_config = next(c for c in sweep_configs(w, batch, device)
                           if c.describe() == best["config"])
        judge = Probe(w, device, batch, loss_steps=loss_steps)
        speeds = judge.race([ours.config, best_config])
        raced = {"doctor": speeds[ours.config], "best": speeds[best_config]}
    grid = full_grid_points(w, device)
    compiled_s = [m.seconds for m in report.measurements if m.config.compile_mode and m.ran]
    grid_s = full_grid_seconds(grid, sweep_s / len(points), compiled_s)
    row = {"part": "real", "workload": name, "batch": batch,
           "doctor_config": ours.config.describe(), "doctor_samples_per_s": ours.samples_per_s,
           "start_samples_per_s": report.baseline.samples_per_s,
           "best_config": best["config"] if best else None,
           "best_samples_per_s": best["samples_per_s"] if best else None,
           "doctor_over_best": ours.samples_per_s / best["samples_per_s"] if best else None,
           "doctor_s": doctor_s, "sweep_s": sweep_s, "time_share": doctor_s / sweep_s,
           "raced_samples_per_s": raced,
           "doctor_over_best_raced": raced["doctor"] / raced["best"] if raced else None,
           "full_grid_points": grid,
           "compiled_point_s": compiled_s, "full_grid_s_extrapolated": grid_s,
           "time_share_of_full_grid": doctor_s / grid_s,
           "first_findings": [f.title for f in report.findings[:3]], "points": points}
    print(f"{name}: doctor {row['doctor_config']} {row['doctor_samples_per_s']:.0f}/s in "
          f"{doctor_s:.0f} s; sweep best {row['best_config']} {row['best_samples_per_s'] or 0:.0f}"
          f"/s in {sweep_s:.0f} s: {row['doctor_over_best'] or 0:.3f} of the best, "
          f"{row['time_share']:.2f} of the time ({row['time_share_of_full_grid']:.2f} of the "
          f"{grid}-point grid of the doctor's axes, extrapolated); raced side by side: "
          f"{row['doctor_over_best_raced'] or 0:.3f}", flush=True)
    return row


def markdown(rows: list[dict[str, Any]], reports: dict[str, Any], source: str,
             runs: list[dict[str, Any]] | None = None) -> str:
    """Returns the run as Markdown: the planted table, each real model's line, their reports;
    ``runs`` (a merged file's ``meta["runs"]``: part, measured_at, note) listed under the
    source."""
    lines = ["# The doctor checked", "", source, ""]
    for run in runs or []:
        note = f": {run['note']}" if run.get("note") else ""
        lines.append(f"- {run['part']}, measured at {run['measured_at']}{note}")
    lines += [""] if runs else []
    lines += ["## Planted problems", "",
             "| workload | problem | expected | first finding | hit | s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["part"] == "planted":
            lines.append(f"| {r['workload']} | {r.get('problem', '')} | {r['expected']} | "
                         f"{r.get('first_title') or r.get('error')} | {r['hit']} | "
                         f"{r.get('seconds', 0):.0f} |")
    lines += ["", "## Real models against a sweep", ""]
    for r in rows:
        if r["part"] == "real" and "error" not in r:
            lines.append(f"- **{r['workload']}** (batch {r['batch']}): doctor "
                         f"{r['doctor_config']} {r['doctor_samples_per_s']:,.0f}/s in "
                         f"{r['doctor_s']:.0f} s; sweep best {r['best_config']} "
                         f"{r['best_samples_per_s']:,.0f}/s in {r['sweep_s']:.0f} s "
                         f"({len(r['points'])} points): {r['doctor_over_best']:.2f} of the best; raced "
                         f"side by side {r.get('doctor_over_best_raced') or 0:.2f}")
    for name, report in reports.items():
        if not name.startswith("planted-"):
            md = DoctorReport.from_dict(report).to_markdown().splitlines()
            lines += [""] + ["#" + line if line.startswith("#") else line for line in md]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argument_parser("doctor", __doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny planted workloads on the CPU")
    ap.add_argument("--only", default=list(PARTS),
                    type=validate.argument(validate.choice, PARTS, many=True),
                    help=f"parts, comma-separated: {','.join(PARTS)}")
    ap.add_argument("--planted", default=list(PLANTED),
                    type=validate.argument(validate.choice, list(PLANTED), many=True),
                    help="planted workloads, comma-separated")
    ap.add_argument("--real", default=[m for m, _ in REAL],
                    type=validate.argument(validate.choice, [m for m, _ in REAL], many=True),
                    help="real workloads, comma-separated")
    ap.add_argument("--budget-s", type=validate.argument(validate.number, low=0, low_open=True),
                    default=None, help="start no new run after this many seconds")
    ap.add_argument("--doctor-budget-s", default=300.0,
                    type=validate.argument(validate.number, low=0, low_open=True),
                    help="each doctor run's budget (default 300)")
    ap.add_argument("--loss-steps", default=12, type=validate.argument(validate.count, low=3),
                    help="steps whose losses are compared with fp32's, for the doctor and the "
                         "sweep alike (default 12)")
    add_output_arguments(ap, "doctor_h200 on a GPU, doctor_quick on a CPU")
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.quick
    device = "cuda" if gpu else "cpu"
    tiny = not gpu
    parts = list(args.only) if gpu else ["planted"]
    name = args.name or ("doctor_h200" if gpu else "doctor_quick")
    out = output_folder(args)
    rows: list[dict[str, Any]] = []
    reports: dict[str, Any] = {}
    t0 = time.perf_counter()

    def write() -> None:
        path = measure.write_result(name, rows, meta={"part": parts, "reports": reports,
                                                      "device_kind": device}, data_dir=out)
        source = measure.describe_source(measure.read_result(path)["meta"], with_file=False)
        path.with_suffix(".md").write_text(markdown(rows, reports, source))

    if "planted" in parts:
        rows += run_planted(list(args.planted), device, tiny, args.doctor_budget_s, reports)
        write()
    if "real" in parts:
        for m, batch in REAL:
            if m not in args.real:
                continue
            if args.budget_s is not None and time.perf_counter() - t0 > args.budget_s:
                print(f"budget spent: {m} not run")
                continue
            if missing_package(m):
                print(f"{m}: {missing_package(m)}")
                continue
            try:
                rows.append(run_real(m, batch, device, tiny, args.doctor_budget_s, reports,
                                     args.loss_steps))
            except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end
                print(f"{m}: {type(e).__name__}: {e}")
                rows.append({"part": "real", "workload": m, "error": f"{type(e).__name__}: {e}"})
            write()
    write()
    hits = [r for r in rows if r["part"] == "planted" and r["shows_here"]]
    if hits:
        print(f"planted: first finding right in {sum(r['hit'] for r in hits)} of {len(hits)} "
              f"whose problem shows on {device}")
    print(f"wrote {out / (name + '.json')} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checking claims: the twelve in order, each run here or judged from the figures recorded on a GPU."""

from __future__ import annotations

import re
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from .. import device, validate  # the module, not its names: tests replace its functions
from ..measure import data_dir as committed_dir, describe_source, local_dir, read_result
from . import autocast, gemm, scaling, training
from .core import RECORDED_GPU_RESULT, UNTESTABLE, Claim, Figures, Judgement


#: The twelve claims, in notebook 05's order.
CLAIMS: tuple[Claim, ...] = (gemm.CLAIM_1, training.CLAIM_2, training.CLAIM_3, training.CLAIM_4,
                             training.CLAIM_5, scaling.CLAIM_6, autocast.CLAIM_7, autocast.CLAIM_8,
                             scaling.CLAIM_9, autocast.CLAIM_10, gemm.CLAIM_11, training.CLAIM_12)


def get_claim(claim_id: int) -> Claim:
    """Returns the unchecked claim with this number."""
    validate.count("claim_id", claim_id)
    for c in CLAIMS:
        if c.id == claim_id:
            return c
    raise ValueError(f"no claim {claim_id!r}; claims are numbered 1-{len(CLAIMS)}")


def device_slug(gpu_name: str | None) -> str:
    """Returns a short file-name slug for a device: ``NVIDIA H200`` -> ``h200``, None -> ``cpu``."""
    if gpu_name is None or gpu_name == "":
        return "cpu"
    s = re.sub(r"^nvidia\s+", "", validate.text("gpu_name", gpu_name).strip().lower())
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "gpu"


def recorded_gpu_result(data_dir: Path | None = None) -> dict[str, Any] | None:
    """Returns the recorded GPU claims run (``claims_h200`` first, else any GPU one), or None.

    Without ``data_dir``, this machine's results folder is searched before the committed one;
    a ``data_dir`` given must be a folder that exists.
    """
    folders = ([validate.existing_dir("data_dir", data_dir)] if data_dir is not None
               else [local_dir(), committed_dir()])
    candidates = [f / f"{RECORDED_GPU_RESULT}.json" for f in folders]
    for f in folders:
        candidates += sorted(p for p in f.glob("claims_*.json") if p not in candidates)
    for p in candidates:
        if p.exists():
            payload = read_result(p, rows_need=("id",))
            if payload["meta"].get("gpu_name"):
                return payload
    return None


def row_measured_at(row: dict[str, Any], meta: dict[str, Any]) -> str:
    """Returns when a claims file's row was measured: its own ``measured_at``, else (a file
    written before rows carried one) the file's ``meta["measured_at"]``."""
    return row.get("measured_at") or meta.get("measured_at") or ""


def _judge_recorded(c: Claim, figures: Figures) -> Judgement:
    """Returns the rule's verdict on recorded figures, or says they do not fit the rule."""
    try:
        return c.judge(figures)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        return UNTESTABLE, (f"the recorded figures do not fit this rule ({type(e).__name__}: {e}); "
                            f"re-run `fp16lab bench claims` on the GPU")


def _check_run(quick: Any, data_dir: Any) -> None:
    """Raises unless ``quick`` is None, True or False and ``data_dir`` None or a folder."""
    if quick is not None:
        validate.boolean("quick", quick)
    if data_dir is not None:
        validate.existing_dir("data_dir", data_dir)


def check(claim: int | Claim, *, quick: bool | None = None, data_dir: Path | None = None,
          recorded: dict[str, Any] | None = None) -> Claim:
    """Returns the claim checked: its figures, verdict, reason and source filled in.

    The experiment runs here unless the claim needs a GPU and there is none; then the figures
    recorded on a GPU (``data/claims_h200.json``) are judged by the same rule. An experiment that
    raises gives ``cannot be tested here`` with the error, so one broken tool does not stop a run.

    Args:
        claim: the claim or its number.
        quick: small sizes (default: quick on a CPU, full on a GPU).
        data_dir: where to look for the recorded GPU run (default ``data/``).
        recorded: an already loaded recorded run (saves re-reading it for every claim).
    """
    c = get_claim(claim) if isinstance(claim, int) else claim
    _check_run(quick, data_dir)
    gpu = device.has_gpu()
    quick = (not gpu) if quick is None else quick
    if c.needs_gpu and not gpu:
        rec = recorded if recorded is not None else recorded_gpu_result(data_dir)
        row = next((r for r in (rec or {}).get("rows", []) if r.get("id") == c.id), None)
        if row is None or not row.get("figures") or "error" in row["figures"]:
            return replace(c, verdict=UNTESTABLE, source="not measured",
                           reason="no GPU here and no recorded GPU result for it in data/ "
                                  "(run `fp16lab bench claims` on a GPU)")
        verdict, reason = _judge_recorded(c, row["figures"])
        at = row_measured_at(row, rec["meta"])
        return replace(c, figures=row["figures"], verdict=verdict, reason=reason,
                       source="recorded on another machine: "
                              + describe_source({**rec["meta"], "measured_at": at}),
                       measured_at=at)
    t0 = time.perf_counter()
    try:
        figures = c.experiment(quick)
    except Exception as e:
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        meta = device.metadata()
        return replace(c, figures={"error": detail}, verdict=UNTESTABLE,
                       reason=f"the experiment failed here: {detail}",
                       source="here: " + describe_source(meta), measured_at=meta["measured_at"])
    figures["elapsed_s"] = round(time.perf_counter() - t0, 3)
    verdict, reason = c.judge(figures)
    meta = device.metadata()
    return replace(c, figures=figures, verdict=verdict, reason=reason,
                   source="here: " + describe_source(meta), measured_at=meta["measured_at"])


def check_all(ids: Iterable[int] | None = None, *, quick: bool | None = None,
              data_dir: Path | None = None, progress: bool = False) -> list[Claim]:
    """Returns every claim (or those in ``ids``) checked, in order."""
    chosen = [get_claim(i) for i in ids] if ids is not None else list(CLAIMS)
    _check_run(quick, data_dir)
    validate.boolean("progress", progress)
    rec = recorded_gpu_result(data_dir)
    out = []
    for c in chosen:
        if progress:
            print(f"claim {c.id}: {c.short} ...", file=sys.stderr, flush=True)
        out.append(check(c, quick=quick, data_dir=data_dir, recorded=rec or {}))
    return out

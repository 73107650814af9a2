"""Reporting checked claims: the verdict table (DataFrame, markdown) and the claims_<device> files."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from .. import device, validate  # the module, not its names: tests replace its functions
from ..measure import check_can_write, describe_source, local_dir, read_result, write_result
from .core import VERDICTS, Claim
from .run import _judge_recorded, device_slug, get_claim, recorded_gpu_result, row_measured_at


def verdict_table(claims: Iterable[Claim]):
    """Returns the verdict table as a pandas DataFrame (one row per claim)."""
    import pandas as pd

    return pd.DataFrame([{"#": c.id, "claim": c.short, "verdict": c.verdict,
                          "measured": c.reason, "rule": c.rule, "source": c.source}
                         for c in claims]).set_index("#")


def recorded_claims(data_dir: Path | None = None) -> list[Claim]:
    """Returns the claims of the recorded GPU run, verdicts recomputed from its figures by the
    rules (an empty list when there is no recorded run)."""
    rec = recorded_gpu_result(data_dir)
    if rec is None:
        return []
    out = []
    for row in rec["rows"]:
        c = get_claim(row["id"])
        f = row.get("figures") or {}
        at = row_measured_at(row, rec["meta"])
        source = "recorded on another machine: " + describe_source({**rec["meta"], "measured_at": at})
        if not f or "error" in f:
            out.append(replace(c, figures=f, verdict=row.get("verdict"),
                               reason=row.get("reason", ""), source=source, measured_at=at))
        else:
            verdict, reason = _judge_recorded(c, f)
            out.append(replace(c, figures=f, verdict=verdict, reason=reason, source=source,
                               measured_at=at))
    return out


def _ranges(ids: list[int]) -> str:
    """Returns claim numbers as ranges: [1, 6, 7, 8] -> '1, 6-8'."""
    out: list[str] = []
    for i in sorted(ids):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = out[-1].split("-")[0] + f"-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def recorded_summary(data_dir: Path | None = None) -> str:
    """Returns where the recorded GPU run was measured, and when each of its claims was (claims
    kept from an earlier run carry that run's date), as a few lines; or says there is none."""
    rec = recorded_gpu_result(data_dir)
    if rec is None:
        return "recorded GPU run: none in data/"
    dates: dict[str, list[int]] = {}
    for row in rec["rows"]:
        dates.setdefault(row_measured_at(row, rec["meta"]), []).append(row["id"])
    lines = ["recorded GPU run: " + _AT.sub("", describe_source(rec["meta"]))]
    for at, ids in sorted(dates.items()):
        lines.append(f"  claim{'s' if len(ids) > 1 else ''} {_ranges(ids)} measured at {at}")
    return "\n".join(lines)


def recorded_table(data_dir: Path | None = None):
    """Returns the verdict table of the recorded GPU run as a DataFrame, or None without one."""
    checked = recorded_claims(data_dir)
    return verdict_table(checked) if checked else None


def _cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


_AT = re.compile(r" at \d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:\d\d|Z)?")


def _when(c: Claim) -> str:
    """Returns the claim's measurement time as ``YYYY-MM-DD HH:MM UTC`` (or as recorded)."""
    at = c.measured_at or next(iter(_AT.findall(c.source)), "")[4:]
    m = re.match(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d)[\d:.]*(\+00:00|Z)?$", at)
    if m:
        return f"{m[1]} {m[2]}" + (" UTC" if m[3] else "")
    return at or "-"


def markdown_table(claims: Iterable[Claim], *, rules: bool = True,
                   sources: str = "column") -> str:
    """Returns the verdict table in markdown: claim, verdict, measured figures, rule, source.

    ``sources="column"`` gives each row its full source. ``sources="notes"`` (for reading)
    gives each row a short label (``here``, ``recorded on another machine``, ...) and its measurement
    time, and says once, under the table, what each label stands for.
    """
    if sources not in ("column", "notes"):
        raise ValueError(f"sources is 'column' or 'notes', not {sources!r}")
    claims = list(claims)
    tail = ["source"] if sources == "column" else ["source", "measured at"]
    head = ["#", "claim", "verdict", "measured"] + (["rule"] if rules else []) + tail
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    labels: dict[str, str] = {}   # full source without its time -> short label
    for c in claims:
        cells = [c.id, c.text, f"**{c.verdict}**", c.reason] + ([c.rule] if rules else [])
        if sources == "column":
            cells.append(c.source)
        else:
            full = _AT.sub("", c.source)
            if full not in labels:
                base = full.split(":", 1)[0] if ":" in full else full
                taken = sum(v == base or v.startswith(base + " (") for v in labels.values())
                labels[full] = base if not taken else f"{base} ({taken + 1})"
            cells += [labels[full], _when(c)]
        lines.append("| " + " | ".join(_cell(v) for v in cells) + " |")
    out = "\n".join(lines) + "\n"
    notes = [f"- **{label}**: {full.split(':', 1)[1].strip()}"
             for full, label in labels.items() if ":" in full]
    return out + ("\nSources:\n" + "\n".join(notes) + "\n" if notes else "")


def to_markdown(claims: Iterable[Claim], meta: dict[str, Any]) -> str:
    """Returns the verdict table as a markdown document headed by where it was measured."""
    claims = list(claims)
    counts = {v: sum(c.verdict == v for c in claims) for v in VERDICTS}
    return "\n".join([
        "# fp16lab: mixed-precision claims checked", "",
        f"Run {describe_source(meta)}" + (" (quick sizes)" if meta.get("quick") else "") + ".", "",
        markdown_table(claims),
        "Verdicts: " + ", ".join(f"{v}: {n}" for v, n in counts.items() if n) + ".", ""])


def claims_folder(out_dir: Path | None = None) -> Path:
    """Returns the folder the claims files are written to, once it is known they can be.

    ``out_dir`` by default is this machine's results folder (:func:`fp16lab.measure.local_dir`),
    never the committed ``data/``. Checked before any claim runs: it is a folder (or can be made
    one), it can be written, and an earlier claims file in it can be read (it is merged with).

    Raises:
        ValueError: naming the path and what is wrong with it (the folder's own problems as
            :mod:`fp16lab.validate`'s errors, which are OSErrors too).
    """
    folder = validate.output_dir("out_dir", out_dir) if out_dir is not None else local_dir()
    slug = device_slug(device.device_info().gpu_name)
    for f in (folder / f"claims_{slug}.json", folder / f"claims_{slug}.md"):
        check_can_write(f)
    _earlier_claims(folder / f"claims_{slug}.json", set())  # raises when it cannot be read
    return folder


def _earlier_claims(path: Path, checked_now: set[int]) -> list[Claim]:
    """Returns the claims of an earlier claims file that this run did not check ([] without one)."""
    if not path.exists():
        return []
    earlier = read_result(path, rows_need=("id", "verdict"))
    rows = earlier["rows"]
    out = []
    for i, row in enumerate(rows):
        try:
            c = get_claim(row["id"])
        except (TypeError, ValueError) as e:  # a number that names no claim, or no number
            raise ValueError(f"{path}: row {i}: {e}") from None
        if c.id not in checked_now:
            out.append(replace(c, figures=row.get("figures") or {}, verdict=row["verdict"],
                               reason=row.get("reason", ""), source=row.get("source", ""),
                               measured_at=row_measured_at(row, earlier["meta"])))
    return out


def write_claims(claims: Iterable[Claim], out_dir: Path | None = None, *,
                 quick: bool = False, elapsed_s: float | None = None) -> tuple[Path, Path]:
    """Writes ``claims_<device>.md`` and ``claims_<device>.json`` and returns their paths.

    They go to :func:`claims_folder` (by default this machine's results folder). Claims this
    run did not check keep what an earlier file there measured (figures, verdict, reason and
    source), described by the claim as it is written now, so ``--only 3`` replaces claim 3 and
    keeps the other eleven; ``meta["checked_now"]`` lists the claims of this run.

    Every row carries its own ``measured_at``: the claims of this run get the run's time (the
    file's ``meta["measured_at"]``); a kept claim keeps its row's time, or, where that earlier
    row has none, the earlier file's ``meta["measured_at"]``.
    """
    claims = list(claims)
    folder = claims_folder(out_dir)
    name = f"claims_{device_slug(device.device_info().gpu_name)}"
    run_at = device.metadata()["measured_at"]
    now = {c.id for c in claims}
    merged = sorted([replace(c, measured_at=run_at) for c in claims]
                    + _earlier_claims(folder / f"{name}.json", now), key=lambda c: c.id)
    json_path = write_result(name, [c.as_row() for c in merged],
                             meta={"measured_at": run_at, "quick": quick, "elapsed_s": elapsed_s,
                                   "checked_now": sorted(now),
                                   "verdicts": {c.id: c.verdict for c in merged}},
                             data_dir=folder)
    md_path = folder / f"{name}.md"
    md_tmp = md_path.with_name(f".{md_path.name}.tmp")
    md_tmp.write_text(to_markdown(merged, read_result(json_path)["meta"]))
    md_tmp.replace(md_path)
    return md_path, json_path

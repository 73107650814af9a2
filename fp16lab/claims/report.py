"""Reporting checked claims: the verdict table (DataFrame, markdown) and the claims_<device> files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from .run import device_slug, get_claim, recorded_gpu_result, _judge_recorded
from .core import VERDICTS, Claim


def verdict_table(claims: Iterable[Claim]):
    """Returns the verdict table as a pandas DataFrame (one row per claim)."""
    import pandas as pd

    return pd.DataFrame([{"#": c.id, "claim": c.short, "verdict": c.verdict,
                          "measured": c.reason, "rule": c.rule, "source": c.source}
                         for c in claims]).set_index("#")


def recorded_claims(data_dir: Path | None = None) -> list[Claim]:
    """Returns the claims of the recorded GPU run, verdicts recomputed from its figures by the
    rules (an empty list when there is no recorded run)."""
    from ..bench import describe_source

    rec = recorded_gpu_result(data_dir)
    if rec is None:
        return []
    source = "recorded elsewhere: " + describe_source(rec["meta"])
    out = []
    for row in rec["rows"]:
        c = get_claim(row["id"])
        f = row.get("figures") or {}
        if not f or "error" in f:
            out.append(replace(c, figures=f, verdict=row.get("verdict"),
                               reason=row.get("reason", ""), source=source))
        else:
            verdict, reason = _judge_recorded(c, f)
            out.append(replace(c, figures=f, verdict=verdict, reason=reason, source=source))
    return out


def recorded_table(data_dir: Path | None = None):
    """Returns the verdict table of the recorded GPU run as a DataFrame, or None without one."""
    checked = recorded_claims(data_dir)
    return verdict_table(checked) if checked else None


def _cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def markdown_table(claims: Iterable[Claim], *, rules: bool = True) -> str:
    """Returns the verdict table in markdown: claim, verdict, measured figures, rule, source."""
    head = ["#", "claim", "verdict", "measured"] + (["rule"] if rules else []) + ["source"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in claims:
        cells = [c.id, c.text, f"**{c.verdict}**", c.reason] + ([c.rule] if rules else [])
        lines.append("| " + " | ".join(_cell(v) for v in cells + [c.source]) + " |")
    return "\n".join(lines) + "\n"


def to_markdown(claims: Iterable[Claim], meta: dict[str, Any]) -> str:
    """Returns the verdict table as a markdown document headed by where it was measured."""
    from ..bench import describe_source

    claims = list(claims)
    counts = {v: sum(c.verdict == v for c in claims) for v in VERDICTS}
    return "\n".join([
        "# fp16lab: mixed-precision claims checked", "",
        f"Run {describe_source(meta)}" + (" (quick sizes)" if meta.get("quick") else "") + ".", "",
        markdown_table(claims),
        "Verdicts: " + ", ".join(f"{v}: {n}" for v, n in counts.items() if n) + ".", ""])


def write_claims(claims: Iterable[Claim], out_dir: Path | None = None, *,
                 quick: bool = False, elapsed_s: float | None = None) -> tuple[Path, Path]:
    """Writes ``claims_<device>.md`` and ``claims_<device>.json`` and returns their paths.

    They go to ``out_dir``, by default this machine's results folder (:func:`fp16lab.bench.local_dir`).
    """
    from ..bench import local_dir, read_result, write_result
    from ..device import device_info

    claims = list(claims)
    slug = device_slug(device_info().gpu_name)
    folder = Path(out_dir) if out_dir is not None else local_dir()
    json_path = write_result(f"claims_{slug}", [c.as_row() for c in claims],
                             meta={"quick": quick, "elapsed_s": elapsed_s,
                                   "verdicts": {c.id: c.verdict for c in claims}},
                             data_dir=folder)
    md_path = folder / f"claims_{slug}.md"
    md_path.write_text(to_markdown(claims, read_result(json_path)["meta"]))
    return md_path, json_path

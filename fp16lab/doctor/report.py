"""What the doctor says: findings, ranked, and the report file that holds them.

A :class:`Finding` is one thing the doctor measured that matters: its ``evidence`` (numbers),
the ``change`` it recommends (a :class:`~fp16lab.doctor.probe.Config` field), and where that
change was applied and re-measured, ``gain`` (samples/s after over before). Findings rank in
groups: what breaks training in the starting configuration first (a located cause, FP16's
range or a sensitive module, before the precision finding that shows it); then every measured
gain, the largest first, whether the change keeps the training's maths (precision, layout,
padding, optimizer kernels, compile, the input pipeline) or alters it (the batch size, which
asks for another learning rate: :data:`GROUPS` says which); then notes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import validate
from .probe import LOSS_TOLERANCE, Config, Measurement

#: The kinds of finding, in the order the checks run.
KINDS = ("range", "sensitive", "precision", "layout", "shapes", "time", "input", "batch",
         "multi-gpu")

#: The ranking groups: training broken, a gain that keeps the maths, one that changes it, a note.
GROUPS = ("breaks", "keeps", "changes", "note")


@dataclass
class Finding:
    """One finding: what was measured, what to change, and what the change bought."""

    kind: str
    title: str
    group: str
    evidence: dict[str, Any] = field(default_factory=dict)
    change: dict[str, Any] = field(default_factory=dict)
    gain: float | None = None
    verified: bool = False
    advice: str = ""
    table: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        validate.choice("kind", self.kind, KINDS)
        validate.choice("group", self.group, GROUPS)

    def rank_key(self) -> tuple[int, int, float]:
        """What breaks first, in the kinds' order (a located cause, range or a sensitive
        module, before the precision that shows it); then every measured gain, largest first;
        then the notes."""
        gain = self.gain if self.gain is not None and math.isfinite(self.gain) else 1.0
        if self.group == "breaks":
            return 0, KINDS.index(self.kind), -gain
        return (2, 0, -gain) if self.group == "note" else (1, 0, -gain)

    def evidence_lines(self) -> list[str]:
        """Returns the evidence as ``"what: value"`` lines, numbers rounded for reading."""
        return [f"{k}: {_shown(v)}" for k, v in self.evidence.items()]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "title": self.title, "group": self.group,
                "evidence": self.evidence, "change": self.change, "gain": self.gain,
                "verified": self.verified, "advice": self.advice, "table": self.table}


def rank(findings: list[Finding]) -> list[Finding]:
    """Returns the findings in the order the report gives them (see the module's docstring);
    the sort is stable, so within a group of equal gains the checks' order stays."""
    return sorted(findings, key=Finding.rank_key)


@dataclass
class DoctorReport:
    """What :func:`fp16lab.doctor.doctor` returns; ``report`` shows as Markdown in a notebook."""

    workload: str
    device: str
    versions: dict[str, Any]
    start: Config
    batch_size: int
    findings: list[Finding]
    unchecked: dict[str, str]
    measurements: list[Measurement]
    combined: Measurement | None
    baseline: Measurement | None
    seconds: float
    budget_s: float
    #: where the run's time went: per part (the baseline, each check run, the combination),
    #: its wall-clock seconds and, of them, the seconds spent in the probe's measurements
    part_seconds: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def combined_gain(self) -> float | None:
        if self.combined is None or self.baseline is None or not (self.combined.ran and
                                                                  self.baseline.ran):
            return None
        return self.combined.samples_per_s / self.baseline.samples_per_s

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "device": self.device, "versions": self.versions,
                "start": self.start.as_dict(), "batch_size": self.batch_size,
                "loss_tolerance": LOSS_TOLERANCE,
                "findings": [f.as_dict() for f in self.findings], "unchecked": self.unchecked,
                "measurements": [m.row() for m in self.measurements],
                "baseline": self.baseline.row() if self.baseline else None,
                "combined": self.combined.row() if self.combined else None,
                "combined_config": self.combined.config.as_dict() if self.combined else None,
                "combined_gain": self.combined_gain, "seconds": self.seconds,
                "budget_s": self.budget_s, "part_seconds": self.part_seconds}

    def to_markdown(self, plots: dict[str, str] | None = None) -> str:
        """Returns the report as Markdown (with ``plots``: image names to link, by title)."""
        lines = [f"# Mixed-precision doctor: {self.workload}", "",
                 f"Measured on {self.device} ({_versions(self.versions)}); starting from "
                 f"{self.start.describe()}, batch {self.batch_size}; {self.seconds:.0f} s of a "
                 f"{self.budget_s:.0f} s budget.", ""]
        if self.combined_gain is not None:
            lines += [f"**All recommended changes together** ({self.combined.config.describe()}): "
                      f"{self.combined.samples_per_s:,.0f} samples/s against "
                      f"{self.baseline.samples_per_s:,.0f}, **{self.combined_gain:.2f}x**.", ""]
        if not self.findings:
            lines += ["No finding: nothing the doctor checks would change this step.", ""]
        for i, f in enumerate(self.findings, 1):
            gain = f"; measured gain {f.gain:.2f}x" if f.gain is not None else ""
            checked = "" if f.verified or not f.change else " (not re-measured)"
            lines += [f"## {i}. {f.title}", "", f"*{f.kind}, {_GROUP_WORDS[f.group]}{gain}"
                      f"{checked}*", ""]
            if f.advice:
                lines += [f.advice, ""]
            if f.evidence:
                lines += ["| evidence | value |", "| --- | --- |"]
                lines += [f"| {k} | {_shown(v)} |" for k, v in f.evidence.items()]
                lines.append("")
            if f.table:
                lines += _table(f.table[:12])
        if self.unchecked:
            lines += ["## Not checked", ""]
            lines += [f"- **{k}**: {why}" for k, why in self.unchecked.items()]
            lines.append("")
        if self.part_seconds:
            lines += ["## Where the time went", "",
                      "Per part of the run: its seconds, and of them the seconds of the "
                      "measurements it made (each a fresh model trained a few steps); the rest "
                      "is the check's own work.", ""]
            lines += _table([{"part": k, "seconds": v["s"], "measuring": v["measuring_s"]}
                             for k, v in self.part_seconds.items()])
        lines += ["## Every measurement", "",
                  f"Each: a fresh model, the losses of the first steps on one batch, then the "
                  f"median of the timed steps after them. Loss within tolerance: the last loss "
                  f"within {LOSS_TOLERANCE:.0%} of fp32's first loss from fp32's last.", ""]
        lines += _table([m.row() for m in self.measurements])
        for title, name in (plots or {}).items():
            lines += [f"![{title}]({name})", ""]
        return "\n".join(lines)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DoctorReport":
        """Returns the report :meth:`as_dict` gave (a recorded one, read from its JSON)."""
        def config(c: dict[str, Any]) -> Config:
            c = dict(c)
            c["fp32_modules"] = tuple(c.get("fp32_modules") or ())
            c["settings"] = tuple(sorted((c.get("settings") or {}).items()))
            return Config(**c)

        def measurement(row: dict[str, Any] | None, conf: Config | None = None):
            if row is None:
                return None
            m = Measurement(conf or Config(), row["batch_size"], _float(row["step_ms"]),
                            _float(row["samples_per_s"]), row.get("peak_bytes"),
                            [v for v in (row.get("first_loss"), row.get("last_loss"))
                             if v is not None], row.get("final_scale"), row.get("error"),
                            row.get("seconds", 0.0), row.get("raced", False))
            m.label = row["config"]
            return m

        start = config(d["start"])
        combined = measurement(d.get("combined"), config(d["combined_config"])
                               if d.get("combined_config") else None)
        return cls(d["workload"], d["device"], d["versions"], start, d["batch_size"],
                   [Finding(**f) for f in d["findings"]], d["unchecked"],
                   [measurement(r) for r in d["measurements"]], combined,
                   measurement(d.get("baseline"), start), d["seconds"], d["budget_s"],
                   part_seconds=d.get("part_seconds") or {})

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def write(self, out_dir: str | Path, name: str | None = None) -> list[Path]:
        """Writes ``NAME.md``, ``NAME.json`` and ``NAME_speed.png`` under ``out_dir`` and
        returns their paths (``NAME``: ``doctor_<workload>`` by default)."""
        from .plots import plot_speed  # local: matplotlib loads only when a report is written

        out = validate.output_dir("out_dir", out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = name or "doctor_" + "".join(c if c.isalnum() or c in "-_" else "_"
                                           for c in self.workload)
        png = out / f"{stem}_speed.png"
        fig = plot_speed(self)
        fig.savefig(png, dpi=110, bbox_inches="tight")
        import matplotlib.pyplot as plt
        plt.close(fig)
        md = out / f"{stem}.md"
        md.write_text(self.to_markdown({"samples/s of each measured configuration": png.name}))
        js = out / f"{stem}.json"
        js.write_text(json.dumps(_plain(self.as_dict()), indent=1, default=_jsonable,
                                 allow_nan=False))
        return [md, js, png]


_GROUP_WORDS = {"breaks": "breaks training in the starting configuration",
                "keeps": "a change that keeps the training's maths",
                "changes": "a change that alters the training (retune the learning rate)",
                "note": "a note"}


def _versions(v: dict[str, Any]) -> str:
    return ", ".join(f"{k} {val}" for k, val in v.items() if val)


def _shown(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.3g}" if abs(v) < 1e3 else f"{v:,.0f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(_shown, v))
    return str(v)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    out += ["| " + " | ".join(_shown(r.get(c)) for c in cols) + " |" for r in rows]
    return out + [""]


def _float(v: Any) -> float:
    return math.nan if v is None or isinstance(v, str) else float(v)


def _plain(x: Any) -> Any:
    """Returns ``x`` with every non-finite float as its name (JSON has no NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)

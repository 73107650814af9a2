"""What a claim is (:class:`Claim`), the five verdicts, and the small helpers every experiment shares.

Every :class:`Claim` carries the claim as it circulates, the experiment that tests it, and the
verdict rule in one sentence. :func:`check` runs the experiment on this machine (or, for a claim
that needs a GPU when there is none, loads the figures recorded on a GPU from ``data/``) and
applies the rule, a pure function of the measured figures, so the verdict is computed, never
typed in. The verdicts are:

- ``holds``: the measurement agrees with the claim;
- ``holds in part``: it agrees only under a condition the reason names;
- ``does not hold``: the measurement contradicts it;
- ``cannot be tested here``: no GPU and no recorded GPU result (or a tool was missing);
- ``names something that does not exist``: the setting or knob the claim relies on is not
  there; the reason says what really governs the effect.

``fp16lab claims`` runs all twelve headless and writes ``claims_<device>.md`` and
``claims_<device>.json`` (figures, verdicts and provenance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..measure import time_cpu, time_cuda


HOLDS = "holds"
PARTLY = "holds in part"
FAILS = "does not hold"
UNTESTABLE = "cannot be tested here"
NONEXISTENT = "names something that does not exist"
#: The verdicts a claim can get.
VERDICTS = (HOLDS, PARTLY, FAILS, UNTESTABLE, NONEXISTENT)

#: A figure counts as "clearly better" when it beats the other by this factor.
MATERIAL_GAIN = 1.10

#: How the reason of a verdict of UNTESTABLE starts when the experiment ran but this machine's
#: timing noise was too large for the rule to decide (not a failed experiment).
TOO_NOISY = "too noisy here"


#: The recorded GPU run that machines without a GPU show for the GPU-only claims.
RECORDED_GPU_RESULT = "claims_h200"

Figures = dict[str, Any]
Judgement = tuple[str, str]


@dataclass(frozen=True)
class Claim:
    """One claim: what it says, how it is tested, the rule, and (once checked) the outcome.

    Attributes:
        id: the claim's number (1-12, as in notebook 05).
        short: a few words for the table.
        text: the claim as it commonly circulates.
        origin: the practice it paraphrases, in words (which kind of guide says it, and how).
        rule: the verdict rule, in one sentence.
        experiment: ``experiment(quick) -> figures``, run on this machine.
        judge: ``judge(figures) -> (verdict, reason)``, a pure function of the figures.
        needs_gpu: True when the experiment means nothing without a CUDA GPU.
        figures: the measured figures (empty until checked).
        verdict: one of ``VERDICTS`` (None until checked).
        reason: the measured figures that decided the verdict, in words.
        source: where the figures were measured (here, or recorded on which GPU).
        measured_at: when this claim's figures were measured (ISO time; empty until written to
            or read from a claims file, whose rows each carry their own).
    """

    id: int
    short: str
    text: str
    rule: str
    experiment: Callable[[bool], Figures] = field(repr=False)
    judge: Callable[[Figures], Judgement] = field(repr=False)
    needs_gpu: bool = False
    origin: str = ""
    figures: Figures = field(default_factory=dict)
    verdict: str | None = None
    reason: str = ""
    source: str = ""
    measured_at: str = ""

    def report(self) -> str:
        """Returns the claim, where it comes from, the rule, the verdict with the figures that decided
        it (in words, rounded) and any notes the experiment wrote, as a few lines of text."""
        lines = [f"Claim {self.id}: {self.text}", f"where it comes from: {self.origin}",
                 f"rule: {self.rule}"]
        if self.figures:  # the reason gives the deciding figures in words; the rest: .figures
            notes = [note.strip() for note in _brief(self.figures).split("\n")[1:]]
            # a note the verdict already quotes is not said twice
            lines += [n for n in notes if n.partition(": ")[2] not in (self.reason or "")]
        lines.append(f"verdict: {(self.verdict or 'not checked').upper()}: {self.reason}")
        if self.source:
            lines.append(f"source: {self.source}")
        return "\n".join(lines)

    def as_row(self) -> dict[str, Any]:
        """Returns the claim and its outcome as a JSON-friendly dict (a row of the result file)."""
        return {"id": self.id, "short": self.short, "text": self.text, "origin": self.origin,
                "rule": self.rule,
                "needs_gpu": self.needs_gpu, "verdict": self.verdict, "reason": self.reason,
                "source": self.source, "measured_at": self.measured_at, "figures": self.figures}


def _torch():
    import torch
    return torch


#: When True, every experiment uses tiny sizes and runs its GPU code paths on the CPU too.
#: Only for exercising that code without a GPU (tests); the figures then mean nothing.
EXERCISE_ON_CPU = False


def _device() -> str:
    return "cuda" if _torch().cuda.is_available() else "cpu"


def _sizes(quick: bool, full: Any, small: Any, tiny: Any) -> Any:
    """Returns the size set for this run: full, quick, or tiny (when exercising on a CPU)."""
    return tiny if EXERCISE_ON_CPU else (small if quick else full)


def _timer(device: str) -> Callable[..., Any]:
    return time_cuda if device == "cuda" else time_cpu


def _number(v: float) -> str:
    """Returns a float for a reader: 4 significant digits below 10, one decimal up to 10,000."""
    if math.isfinite(v) and 10 <= abs(v) < 1e4:
        return f"{v:.1f}"
    return f"{v:.4g}"


#: A string figure longer than this is a note: printed once, on its own line, not in the list.
_NOTE_CHARS = 40


def _brief(figures: Figures, limit: int = 600) -> str:
    """Returns the scalar figures as ``key=value`` pairs (lists and dicts are left to the file).

    Floats are rounded for reading (:func:`_number`). A long string (a note) goes on a line of
    its own after the pairs, once for all the keys that hold the same text: ``fp32_gpm_note`` and
    ``amp-fp16_gpm_note`` with one text read ``gpm_note (fp32, amp-fp16): <text>``.
    """
    parts: list[str] = []
    notes: dict[str, list[str]] = {}
    for k, v in figures.items():
        if isinstance(v, bool) or v is None or isinstance(v, int):
            parts.append(f"{k}={v}")
        elif isinstance(v, float):
            parts.append(f"{k}={_number(v)}")
        elif isinstance(v, str) and len(v) > _NOTE_CHARS:
            notes.setdefault(v, []).append(k)
        elif isinstance(v, str):
            parts.append(f"{k}={v}")
    s = ", ".join(parts)
    s = s if len(s) <= limit else s[:limit] + " ..."
    for text, keys in notes.items():
        s += f"\n  {_note_label(keys)}: {text}"
    return s


def _note_label(keys: list[str]) -> str:
    """Returns ``suffix (prefix, prefix)`` for keys ``prefix_suffix`` sharing a suffix, else the
    keys joined by commas."""
    if len(keys) > 1 and all("_" in k for k in keys):
        suffix = keys[0].split("_", 1)[1]
        if all(k.endswith("_" + suffix) for k in keys):
            return f"{suffix} ({', '.join(k[:-len(suffix) - 1] for k in keys)})"
    return ", ".join(keys)


def verdict_of_parts(parts: dict[str, bool], facts: str) -> Judgement:
    """Returns the verdict on a claim of several parts: holds when every part held, holds in part
    (naming the parts that held) when some did, does not hold when none did."""
    held = [name for name, ok in parts.items() if ok]
    if len(held) == len(parts):
        return HOLDS, facts
    if held:
        return PARTLY, f"only the {' and '.join(held)} part. {facts}"
    return FAILS, facts


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.inf


def _outcome(fn: Callable[[], Any]) -> str:
    """Returns the dtype of ``fn()``'s result, or ``error: <type>: <message>`` if it raised."""
    try:
        return str(fn().dtype)
    except Exception as e:  # the point is to record what torch does, errors included
        msg = str(e).splitlines()[0] if str(e) else ""
        return f"error: {type(e).__name__}: {msg[:160]}"


def _autocast_dtype(device: str):
    """Returns float16 where autocast supports it on ``device``, else bfloat16."""
    torch = _torch()
    try:
        with torch.autocast(device, dtype=torch.float16):
            y = torch.nn.functional.linear(torch.ones(1, 2, device=device),
                                           torch.ones(2, 2, device=device))
        return torch.float16 if y.dtype == torch.float16 else torch.bfloat16
    except Exception:
        return torch.bfloat16


def saved_activation_bytes(model, x, *, autocast_dtype=None) -> int:
    """Returns the bytes autograd saves for backward in one forward pass of ``model(x)``.

    Each storage is counted once, and the model's own parameters are left out (they exist
    whatever the precision); fp16/bf16 copies of weights made by autocast are counted, since
    they are extra memory. This is the activation memory a precision choice changes, measured
    the same way on a CPU and on a GPU.
    """
    torch = _torch()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    device = x.device.type
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(device, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            model(x)
    return sum(seen.values())

"""The arithmetic of a mutation run: a mutant's identity across runs, the equivalents file, the score.

A mutant is named by mutmut after its function and a number that changes whenever the module
does; what identifies it across runs is its function and its changed lines
(:func:`function_of`, :func:`changed_lines`). ``tests/mutation_equivalent.toml`` records, by that
identity, the mutants that change no behaviour and why (:func:`load_equivalents`). The score of a
module is caught / (caught + missed), equivalents left out (:func:`summarize`).
:mod:`fp16lab.testing.mutation` runs mutmut and writes the report with these.
"""

from __future__ import annotations

import pathlib
import tomllib


def changed_lines(diff: str) -> str:
    """Returns the changed lines of a diff, stripped: what identifies a mutant across renumbering."""
    return "\n".join(line[0] + line[1:].strip() for line in diff.splitlines()
                     if line[:1] in "+-" and not line.startswith(("+++", "---")))


def function_of(name: str) -> str:
    """Returns the function part of a mutant name (``fp16lab.bits.x_next_up__mutmut_3`` -> ``x_next_up``)."""
    return name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[-1]


def load_equivalents(path: pathlib.Path) -> dict[tuple[str, str, str], str]:
    """Returns {(module, function, changed lines): reason} from the equivalents file."""
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("equivalent", [])
    out = {}
    for e in entries:
        missing = {"module", "function", "change", "reason"} - set(e)
        if missing:
            raise ValueError(f"{path}: an [[equivalent]] entry lacks {sorted(missing)}: {e}")
        out[(e["module"], e["function"], changed_lines(e["change"]))] = e["reason"].strip()
    return out


COLUMNS = ("killed", "survived", "no tests", "timeout", "suspicious", "skipped", "segfault",
           "not checked")


def summarize(statuses: dict[str, str], equivalent: set[str]) -> dict[str, float]:
    """Returns the counts per status, the equivalents and the score for one module.

    Survivors and mutants no test reaches count against the score unless recorded as
    equivalent; timeouts and segfaults count as killed (the tests noticed), as mutmut counts them.
    """
    counts = {c: 0 for c in COLUMNS}
    for name, status in statuses.items():
        if status not in counts:
            raise ValueError(f"mutant {name} has status {status!r}; rerun that module")
        counts[status] += 1
    counts["equivalent"] = len(equivalent)
    caught = counts["killed"] + counts["timeout"] + counts["segfault"]
    missed = counts["survived"] + counts["no tests"] - counts["equivalent"]
    counts["score"] = caught / (caught + missed) if caught + missed else float("nan")
    return counts

"""How long each notebook and each of its sections takes to execute here, measured with nbclient.

Executes the numbered notebooks top to bottom (as the notebook tests do) and records, from the
timing nbclient writes into every cell, the minutes each ``## `` section took, with the errors,
warnings and tracebacks found in the outputs. On a GPU the file is
``notebook_times.json``, on a CPU ``notebook_times_cpu.json`` (data/local/, or data/ with
``--replace``); a run of some notebooks keeps the earlier rows of the others. The notebooks'
openings read both files (:func:`section_summary`) to say how long the notebook and its longer
sections take.

    python -m fp16lab.bench.notebook_times               # every notebook
    python -m fp16lab.bench.notebook_times --only 03,04  # some of them
    python -m fp16lab.bench.notebook_times --workshop    # only rewrite WORKSHOP.md's table
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from fp16lab import measure, validate
from fp16lab.bench import argument_parser

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"


def result_name(gpu: bool) -> str:
    """Returns the result file's stem: ``notebook_times`` on a GPU, ``notebook_times_cpu`` on a CPU."""
    return "notebook_times" if gpu else "notebook_times_cpu"


def _seconds(cell: Any) -> float:
    t = cell.get("metadata", {}).get("execution", {})
    start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def sections(nb: Any) -> list[tuple[str, float]]:
    """Returns (section title, seconds) for an executed notebook: its ``## `` headings in order,
    with the opening (before the first heading) as 'opening'."""
    out: list[list[Any]] = [["opening", 0.0]]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("## "):
                    out.append([line[3:].strip(), 0.0])
        elif cell.cell_type == "code":
            out[-1][1] += _seconds(cell)
    return [(title, secs) for title, secs in out]


def problems(nb: Any) -> list[str]:
    """Returns what a learner should never see in the outputs: errors, tracebacks, warnings."""
    found = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                found.append(f"cell {i}: {o.get('ename')}: {o.get('evalue')}")
            elif o.get("name") == "stderr" and ("Warning" in o.get("text", "")
                                                or "Traceback" in o.get("text", "")):
                lines = o["text"].strip().splitlines()
                named = [ln for ln in lines if "Warning" in ln or "Error" in ln] or lines
                found.append(f"cell {i}: {named[0].strip()[:200]}")
    return found


def execute(path: Path, timeout: int = 1200, save_to: Path | None = None) -> dict[str, Any]:
    """Executes one notebook and returns its row: total and per-section seconds, problems.

    ``save_to``: a folder where the executed notebook, outputs included, is written (also when a
    cell fails), to read what went wrong."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    root = str(path.resolve().parents[1])
    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *[p for p in paths if p != root]])
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    error = ""
    try:
        client.execute()
    except Exception as e:  # recorded: the row says the notebook did not finish
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else ''}"
    wall = time.perf_counter() - t0
    if save_to is not None:
        save_to.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, save_to / path.name)
    return {"notebook": path.stem, "wall_s": wall, "finished": not error, "error": error,
            "load_average_1min": os.getloadavg()[0], "cpus": os.cpu_count(),
            "sections": [{"section": t, "seconds": s} for t, s in sections(nb)],
            "problems": problems(nb)}


class _Note(str):
    """A line a notebook cell shows as it is (a str's repr would quote it)."""

    def __repr__(self) -> str:
        return str(self)


def section_minutes(notebook: str):
    """Returns minutes per section of a notebook (by number, e.g. '03') on a CPU and on a GPU,
    read from the measured files; a column says 'no measurement' where its file or row is missing."""
    import pandas as pd

    columns: dict[str, Any] = {}
    for gpu in (False, True):
        label = "minutes on a GPU" if gpu else "minutes on a CPU"
        try:
            payload = measure.read_result(result_name(gpu), rows_need=("notebook",))
        except FileNotFoundError:
            payload = {"rows": [], "meta": {}}
        row = next((r for r in payload["rows"] if r["notebook"].startswith(notebook)), None)
        if row is None:
            columns[label] = None
            continue
        if gpu and payload["meta"].get("gpu_name"):
            label = f"minutes on {payload['meta']['gpu_name']}"
        columns[label] = {**{s["section"]: round(s["seconds"] / 60, 1) for s in row["sections"]},
                          "whole notebook": round(row["wall_s"] / 60, 1)}
    measured = [c for c in columns.values() if c is not None]
    if not measured:
        return _Note("No timings of this notebook in data/.")
    index = list(dict.fromkeys(k for c in measured for k in c))
    return pd.DataFrame({label: [c.get(k, "") for k in index] if c is not None
                         else ["no measurement"] * len(index)
                         for label, c in columns.items()}, index=index)


def _minutes_text(seconds: float) -> str:
    minutes = seconds / 60
    if minutes < 1:
        return "under a minute"
    return f"about {minutes:.0f} min" if minutes >= 2 else f"about {minutes:.1f} min"


def section_summary(notebook: str) -> str:
    """Returns, in a sentence or two, how long running every cell of a notebook (by number, e.g.
    '03') took on a CPU and on a GPU, naming only the sections that took a minute or more; read
    from the measured files. The notebooks' openings print it."""
    totals, long, unsplit = [], [], []
    for gpu in (False, True):
        try:
            payload = measure.read_result(result_name(gpu))
        except FileNotFoundError:
            continue
        row = next((r for r in payload["rows"] if r["notebook"].startswith(notebook)), None)
        if row is None:
            continue
        where = f"the {payload['meta']['gpu_name']}" if gpu and payload["meta"].get("gpu_name") \
            else "a GPU" if gpu else "a CPU"
        done = "" if row.get("finished", True) else " (it did not finish)"
        totals.append(f"{_minutes_text(row['wall_s'])} on {where}{done}")
        long += [f"{s['section']!r} ({_minutes_text(s['seconds'])} on {where})"
                 for s in row["sections"] if s["seconds"] >= 60]
        if not row["sections"]:
            unsplit.append(where)
    if not totals:
        return _Note("No timings of this notebook in data/.")
    text = f"Running every cell takes {' and '.join(totals)}."
    if long:
        return text + f" Sections that take a minute or more: {', '.join(long)}."
    if unsplit:
        return text + f" (The run on {' and '.join(unsplit)} recorded no time per section.)"
    return text + " No section takes a minute."


#: A learner's reading speed (words of the notebook's text per minute) and minutes per exercise:
#: the assumptions :func:`learner_minutes` states in the table it feeds.
READING_WPM, EXERCISE_MIN = 200, 5


def learner_minutes(path: Path) -> dict[str, Any]:
    """Returns a learner's time in a notebook, estimated: its text's words (markdown cells) read
    at :data:`READING_WPM` words a minute, and its exercises (the ``ex.NAME.check(...)`` calls in its
    code cells, the coding exercises among them) at :data:`EXERCISE_MIN` minutes each."""
    import json
    import re

    nb = json.loads(Path(path).read_text())
    text = " ".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    code = " ".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    words = len(re.findall(r"[A-Za-z0-9']+", text))
    exercises = len(set(re.findall(r"\bex\.(\w+)\.check\(", code)))
    return {"words": words, "exercises": exercises,
            "minutes": words / READING_WPM + EXERCISE_MIN * exercises}


#: notebooks/WORKSHOP.md's measured-minutes table sits between these two lines.
WORKSHOP_MARKERS = ("<!-- notebook-times:start -->", "<!-- notebook-times:end -->")


def workshop_table() -> str:
    """Returns the markdown table of minutes per notebook on a CPU and on a GPU, from the files."""
    found = {}
    for gpu in (False, True):
        try:
            found[gpu] = measure.read_result(result_name(gpu))
        except FileNotFoundError:
            found[gpu] = None
    gpu_name = (found[True] or {}).get("meta", {}).get("gpu_name") or "a GPU"
    rows = {}
    for gpu, payload in found.items():
        for r in (payload or {}).get("rows", []):
            minutes = f"{r['wall_s'] / 60:.1f}" if r["finished"] else "did not finish"
            load = f" (load {r['load_average_1min']:.0f} on {r['cpus']} cores)" \
                if not gpu and "load_average_1min" in r else ""
            rows.setdefault(r["notebook"], {})[gpu] = minutes + load
    for path in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        rows.setdefault(path.stem, {})["learner"] = learner_minutes(path)
    lines = [f"| notebook | words | exercises | a learner's minutes | execution minutes on a CPU | "
             f"execution minutes on {gpu_name} |", "| --- | --- | --- | --- | --- | --- |"]
    for name in sorted(rows):
        le = rows[name].get("learner")
        learner = (f"| {le['words']:,} | {le['exercises']} | {le['minutes']:.0f} " if le else
                   "| | | ")
        lines.append(f"| `{name}` {learner}| {rows[name].get(False, 'no measurement')} | "
                     f"{rows[name].get(True, 'no measurement')} |")
    lines += ["", f"A learner's minutes: the text read at {READING_WPM} words a minute and "
              f"{EXERCISE_MIN} minutes an exercise, execution not counted."]
    sources = [f"{result_name(gpu)}.json: {measure.describe_source(p['meta'], with_file=False)}"
               for gpu, p in found.items() if p is not None]
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {s}" for s in sources) + "\n"


def update_workshop(path: Path = NOTEBOOKS_DIR / "WORKSHOP.md") -> Path:
    """Rewrites the measured-minutes table of the instructor's guide from the files; returns the path."""
    text = path.read_text()
    start, end = WORKSHOP_MARKERS
    if start not in text or end not in text:
        raise ValueError(f"{path} has no {start} ... {end} lines to put the table between")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{workshop_table()}{end}{tail}")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("notebook_times", __doc__.splitlines()[0])
    numbers = [x.name[:2] for x in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))]
    p.add_argument("--only", default=None,
                   type=validate.argument(validate.choice, numbers, many=True),
                   help="comma-separated notebook numbers, e.g. 03,04")
    p.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    p.add_argument("--save-executed", metavar="DIR", default=None,
                   type=validate.argument(validate.output_dir),
                   help="also write each executed notebook, with its outputs, into DIR")
    p.add_argument("--workshop", action="store_true",
                   help="execute nothing: rewrite notebooks/WORKSHOP.md's table from the files")
    args = p.parse_args(argv)
    if args.workshop:
        print(f"wrote {update_workshop()}")
        return 0
    import torch

    paths = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
    if args.only is not None:  # notebook numbers, checked as parsed
        paths = [x for x in paths if x.name[:2] in args.only]
    gpu = torch.cuda.is_available()
    name = result_name(gpu)
    folder = measure.data_dir() if args.replace else measure.local_dir()
    rows: list[dict[str, Any]] = []
    for path in paths:
        row = execute(path, save_to=args.save_executed)
        print(f"{path.name}: {row['wall_s']:.0f} s, {'finished' if row['finished'] else row['error']}"
              f"{'; ' + str(len(row['problems'])) + ' problems in outputs' if row['problems'] else ''}",
              flush=True)
        for problem in row["problems"]:
            print(f"    {problem}", flush=True)
        # written after every notebook, so a run cut short keeps what it measured
        rows = sorted(measure.merge_with_previous(name, [row], key="notebook", data_dir=folder),
                      key=lambda r: r["notebook"])
        written = measure.write_result(name, rows, meta={"benchmark": "fp16lab.bench.notebook_times"},
                                     data_dir=folder)
    print(f"\nwrote {written}\n\n{'notebook':40s} {'minutes':>8s}  problems")
    for r in rows:
        print(f"{r['notebook']:40s} {r['wall_s'] / 60:8.1f}  {len(r['problems'])}"
              f"{'' if r['finished'] else '  DID NOT FINISH'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""An ipywidgets panel that runs a training-step sweep and plots the points as they finish.

The sweep runs on a background thread, so the kernel stays free and the Stop button works;
ipywidgets sends updates made from that thread to the browser. Every widget a browser test
needs carries a ``fp16lab-sweep-*`` DOM class (see ``DOM_CLASSES``): the controls (model,
batches, layouts, precisions, the scaler's init-scale, growth, backoff and interval, warmup, steps,
repeats; the later axes: executions, compile mode, inputs with their image folder, image count
and workers, gpus), the buttons (run, stop) and the outputs (progress, status, plot, table).
An input that cannot run here is listed with the reason; choosing it is refused with that reason.
"""

from __future__ import annotations

import importlib.util
import io
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as w
import pandas as pd

from .. import validate
from ..workload import Workload
from .. import sweep, telemetry  # telemetry the module: tests replace its functions
from ..execution import COMPILE_MODES, EXECUTIONS
from ..inputs import BACKENDS, unavailable_reason
from ..models import MODELS
from ..sweep.axes import gpu_count


DOM_CLASSES = {  # fp16lab-sweep-<name> -> the SweepPanel attribute that carries it
    "model": "model", "batches": "batches", "layouts": "layouts", "precisions": "precisions",
    "init-scale": "init_scale", "growth-factor": "growth_factor",
    "backoff-factor": "backoff_factor", "growth-interval": "growth_interval",
    "warmup": "warmup", "steps": "steps", "repeats": "repeats",
    "executions": "executions", "compile-mode": "compile_mode", "inputs": "inputs",
    "images-dir": "images_dir", "images": "images", "num-workers": "num_workers", "gpus": "gpus",
    "run": "run_button", "stop": "stop_button", "progress": "progress", "status": "status",
    "plot": "plot", "table": "table", "sharing": "sharing",
}


def _defaults(device: str) -> dict[str, Any]:
    """Returns the panel's starting choices: small and quick on a CPU, the real thing on a GPU."""
    if device == "cuda":
        model = "resnet50" if importlib.util.find_spec("torchvision") else "small_cnn"
        return dict(model=model, batch_options=(16, 32, 64, 128, 256, 512),
                    batches=(64, 128, 256), warmup=5, steps=20, repeats=3, images=2048)
    return dict(model="small_cnn", batch_options=(2, 4, 8, 16, 32, 64), batches=(8, 32),
                warmup=1, steps=4, repeats=2, images=64)


class SweepPanel:
    """A sweep's controls, progress, live plots and results table.

    Args:
        out: a ``.parquet`` results file to append to and resume from; None keeps the rows in
            memory only.
        device: 'auto', 'cpu' or 'cuda'.
        workloads: workloads (:class:`fp16lab.workload.Workload`) the model menu offers beside
            the built-in models, by name; the first is chosen at the start.

    Display it as the last expression of a cell; ``panel.rows`` holds the measured rows.
    """

    def __init__(self, out: str | Path | None = None, *, device: str = "auto",
                 workloads: tuple[Workload, ...] = ()):
        probe = sweep.SweepSpec(device=device, telemetry=False)  # validates the device
        self.device = probe.resolved_device()
        self.out = None if out is None else validate.output_file("out", out)
        d = _defaults(self.device)
        vision = importlib.util.find_spec("torchvision") is not None
        models = [m for m in MODELS if vision or not m.startswith("resnet")]
        if not isinstance(workloads, (tuple, list)) or \
                not all(isinstance(x, Workload) for x in workloads):
            raise TypeError("workloads must be a tuple of fp16lab.workload.Workload")
        self.workloads = {x.name: x for x in workloads}
        clash = sorted(set(self.workloads) & set(models))
        if clash:
            raise ValueError(f"a workload's name is a built-in model's: {clash}; rename it")
        models = [*self.workloads, *models]
        if workloads:
            d["model"] = workloads[0].name
        s = sweep.ScalerSettings()
        style = {"description_width": "110px"}
        self.model = w.Dropdown(options=models, value=d["model"], description="model", style=style)
        self.batches = w.SelectMultiple(options=d["batch_options"], value=d["batches"], rows=6,
                                        description="batch sizes", style=style)
        self.layouts = w.SelectMultiple(options=list(sweep.LAYOUTS), value=("nchw", "channels_last"),
                                        rows=2, description="layouts", style=style)
        self.precisions = w.SelectMultiple(options=list(sweep.SWEEP_PRECISIONS),
                                           value=("fp32", "amp-fp16"), rows=9,
                                           description="precisions", style=style)
        self.executions = w.SelectMultiple(options=list(EXECUTIONS), value=("eager",), rows=3,
                                           description="execution", style=style)
        self.compile_mode = w.Dropdown(options=list(COMPILE_MODES), value="default",
                                       description="compile mode", style=style)
        self.inputs = w.SelectMultiple(options=_input_options(self.device), value=("synthetic",),
                                       rows=4, description="input", style=style)
        folder = Path(tempfile.gettempdir()) / f"fp16lab_jpegs_{d['images']}"
        self.images_dir = w.Text(value=str(folder), description="image folder", style=style)
        self.images = w.IntText(value=d["images"], description="images to write", style=style)
        self.num_workers = w.Text(value="auto", description="input workers", style=style)
        n_gpus = max(gpu_count(), 1) if self.device == "cuda" else 1
        self.gpus = w.SelectMultiple(options=list(range(1, n_gpus + 1)), value=(1,),
                                     rows=min(n_gpus, 4), description="GPUs", style=style)
        self.init_scale = w.FloatText(value=s.init_scale, description="init_scale", style=style)
        self.growth_factor = w.FloatText(value=s.growth_factor, description="growth_factor",
                                         style=style)
        self.backoff_factor = w.FloatText(value=s.backoff_factor, description="backoff_factor",
                                          style=style)
        self.growth_interval = w.IntText(value=s.growth_interval, description="growth_interval",
                                         style=style)
        self.warmup = w.IntText(value=d["warmup"], description="warm-up steps", style=style)
        self.steps = w.IntText(value=d["steps"], description="timed steps", style=style)
        self.repeats = w.IntText(value=d["repeats"], description="repeats", style=style)
        self.run_button = w.Button(description="Run", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop",
                                    disabled=True)
        self.progress = w.IntProgress(value=0, min=0, max=1, description="points")
        self.status = w.HTML(value=f"ready (device: {self.device})")
        self.sharing = w.HTML(value="")  # a warning when other processes use the GPU
        # Hidden until there is a result: an empty Image shows a broken-image icon.
        self.plot = w.Image(format="png", layout=w.Layout(max_width="100%", display="none"))
        # The summary is wider than a notebook's output area: it scrolls sideways in its box.
        self.table = w.HTML(value="", layout=w.Layout(width="auto", overflow="auto"))
        for name, attr in DOM_CLASSES.items():
            getattr(self, attr).add_class(f"fp16lab-sweep-{name}")
        self.run_button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self.stop())

        self.rows = pd.DataFrame(columns=list(sweep.ROW_COLUMNS))
        self.error: str = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._t0 = 0.0

        grid = w.HBox([
            w.VBox([self.model, self.batches, self.layouts, self.precisions]),
            w.VBox([w.HTML("<b>loss scaler</b> (amp-fp16, fp16-o2)"), self.init_scale,
                    self.growth_factor, self.backoff_factor, self.growth_interval,
                    w.HTML("<b>measurement</b>"), self.warmup, self.steps, self.repeats]),
            w.VBox([w.HTML("<b>execution, input, GPUs</b>"), self.executions, self.compile_mode,
                    self.inputs, self.images_dir, self.images, self.num_workers, self.gpus]),
        ])
        self.widget = w.VBox([grid, w.HBox([self.run_button, self.stop_button, self.progress]),
                              self.sharing, self.status, self.plot, self.table])
        self.widget.add_class("fp16lab-sweep-panel")

    # ----------------------------------------------------------------- what to run

    def spec(self) -> sweep.SweepSpec:
        """Returns the sweep the widgets describe (raises ValueError on bad input)."""
        scaler = sweep.ScalerSettings(
            init_scale=float(self.init_scale.value), growth_factor=float(self.growth_factor.value),
            backoff_factor=float(self.backoff_factor.value),
            growth_interval=int(self.growth_interval.value))
        workers = self.num_workers.value.strip()
        if workers != "auto" and not workers.isdigit():
            raise ValueError(f"input workers must be 'auto' (75% of the cores) or an integer "
                             f">= 0, got {workers!r}")
        files = any(i != "synthetic" for i in self.inputs.value)
        return sweep.SweepSpec(
            models=(self.workloads.get(self.model.value, self.model.value),), batches=tuple(sorted(self.batches.value)),
            layouts=tuple(self.layouts.value), precisions=tuple(self.precisions.value),
            scalers=(scaler,), executions=tuple(self.executions.value),
            compile_modes=(self.compile_mode.value,), inputs=tuple(self.inputs.value),
            num_workers=(None if workers == "auto" else int(workers),),
            images_dir=self.images_dir.value.strip() if files else None,
            images=int(self.images.value), gpus=tuple(self.gpus.value), device=self.device,
            warmup=int(self.warmup.value), steps=int(self.steps.value),
            repeats=int(self.repeats.value))

    @property
    def running(self) -> bool:
        """Returns True while a sweep runs."""
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> bool:
        """Starts the sweep on a background thread; returns False (and says why) if it cannot."""
        if self.running:
            return False
        try:
            spec = self.spec()
        except ValueError as e:
            self.error = str(e)
            self.status.value = f"<span style='color:#b00'>cannot run: {_escape(str(e))}</span>"
            return False
        self.error = ""
        self._stop.clear()
        self.rows = pd.DataFrame(columns=list(sweep.ROW_COLUMNS))
        n = len(spec.points()) * spec.repeats
        self.progress.max, self.progress.value = max(n, 1), 0
        self.progress.bar_style = ""
        self.run_button.disabled, self.stop_button.disabled = True, False
        self.status.value = f"running {n} measurements on {self.device} ..."
        self.check_sharing()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._work, args=(spec,), name="fp16lab-sweep",
                                        daemon=True)
        self._thread.start()
        return True

    def check_sharing(self) -> str:
        """Returns (and shows) a warning when other processes compute on the GPU, else ''."""
        others, _ = telemetry.other_gpu_processes() if self.device == "cuda" else ([], "")
        self.sharing.value = "" if not others else (
            f"<span style='color:#b00'>warning: {len(others)} other process(es) use this GPU "
            f"(pid {', '.join(str(p['pid']) for p in others)}); their kernels run between "
            f"yours, so timings and GPU counters measure them too.</span>")
        return self.sharing.value

    def stop(self) -> None:
        """Asks the sweep to end after the point it is measuring."""
        self._stop.set()
        self.status.value = "stopping after the current point ..."

    def wait(self, timeout: float | None = None) -> bool:
        """Returns True once the sweep has ended (False if ``timeout`` seconds passed first)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    # ----------------------------------------------------------------- the worker thread

    def _work(self, spec: sweep.SweepSpec) -> None:
        try:
            rows = sweep.run_sweep(spec, self.out, stop=self._stop, on_result=self._on_result)
            with self._lock:
                self.rows = rows
            self._redraw()
            stopped = self._stop.is_set()
            self.progress.bar_style = "warning" if stopped else "success"
            if not stopped:
                self.progress.value = self.progress.max
            elapsed = time.perf_counter() - self._t0
            self.status.value = (f"{'stopped' if stopped else 'done'}: {len(rows)} rows "
                                 f"in {elapsed:.1f} s")
        except Exception as e:  # shown in the panel, never lost in a thread
            self.error = f"{type(e).__name__}: {e}"
            self.progress.bar_style = "danger"
            self.status.value = f"<span style='color:#b00'>failed: {_escape(self.error)}</span>"
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True

    def _on_result(self, row: dict[str, Any], done: int, total: int) -> None:
        with self._lock:
            new = pd.DataFrame([row], columns=list(sweep.ROW_COLUMNS))
            self.rows = new if not len(self.rows) else pd.concat([self.rows, new],
                                                                 ignore_index=True)
        self.progress.max, self.progress.value = max(total, 1), done
        from tqdm import tqdm

        meter = tqdm.format_meter(done, total, time.perf_counter() - self._t0, unit="point")
        variant = sweep.variant_label(row)
        self.status.value = f"<code>{_escape(meter)}</code> last: {row['model']} b{row['batch']} " \
                            f"{row['layout']} {row['precision']}{' ' + variant if variant else ''} " \
                            f"r{row['repeat']} ({row['status']})"
        self._redraw()

    def _redraw(self) -> None:
        with self._lock:
            rows = self.rows.copy()
        from matplotlib.figure import Figure

        # A bare Figure, not pyplot: this runs on the sweep's thread.
        fig = sweep.plot_results(rows, fig=Figure(figsize=(13, 3.6), layout="constrained"))
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        self.plot.value = buf.getvalue()
        self.plot.layout.display = None
        if len(rows):
            self.table.value = _TABLE_STYLE + results_html(rows)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


def results_html(rows: pd.DataFrame) -> str:
    """Returns the per-point summary of a sweep's rows as an HTML table."""
    s = sweep.summarize_results(rows)
    s = s.assign(variant=[sweep.variant_label(r) for r in s.to_dict("records")])
    cols = ["model", "batch", "layout", "precision", "variant", "init_scale", "status", "repeats",
            "samples_per_s", "step_ms", "spread", "repeat_spread", "unstable",
            "peak_mem_allocated_mb", "peak_mem_reserved_mb", "final_scale", "skipped_steps",
            "gpu_busy_mean", "power_w_mean"]
    return s[cols].map(_fmt).to_html(index=False, classes="fp16lab-sweep-results", border=0)


_TABLE_STYLE = ("<style>.fp16lab-sweep-results th, .fp16lab-sweep-results td "
                "{padding: 2px 8px; text-align: right; white-space: nowrap}</style>")


def _input_options(device: str) -> list[tuple[str, str]]:
    """Returns the input selector's (label, value) pairs: an input that cannot run here is
    labelled with the reason."""
    out = []
    for name in BACKENDS:
        reason = unavailable_reason(name, device)
        out.append((name if reason is None else f"{name} (unavailable: {reason})", name))
    return out


def _fmt(v: Any) -> Any:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return v


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

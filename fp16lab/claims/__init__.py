"""Popular mixed-precision rules of thumb, each turned into an experiment and a computed verdict.

Every :class:`Claim` (:mod:`.core`) carries the claim as it circulates, the experiment that
tests it, and the verdict rule in one sentence. The claims live by family, each beside its
experiments and rules: :mod:`.gemm` (1, 11), :mod:`.training` (2-5, 12), :mod:`.scaling` (6, 9)
and :mod:`.autocast` (7, 8, 10). :func:`check` (:mod:`.run`) runs the experiment on this machine
(or, for a claim that needs a GPU when there is none, loads the figures recorded on a GPU) and
applies the rule, a pure function of the measured figures, so the verdict is computed, never
typed in. :mod:`.report` makes the tables and files; :mod:`.cli` is ``fp16lab claims``.
"""

from .autocast import (experiment_allow_tf32, experiment_amp_ratio, experiment_autocast_disable,
                       judge_allow_tf32, judge_amp_ratio, judge_autocast_disable)
from .core import (FAILS, HOLDS, NONEXISTENT, PARTLY, RECORDED_GPU_RESULT, TOO_NOISY, UNTESTABLE,
                   VERDICTS, Claim, Figures, Judgement, saved_activation_bytes)
from .gemm import (experiment_alignment, experiment_fp16_vs_fp32, judge_alignment,
                   judge_fp16_vs_fp32)
from .report import (markdown_table, recorded_claims, recorded_summary, recorded_table,
                     to_markdown, verdict_table, write_claims)
from .run import CLAIMS, check, check_all, device_slug, get_claim, recorded_gpu_result
from .scaling import (experiment_clipping, experiment_gradscaler, judge_clipping,
                      judge_gradscaler)
from .training import (experiment_amp_vs_fp32, experiment_bf16_memory, experiment_channels_last,
                       experiment_profiling_executor, experiment_utilisation, judge_amp_vs_fp32,
                       judge_bf16_memory, judge_channels_last, judge_profiling_executor,
                       judge_utilisation, train_step_figures)

__all__ = ["CLAIMS", "FAILS", "HOLDS", "NONEXISTENT", "PARTLY", "RECORDED_GPU_RESULT", "TOO_NOISY",
           "UNTESTABLE", "VERDICTS", "Claim", "Figures", "Judgement", "check", "check_all",
           "device_slug",
           "experiment_alignment", "experiment_allow_tf32", "experiment_amp_ratio",
           "experiment_amp_vs_fp32", "experiment_autocast_disable", "experiment_bf16_memory",
           "experiment_channels_last", "experiment_clipping", "experiment_fp16_vs_fp32",
           "experiment_gradscaler", "experiment_profiling_executor", "experiment_utilisation",
           "get_claim", "judge_alignment", "judge_allow_tf32", "judge_amp_ratio",
           "judge_amp_vs_fp32", "judge_autocast_disable", "judge_bf16_memory",
           "judge_channels_last", "judge_clipping", "judge_fp16_vs_fp32", "judge_gradscaler",
           "judge_profiling_executor", "judge_utilisation", "markdown_table", "recorded_claims",
           "recorded_gpu_result", "recorded_summary", "recorded_table", "saved_activation_bytes", "to_markdown",
           "train_step_figures", "verdict_table", "write_claims"]

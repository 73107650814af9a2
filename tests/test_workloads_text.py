"""fp16lab.workloads.text: BERT, GPT-2 and a Llama-style decoder built offline, tiny ones trained.

The real sizes are built on the meta device (shapes only, no memory) and their parameter counts
checked against the published figures; the tiny configurations of the same classes train a step
on the CPU. Skipped where transformers is not installed (``pip install 'fp16lab[models]'``).
"""

from __future__ import annotations

import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded, ever: a hub call fails at once

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fp16lab.workload import load_workload, train_step  # noqa: E402
from fp16lab.workloads import missing_package  # noqa: E402
from fp16lab.workloads.text import GPT2_VOCAB, padded  # noqa: E402

REASON = missing_package("gpt2-small")
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TINY = [("bert-base", {"head": "mlm"}), ("bert-base", {"head": "classification"}),
        ("gpt2-small", {}), ("gpt2-small", {"pad_vocab_to": 64}), ("llama", {})]


def _on_meta(name: str, **settings):
    with torch.device("meta"):
        return load_workload(name, **settings).build()


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_real_sizes_have_the_published_parameter_counts():
    # GPT-2 small: 124,439,808 (the embeddings tied to the output layer); BERT-base with the
    # masked-LM head 109,514,298 and with a 2-label classifier 109,483,778
    assert _count(_on_meta("gpt2-small")) == 124_439_808
    assert _count(_on_meta("bert-base")) == 109_514_298
    assert _count(_on_meta("bert-base", head="classification")) == 109_483_778
    # the Llama-style decoder, by hand: untied 32000x768 embedding and output layer; per layer
    # q, k, v, o (768x768), SwiGLU's gate, up and down (768x2048) and two RMSNorm weights
    layer = 4 * 768 * 768 + 3 * 768 * 2048 + 2 * 768
    assert _count(_on_meta("llama")) == 2 * 32000 * 768 + 12 * layer + 768


def test_gpt2_pads_its_vocabulary_to_50304():
    assert padded(GPT2_VOCAB, 64) == 50304 == 786 * 64
    model = _on_meta("gpt2-small", pad_vocab_to=64)
    assert model.transformer.wte.weight.shape == (50304, 768)
    assert model.lm_head.weight.shape[0] % 64 == 0
    assert _count(model) == 124_439_808 + (50304 - GPT2_VOCAB) * 768


def test_the_real_sequences():
    assert load_workload("bert-base").settings["seq_len"] == 128
    assert load_workload("gpt2-small").settings["seq_len"] == 1024
    inputs, targets = load_workload("gpt2-small").batch(1, "cpu")
    assert inputs["input_ids"].shape == targets.shape == (1, 1024)
    assert int(inputs["input_ids"].max()) < GPT2_VOCAB


@pytest.mark.parametrize("name, settings", TINY, ids=lambda v: str(v))
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_each_tiny_model_trains_a_step_on_the_cpu(name, settings, precision):
    w = load_workload(name, tiny=True, **settings)
    step = train_step(w, precision, "cpu", 2)
    losses = [float(step().detach()) for _ in range(2)]
    grads = [p.grad for p in step.model.parameters() if p.grad is not None]
    assert all(math.isfinite(v) for v in losses), losses
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert w.accepted_layouts() == ("nchw",)  # no convolution


def test_gpt2_tiny_loss_ignores_the_padding_logits():
    w = load_workload("gpt2-small", tiny=True, pad_vocab_to=64)
    torch.manual_seed(0)
    model = w.build()
    rows = model.lm_head.weight.shape[0]
    assert rows % 64 == 0 and rows > 250  # 250 tokens padded to 256
    inputs, targets = w.batch(2, "cpu")
    logits = model(**inputs).logits
    loss = w.loss(logits, targets)
    oracle = F.cross_entropy(logits[..., :250].reshape(-1, 250), targets.reshape(-1))
    assert torch.allclose(loss, oracle)
    loss.backward()
    # no token id reaches the padding rows and the softmax never sees their logits
    assert torch.count_nonzero(model.transformer.wte.weight.grad[250:]) == 0
    assert torch.count_nonzero(model.transformer.wte.weight.grad[:250]) > 0
    with torch.no_grad():  # whatever the padding rows hold, the loss is the same
        model.transformer.wte.weight[250:] = 1e4
    assert torch.equal(w.loss(model(**inputs).logits, targets).detach(), loss.detach())


def test_the_llama_decoder_is_llama_style():
    model = load_workload("llama", tiny=True).build()
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"LlamaRMSNorm", "LlamaRotaryEmbedding", "LlamaMLP"} <= kinds
    assert model.config.hidden_act == "silu"  # SwiGLU: silu(gate) * up
    assert model.config._attn_implementation == "sdpa"
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())


def test_bert_heads():
    mlm = load_workload("bert-base", tiny=True)
    _, targets = mlm.batch(4, "cpu")
    chosen = (targets != -100).float().mean()
    assert 0.05 < float(chosen) < 0.3  # 15% of the positions are predicted
    cls = load_workload("bert-base", tiny=True, head="classification", num_labels=3)
    inputs, labels = cls.batch(4, "cpu")
    assert cls.build()(**inputs).logits.shape == (4, 3) and labels.shape == (4,)


def test_bad_settings_are_refused():
    with pytest.raises(RuntimeError, match="head must be one of") as info:
        load_workload("bert-base", head="ner")
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(RuntimeError, match="pad_vocab_to must be >= 1"):
        load_workload("gpt2-small", pad_vocab_to=0)

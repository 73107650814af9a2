"""Transformer language models as workloads, from ``transformers`` configurations, random weights.

Nothing is downloaded: each model is its class built from a configuration written here
(``BertConfig``, ``GPT2Config``, ``LlamaConfig``), never ``from_pretrained``. ``tiny=True``
gives a configuration of the same class (two layers, hidden 32-64) for a CPU test.

* ``bert-base``: BERT-base (12 layers, hidden 768, vocabulary 30522), sequence 128, with the
  masked-LM head (15% of positions predicted) or a sequence-classification head;
* ``gpt2-small``: GPT-2 small (12 layers, hidden 768, vocabulary 50257), sequence 1024;
  ``pad_vocab_to=64`` pads the embedding and output layer to 50304 rows (the tensor-core
  friendly size), and the loss reads only the 50257 real logits;
* ``llama``: a Llama-style decoder (RMSNorm, SwiGLU, rotary embeddings,
  ``scaled_dot_product_attention``) of GPT-2 small's size: 12 layers, hidden 768, 12 heads,
  SwiGLU width 2048, vocabulary 32000, sequence 1024.
"""

from __future__ import annotations

import math
from typing import Any

from .. import validate
from ..workload import Workload
from .batches import cross_entropy, lm_cross_entropy, token_batch
from . import require

#: Attention implementations the configurations may ask ``transformers`` for.
ATTENTIONS = ("sdpa", "eager")


def padded(size: int, multiple: int | None) -> int:
    """Returns ``size`` rounded up to a multiple of ``multiple`` (None: unchanged)."""
    size = validate.count("size", size)
    if multiple is None:
        return size
    multiple = validate.count("pad_vocab_to", multiple)
    return math.ceil(size / multiple) * multiple


def _tokens(tiny: bool, seq_len: int | None, real: int, small: int) -> int:
    validate.boolean("tiny", tiny)
    if seq_len is None:
        return small if tiny else real
    return validate.count("seq_len", seq_len)


def bert_base(tiny: bool = False, head: str = "mlm", seq_len: int | None = None,
              num_labels: int = 2, attention: str = "sdpa") -> Workload:
    """Returns BERT-base with a masked-LM (``head="mlm"``) or classification head."""
    require("bert-base")
    import transformers  # local: optional heavy dependency (the models extra)

    validate.choice("head", head, ("mlm", "classification"))
    validate.choice("attention", attention, ATTENTIONS)
    num_labels = validate.count("num_labels", num_labels, low=2)
    seq = _tokens(tiny, seq_len, 128, 16)
    size = (dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, vocab_size=512) if tiny else {})
    cfg = transformers.BertConfig(max_position_embeddings=max(512, seq), num_labels=num_labels,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                  attn_implementation=attention, **size)
    vocab = cfg.vocab_size
    if head == "mlm":
        cls, batch = transformers.BertForMaskedLM, token_batch(seq, vocab, causal=False)
    else:
        cls = transformers.BertForSequenceClassification
        tokens = token_batch(seq, vocab, causal=False)

        def batch(size: int, device: Any) -> tuple[dict[str, Any], Any]:
            import torch

            feed, _ = tokens(size, device)
            gen = torch.Generator().manual_seed(1)
            return feed, torch.randint(0, num_labels, (size,), generator=gen).to(device)

    return Workload(name=f"bert-base-{head}" + ("-tiny" if tiny else ""), build=lambda: cls(cfg),
                    batch=batch, loss=cross_entropy, output="logits",
                    settings=dict(tiny=tiny, head=head, seq_len=seq, num_labels=num_labels,
                                  attention=attention))


#: GPT-2's vocabulary: 50257 tokens (50304 = 786 * 64 when padded to a multiple of 64).
GPT2_VOCAB = 50257


def gpt2_small(tiny: bool = False, seq_len: int | None = None, pad_vocab_to: int | None = None,
               attention: str = "sdpa") -> Workload:
    """Returns GPT-2 small (causal LM), its vocabulary padded to a multiple of ``pad_vocab_to``."""
    require("gpt2-small")
    import transformers  # local: optional heavy dependency (the models extra)

    validate.choice("attention", attention, ATTENTIONS)
    seq = _tokens(tiny, seq_len, 1024, 32)
    vocab = 250 if tiny else GPT2_VOCAB
    rows = padded(vocab, pad_vocab_to)
    size = dict(n_layer=2, n_embd=32, n_head=2) if tiny else {}
    cfg = transformers.GPT2Config(vocab_size=rows, n_positions=max(1024, seq), bos_token_id=0,
                                  eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, attn_implementation=attention, **size)
    return Workload(name="gpt2-small" + ("-tiny" if tiny else ""),
                    build=lambda: transformers.GPT2LMHeadModel(cfg),
                    batch=token_batch(seq, vocab, causal=True, keys=("input_ids", None)),
                    loss=lm_cross_entropy(vocab), output="logits",
                    settings=dict(tiny=tiny, seq_len=seq, pad_vocab_to=pad_vocab_to,
                                  attention=attention))


def llama(tiny: bool = False, seq_len: int | None = None, attention: str = "sdpa") -> Workload:
    """Returns a Llama-style decoder (RMSNorm, SwiGLU, rotary embeddings, SDPA), causal LM."""
    require("llama")
    import transformers  # local: optional heavy dependency (the models extra)

    validate.choice("attention", attention, ATTENTIONS)
    seq = _tokens(tiny, seq_len, 1024, 32)
    size = (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, intermediate_size=128, vocab_size=256) if tiny else
            dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=12, intermediate_size=2048, vocab_size=32000))
    cfg = transformers.LlamaConfig(max_position_embeddings=max(2048, seq), bos_token_id=0,
                                   eos_token_id=0, pad_token_id=None, tie_word_embeddings=False,
                                   attn_implementation=attention, **size)
    return Workload(name="llama" + ("-tiny" if tiny else ""),
                    build=lambda: transformers.LlamaForCausalLM(cfg),
                    batch=token_batch(seq, cfg.vocab_size, causal=True, keys=("input_ids", None)),
                    loss=cross_entropy, output="logits",
                    settings=dict(tiny=tiny, seq_len=seq, attention=attention))

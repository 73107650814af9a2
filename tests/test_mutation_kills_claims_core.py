"""fp16lab.claims.core: the autocast dtype a claim runs in, against what torch's autocast does
on the device. Written against the survivors of a mutation run of claims/core.py (53.8%)."""

from __future__ import annotations

import torch

from fp16lab.claims import core


def _autocast_makes_fp16(device: str) -> bool:
    try:
        with torch.autocast(device, dtype=torch.float16):
            return torch.mm(torch.ones(3, 4, device=device), torch.ones(4, 5, device=device)).dtype \
                == torch.float16
    except RuntimeError:
        return False


def test_the_claims_autocast_dtype_is_fp16_where_autocast_makes_fp16():
    # the oracle asks torch directly, with another op and other shapes
    want = torch.float16 if _autocast_makes_fp16("cpu") else torch.bfloat16
    assert core._autocast_dtype("cpu") == want
    # a device autocast does not run on: bfloat16, the claims' fallback
    assert core._autocast_dtype("meta") == torch.bfloat16
    assert core._autocast_dtype("no-such-device") == torch.bfloat16

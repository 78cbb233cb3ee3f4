"""Device and precision choice: train_precision's auto resolves to bf16 only where the hardware computes it."""

from __future__ import annotations

import pytest

from toolschool.config import load_config
from toolschool.errors import ConfigError
from toolschool.models import device


@pytest.mark.parametrize(("native", "want"), [(True, "bf16"), (False, "fp32")])
def test_auto_precision_follows_the_cpu(monkeypatch: pytest.MonkeyPatch, native: bool, want: str) -> None:
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: native)
    assert device.train_precision("auto", "cpu") == want
    for named in ("fp32", "bf16"):  # named precisions are taken as they are
        assert device.train_precision(named, "cpu") == named


def test_auto_precision_on_a_gpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device.torch.cuda, "is_bf16_supported", lambda: False)
    assert device.train_precision("auto", "cuda") == "fp32"
    assert device.train_precision("auto", "mps") == "fp32"


def test_training_dtype_keys_accept_auto_and_refuse_others() -> None:
    config = load_config(None, {"sft.dtype": "auto", "rl.dtype": "auto"})
    assert (config.sft.dtype, config.rl.dtype) == ("auto", "auto")
    with pytest.raises(ConfigError) as info:
        load_config(None, {"sft.dtype": "fp16"})
    assert "fp16" in str(info.value) and "auto" in str(info.value)

"""The prepacked view of a model: same logits as the model, re-packed on weight changes, LoRA folded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolschool.engine.packed_weights import PackedLinear, packed_view, packing_available


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_packed_view_matches_the_model_and_leaves_it_untouched(tiny_model_dir: Path, dtype: str) -> None:
    from toolschool.models.loading import load_model

    model = load_model(str(tiny_model_dir), device="cpu", dtype=dtype).model
    if not packing_available(model):
        pytest.skip(f"this torch build or CPU has no oneDNN {dtype} linear")
    view = packed_view(model)
    assert any(isinstance(m, PackedLinear) for m in view.modules())
    assert not any(isinstance(m, PackedLinear) for m in model.modules())  # the original keeps nn.Linear
    assert {id(p) for p in view.parameters()} == {id(p) for p in model.parameters()}  # shared, not copied
    ids = torch.tensor([[5, 17, 300, 42, 9]])
    atol = 1e-4 if dtype == "fp32" else 2e-2  # bf16: the same oneDNN kernels, up to summation order
    with torch.inference_mode():
        assert torch.allclose(view(input_ids=ids).logits, model(input_ids=ids).logits, atol=atol)
    # Weights changed in place (as training does) are re-packed, not served stale.
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    with torch.inference_mode():
        assert torch.allclose(view(input_ids=ids).logits, model(input_ids=ids).logits, atol=atol)


def test_packed_fp32_view_runs_under_bf16_autocast(tiny_model_dir: Path) -> None:
    """Mixed precision (RL's reference pass under the accelerator's autocast): bf16 activations reach the packed fp32
    weights, which oneDNN's op cannot mix; the product runs in fp32 and comes back in the activations' dtype."""
    from toolschool.models.loading import load_model

    model = load_model(str(tiny_model_dir), device="cpu", dtype="fp32").model
    if not packing_available(model):
        pytest.skip("this torch build or CPU has no oneDNN fp32 linear")
    view = packed_view(model)
    ids = torch.tensor([[5, 17, 300, 42, 9]])
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = view(input_ids=ids).logits, model(input_ids=ids).logits
    assert torch.allclose(got.float(), want.float(), atol=5e-2)


def test_packed_view_runs_its_own_layers_under_an_instance_forward_patch(tiny_model_dir: Path) -> None:
    """TRL's GRPOTrainer sets `model.forward` to a closure over the original forward (its fused LM head)."""
    from trl.trainer.utils import add_fused_lm_head

    from toolschool.models.loading import load_model

    model = load_model(str(tiny_model_dir), device="cpu", dtype="fp32").model
    add_fused_lm_head(model)
    assert "forward" in model.__dict__
    view = packed_view(model, pack=False)
    calls = []
    for module in view.modules():
        if isinstance(module, PackedLinear):
            module.register_forward_hook(lambda *_: calls.append(1))
    ids = torch.tensor([[5, 17, 300, 42, 9]])
    with torch.inference_mode():
        logits = view(input_ids=ids).logits
        assert torch.allclose(logits, model(input_ids=ids).logits, atol=1e-4)
    assert calls  # the view's wrapped layers ran, not the original model's


@pytest.mark.parametrize("pack", [True, False])
def test_packed_view_folds_lora_adapters_and_follows_their_updates(tiny_model_dir: Path, pack: bool) -> None:
    """A PEFT LoRA model in training mode: the view computes its eval-mode output (W + s * B @ A, no dropout),
    refolds after an in-place update, sees a disabled adapter, and leaves the model's modes alone."""
    from peft import LoraConfig, get_peft_model

    from toolschool.models.loading import load_model

    model = load_model(str(tiny_model_dir), device="cpu", dtype="fp32").model
    if pack and not packing_available(model):
        pytest.skip("this torch build has no oneDNN linear")
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules="all-linear"))
    torch.manual_seed(0)
    for name, param in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    peft.train()
    view = packed_view(peft.get_base_model(), pack=pack)
    folded = [m for m in view.modules() if isinstance(m, PackedLinear) and m.adapters]
    assert folded, "the LoRA linears were not folded"
    ids = torch.tensor([[5, 17, 300, 42, 9]])

    def eval_logits() -> torch.Tensor:
        peft.eval()
        try:
            with torch.no_grad():
                return peft(input_ids=ids).logits
        finally:
            peft.train()

    with torch.no_grad():
        assert torch.allclose(view(input_ids=ids).logits, eval_logits(), atol=1e-4)
    assert all(m.training for m in peft.modules())  # the view did not switch the policy to eval
    with torch.no_grad():  # an optimizer step changes the adapters in place
        for name, param in peft.named_parameters():
            if "lora_A" in name:
                param.mul_(-1.5)
        assert torch.allclose(view(input_ids=ids).logits, eval_logits(), atol=1e-4)
        with peft.disable_adapter():
            peft.eval()
            plain = peft(input_ids=ids).logits
            assert torch.allclose(view(input_ids=ids).logits, plain, atol=1e-4)
            peft.train()
        assert not torch.allclose(view(input_ids=ids).logits, plain, atol=1e-4)

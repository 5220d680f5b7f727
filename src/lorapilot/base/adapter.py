"""What is trained: attach LoRA (or unfreeze everything for full fine-tuning) and list the
adapted modules and every trainable tensor (`build_adapter`, `adapter_info`).

Names: `target_modules` are module names of the *base* model (what `adapter.target_modules`
refers to, e.g. `model.layers.0.self_attn.q_proj`); tensor names (`trainable_tensors`) are
`named_parameters()` names of the model as trained (with PEFT's `base_model.model.` prefix),
the names state dicts and optimizers use. The update audit (does a real step move exactly
these tensors?) is `train.audit`.
"""

from __future__ import annotations

from typing import Any

from lorapilot.errors import UsageError
from lorapilot.spec import AdapterSpec


def build_adapter(
    model,
    adapter: AdapterSpec,
    *,
    seed: int | None = None,
    grad_checkpointing: bool = False,
    task_type: str | None = "CAUSAL_LM",
) -> tuple[Any, dict]:
    """Attach the spec's adapter. Returns (model to train, info).

    `lora`: a peft LoraConfig from the spec and `get_peft_model`; only the LoRA matrices and
    `modules_to_save` are trainable. `full`: every parameter trainable, model returned as is.
    `seed` makes the LoRA initialisation independent of the global RNG (callers pass
    `train.seed`); the global RNG is left untouched then. A quantized base first gets peft's
    k-bit preparation, as QLoRA users expect: everything frozen, the unquantized modules
    (norms, embeddings, LM head) upcast to fp32, and with `grad_checkpointing` the input
    embeddings' output made to require grad so checkpointed layers see a grad-requiring input.
    """
    import torch

    from lorapilot.base.quantize import is_quantized

    quantized = is_quantized(model)
    if quantized:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=grad_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    if adapter.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model, adapter_info(model, "full")

    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=adapter.r,
        lora_alpha=adapter.alpha,
        lora_dropout=adapter.dropout,
        target_modules=adapter.target_modules,  # "all-linear" is understood by peft itself
        modules_to_save=list(adapter.modules_to_save) or None,
        task_type=task_type,  # None: a plain module (an image classifier)
        use_rslora=adapter.rslora,
        use_dora=adapter.dora,
    )
    try:
        if seed is None:
            peft_model = get_peft_model(model, config)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                peft_model = get_peft_model(model, config)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise UsageError(f"adapter.target_modules: {e}") from e
    # The new wrapper module starts in train mode whatever its base was in; keep one mode.
    peft_model.train(model.training)
    info = adapter_info(peft_model, "lora")
    info["kbit_prepared"] = quantized
    return peft_model, info


def adapter_info(model, method: str) -> dict:
    """The trainable-parameter inventory of a model as it will be trained."""
    lora_modules: list[str] = []
    saved_modules: list[str] = []
    if method == "lora":
        from peft.tuners.lora import LoraLayer
        from peft.utils import ModulesToSaveWrapper

        for name, module in model.get_base_model().named_modules():
            if isinstance(module, LoraLayer):
                lora_modules.append(name)
            elif isinstance(module, ModulesToSaveWrapper):
                saved_modules.append(name)
    # named_parameters() lists a tied tensor (embeddings = lm_head) once: count it once.
    params = list(model.named_parameters())
    trainable = sorted(n for n, p in params if p.requires_grad)
    n_trainable = sum(p.numel() for _, p in params if p.requires_grad)
    n_total = sum(p.numel() for _, p in params)
    return {
        "method": method,
        "target_modules": sorted(lora_modules),
        "target_module_types": sorted({n.rsplit(".", 1)[-1] for n in lora_modules}),
        "trainable_params": n_trainable,
        "total_params": n_total,
        "trainable_fraction": n_trainable / n_total if n_total else 0.0,
        "modules_to_save": sorted(saved_modules),
        "trainable_tensors": trainable,
    }


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def set_checkpointing(model, on: bool) -> None:
    """Non-reentrant activation checkpointing on or off, as the training loop and the probe set
    it (LoRA's inputs do not require grad, and the shared-prefix loss needs non-reentrant).
    transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_* (the old
    names warn); either is used, whichever exists."""
    kwargs = {"use_reentrant": False}
    if on:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        # transformers also hooks the input embeddings to make their output require grad,
        # which only reentrant checkpointing needs: the hook's in-place requires_grad_ is a
        # graph break under torch.compile (`train.compile`), and the gradient it asks for
        # (the embeddings' output, nothing trainable) is work backward then skips.
        if hasattr(model, "disable_input_require_grads"):
            model.disable_input_require_grads()
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()

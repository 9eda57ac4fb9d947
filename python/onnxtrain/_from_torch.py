"""from_torch: a PyTorch module, loss, optimizer and learning-rate scheduler to an ONNX model
that carries the same training program (ModelProto.training_info).

The module is exported with torch.onnx.export; the optimizer's class and parameter groups
(each group's hyperparameters; parameters in no group, or with requires_grad False, stay fixed)
and the scheduler become make_trainable's options, so that each TrainingSession.step of the
result does what `loss(module(x), y).backward(); optimizer.step(); lr_scheduler.step()` does.
"""
from __future__ import annotations

import io
import re
import warnings
from collections.abc import Sequence
from typing import Any

import onnx

SUPPORTED_OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adagrad")
SUPPORTED_SCHEDULERS = ("StepLR", "MultiStepLR", "ExponentialLR", "ConstantLR", "LinearLR",
                        "PolynomialLR", "CosineAnnealingLR", "OneCycleLR", "SequentialLR")
# torch.nn loss modules and make_trainable's loss names.
SUPPORTED_LOSSES = {"CrossEntropyLoss": "cross_entropy", "NLLLoss": "nll", "MSELoss": "mse",
                    "L1Loss": "l1", "BCEWithLogitsLoss": "bce_with_logits"}


def _error(message: str) -> Exception:
    from onnxtrain._core import Error
    return Error(message)


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is optional for the package
        raise ImportError("onnxtrain.from_torch needs PyTorch (pip install torch)") from e
    return torch


def _loss_options(loss: Any) -> dict[str, Any]:
    """make_trainable's loss options for a loss name or a torch.nn loss module."""
    if isinstance(loss, str):
        if loss not in SUPPORTED_LOSSES.values():
            raise _error(f"from_torch: loss '{loss}' is not one of {', '.join(SUPPORTED_LOSSES.values())}")
        return {"loss": loss}
    name = type(loss).__name__
    if name not in SUPPORTED_LOSSES:
        raise _error(f"from_torch: loss {name} is not supported; supported: a name "
                     f"({', '.join(SUPPORTED_LOSSES.values())}) or torch.nn.{', torch.nn.'.join(SUPPORTED_LOSSES)}")
    reduction = getattr(loss, "reduction", "mean")
    if reduction not in ("mean", "sum"):
        raise _error(f"from_torch: {name}(reduction='{reduction}'): the training loss must be a scalar "
                     "(reduction 'mean' or 'sum')")
    for attribute, default in (("weight", None), ("pos_weight", None), ("label_smoothing", 0.0)):
        value = getattr(loss, attribute, default)
        if value is not None and not (default is not None and value == default):
            raise _error(f"from_torch: {name}({attribute}=...) is not supported; only the default")
    if name in ("CrossEntropyLoss", "NLLLoss") and getattr(loss, "ignore_index", -100) != -100:
        raise _error(f"from_torch: {name}(ignore_index={loss.ignore_index}) is not supported; only the default")
    return {"loss": SUPPORTED_LOSSES[name], "reduction": reduction}


def _parameter_names(module: Any) -> dict[int, list[str]]:
    """Every name of each parameter (shared parameters have several), by id()."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def _optimizer_options(optimizer: Any, names: dict[int, list[str]], initializers: set[str],
                       scheduled: bool) -> tuple[dict[str, Any], list[str]]:
    """make_trainable's optimizer and param_groups; and the names of the trained parameters."""
    torch = _torch()
    kind = type(optimizer).__name__
    if kind not in SUPPORTED_OPTIMIZERS or not isinstance(optimizer, torch.optim.Optimizer):
        raise _error(f"from_torch: optimizer {kind} is not supported; supported: torch.optim."
                     + ", torch.optim.".join(SUPPORTED_OPTIMIZERS))
    # Adagrad fills its state at construction (step 0); the others at their first step.
    if any(s and float(s.get("step", 1)) > 0 for s in optimizer.state.values()):
        raise _error(f"from_torch: the {kind} optimizer has already taken steps (its state is not empty); "
                     "from_torch starts training at step 0: pass a new optimizer")
    optimizer_name = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw", "Adagrad": "adagrad"}[kind]
    groups, trained = [], []
    for index, group in enumerate(optimizer.param_groups):
        where = f"from_torch: {kind} param_groups[{index}]"
        for flag in ("maximize", "amsgrad"):
            if group.get(flag, False):
                raise _error(f"{where}: {flag}=True is not supported")
        if kind == "Adam" and group.get("decoupled_weight_decay", False):
            optimizer_name = "adamw"
        params = []
        for p in group["params"]:
            if not p.requires_grad:
                continue
            candidates = names.get(id(p))
            if candidates is None:
                raise _error(f"{where}: a parameter of shape {list(p.shape)} is not a parameter of the module")
            found = [n for n in candidates if n in initializers]
            if not found:
                raise _error(f"{where}: parameter '{candidates[0]}' is not an initializer of the exported model "
                             "(the exporter folded or renamed it)")
            params.append(found[0])
        if not params:
            continue
        # The learning rate a scheduler started from (it may have set group["lr"] already).
        lr = group["initial_lr"] if scheduled and "initial_lr" in group else group["lr"]
        entry: dict[str, Any] = {"params": params, "lr": float(lr), "weight_decay": float(group["weight_decay"])}
        if kind == "SGD":
            entry.update(momentum=float(group["momentum"]), dampening=float(group["dampening"]),
                         nesterov=bool(group["nesterov"]))
        elif kind in ("Adam", "AdamW"):
            entry.update(beta1=float(group["betas"][0]), beta2=float(group["betas"][1]), eps=float(group["eps"]))
        else:
            # PyTorch fills every group's sum with the optimizer's default, whatever the group says.
            entry.update(eps=float(group["eps"]), lr_decay=float(group["lr_decay"]),
                         initial_accumulator_value=float(optimizer.defaults["initial_accumulator_value"]))
        for key in ("max_lr", "base_momentum", "max_momentum"):  # OneCycleLR's per-group values
            if key in group:
                entry[key] = float(group[key])
        groups.append(entry)
        trained += params
    if not groups:
        raise _error(f"from_torch: the {kind} optimizer has no parameter that requires a gradient")
    if len(set(trained)) != len(trained):
        raise _error(f"from_torch: a parameter is in two param_groups of the {kind} optimizer")
    return {"optimizer": optimizer_name, "lr": groups[0]["lr"], "param_group": groups}, trained


def _scheduler_options(scheduler: Any, optimizer: Any, nested: bool = False) -> dict[str, Any]:
    """make_trainable's schedule options (the names of LrScheduler's fields) for a scheduler."""
    kind = type(scheduler).__name__
    supported = SUPPORTED_SCHEDULERS if not nested else [s for s in SUPPORTED_SCHEDULERS
                                                          if s not in ("OneCycleLR", "SequentialLR")]
    if kind not in supported:
        raise _error(f"from_torch: lr_scheduler {kind} is not supported"
                     + (" inside SequentialLR" if nested else "")
                     + "; supported: torch.optim.lr_scheduler." + ", torch.optim.lr_scheduler.".join(supported))
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise _error(f"from_torch: lr_scheduler {kind} belongs to another optimizer")
    if not nested and scheduler.last_epoch != 0:
        raise _error(f"from_torch: lr_scheduler {kind} has already stepped (last_epoch {scheduler.last_epoch}); "
                     "pass a new scheduler")
    if kind == "StepLR":
        return {"lr_schedule": "step", "step_size": scheduler.step_size, "gamma": scheduler.gamma}
    if kind == "MultiStepLR":
        return {"lr_schedule": "multistep", "milestones": sorted(scheduler.milestones.elements()),
                "gamma": scheduler.gamma}
    if kind == "ExponentialLR":
        return {"lr_schedule": "exponential", "gamma": scheduler.gamma}
    if kind == "ConstantLR":
        return {"lr_schedule": "constant", "factor": scheduler.factor, "total_iters": scheduler.total_iters}
    if kind == "LinearLR":
        return {"lr_schedule": "linear", "start_factor": scheduler.start_factor,
                "end_factor": scheduler.end_factor, "total_iters": scheduler.total_iters}
    if kind == "PolynomialLR":
        return {"lr_schedule": "polynomial", "total_iters": scheduler.total_iters, "power": scheduler.power}
    if kind == "CosineAnnealingLR":
        return {"lr_schedule": "cosine_annealing", "t_max": scheduler.T_max, "eta_min": scheduler.eta_min}
    if kind == "OneCycleLR":
        phases = scheduler._schedule_phases
        group = scheduler.optimizer.param_groups[0]
        return {"lr_schedule": "onecycle", "total_steps": scheduler.total_steps,
                "pct_start": (phases[0]["end_step"] + 1) / scheduler.total_steps,
                "anneal_strategy": scheduler._anneal_func_type, "three_phase": len(phases) == 3,
                "div_factor": group["max_lr"] / group["initial_lr"],
                "final_div_factor": group["initial_lr"] / group["min_lr"],
                "cycle_momentum": bool(scheduler.cycle_momentum)}
    # SequentialLR
    return {"lr_schedule": "sequential", "milestones": list(scheduler._milestones),
            "scheduler": [_scheduler_options(s, optimizer, nested=True) for s in scheduler._schedulers]}


def _export(module: Any, args: tuple[Any, ...], input_names: Sequence[str], output_names: Sequence[str] | None,
            dynamic_batch: bool, dynamo: bool, opset_version: int | None) -> onnx.ModelProto:
    torch = _torch()
    if dynamo:
        batch_norms = [n for n, m in module.named_modules()
                       if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training]
        if batch_norms:
            raise _error(f"from_torch: dynamo=True exports BatchNormalization in inference mode, but "
                         f"{batch_norms[0]} is in training mode: use dynamo=False (the default) or module.eval()")
        dynamic_shapes = None
        if dynamic_batch:
            batch = torch.export.Dim("N")
            dynamic_shapes = tuple({0: batch} for _ in args)
        program = torch.onnx.export(module, args, dynamo=True, optimize=False, opset_version=opset_version,
                                    input_names=list(input_names), output_names=output_names,
                                    dynamic_shapes=dynamic_shapes)
        exported: onnx.ModelProto = program.model_proto
        return exported
    buffer = io.BytesIO()
    dynamic_axes: dict[str, dict[int, str]] | None = None
    if dynamic_batch:
        dynamic_axes = {name: {0: "N"} for name in list(input_names) + list(output_names or [])}
    with warnings.catch_warnings():
        # PyTorch 2.13 marks the TorchScript exporter and its `training` argument deprecated; it
        # is the exporter that writes BatchNormalization in training mode (see from_torch).
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, args, buffer, dynamo=False, opset_version=opset_version or 17,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          input_names=list(input_names), output_names=output_names, dynamic_axes=dynamic_axes)
    return onnx.load_from_string(buffer.getvalue())


def from_torch(module: Any, example_inputs: Any, *, loss: Any, optimizer: Any, lr_scheduler: Any = None,
               input_names: Sequence[str] | None = None, output_names: Sequence[str] | None = None,
               output_name: str | None = None, label: str = "label", grad_clip_norm: float | None = None,
               dynamic_batch: bool = True, dynamo: bool = False,
               opset_version: int | None = None) -> onnx.ModelProto:
    """The ONNX model of `module` with the training program of `loss`, `optimizer` and
    `lr_scheduler` in its training_info (see docs/python.md "From PyTorch").

    module: a torch.nn.Module on the CPU, float32 or float64 parameters.
    example_inputs: a tensor or a tuple of tensors, as module(*example_inputs) takes them; the
        export traces with them (dim 0 is the batch, symbolic "N" when dynamic_batch).
    loss: a torch.nn loss module (CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, BCEWithLogitsLoss
        with reduction 'mean' or 'sum') or make_trainable's loss name. It reads the module's output
        (output_name when the module has several) and a new graph input `label`.
    optimizer: torch.optim.SGD (momentum, dampening, nesterov, weight_decay), Adam, AdamW or Adagrad
        over (some of) the module's parameters, not yet stepped. Each param_group keeps its own
        hyperparameters; parameters in no group or with requires_grad False stay fixed.
    lr_scheduler: None or, not yet stepped, one of StepLR, MultiStepLR, ExponentialLR, ConstantLR,
        LinearLR, PolynomialLR, CosineAnnealingLR, OneCycleLR (cycle_momentum included), SequentialLR
        of those: the program's step t uses the learning rate PyTorch's optimizer.step() uses
        after t scheduler.step() calls.
    dynamo: export with torch.onnx.export(dynamo=True) instead of the TorchScript exporter; the
        default False keeps BatchNormalization in training mode (the dynamo exporter writes it in
        inference mode).

    Returns an onnx.ModelProto: the exported inference graph plus training_info. Raises
    onnxtrain.Error naming what cannot be expressed (and listing what is supported).
    """
    torch = _torch()
    from onnxtrain import make_trainable

    if not isinstance(module, torch.nn.Module):
        raise _error(f"from_torch: module must be a torch.nn.Module, got {type(module).__name__}")
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if input_names is None:
        input_names = ["input"] if len(args) == 1 else [f"input{i}" for i in range(len(args))]
    options = _loss_options(loss)
    was_training = module.training
    try:
        model = _export(module, args, input_names, output_names, dynamic_batch, dynamo, opset_version)
    finally:
        module.train(was_training)
    initializers = {t.name for t in model.graph.initializer}
    names = _parameter_names(module)
    optimizer_options, trained = _optimizer_options(optimizer, names, initializers, lr_scheduler is not None)
    options.update(optimizer_options)
    if lr_scheduler is not None:
        options.update(_scheduler_options(lr_scheduler, optimizer))
    # Every other floating parameter of the module stays as it is.
    frozen = sorted({n for ns in names.values() for n in ns if n in initializers} - set(trained))
    if frozen:
        options["freeze"] = [re.escape(n) for n in frozen]
    if output_name is not None:
        options["output_name"] = output_name
    if grad_clip_norm is not None:
        options["grad_clip_norm"] = grad_clip_norm
    options["label"] = label
    return make_trainable(model, **options)

"""export_checkpoint: an ONNX training model's state as PyTorch / Hugging Face checkpoint files,
so that PyTorch continues where onnxtrain stopped (see _checkpoint.py for the import)."""
from __future__ import annotations

import json
import os
import shutil
import warnings
from typing import Any

from onnx import numpy_helper

from onnxtrain._checkpoint import _initializers, _model_proto, _schema
from onnxtrain._files import temporary_name
from onnxtrain._from_torch import _error, _torch

_OPTIMIZER_KEYS = {"SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
                   "Adam": ("lr", "betas", "eps", "weight_decay"), "AdamW": ("lr", "betas", "eps", "weight_decay"),
                   "Adagrad": ("lr", "lr_decay", "weight_decay", "eps")}


def _scheduler(spec: dict[str, Any], optimizer: Any, schema: dict[str, Any]) -> Any:
    """The torch.optim.lr_scheduler object of a schema's lr_scheduler entry, on `optimizer`."""
    sched = _torch().optim.lr_scheduler
    kind = spec["type"]
    args = {k: v for k, v in spec.items() if k != "type"}
    simple = {"StepLR": ("step_size", "gamma"), "MultiStepLR": ("milestones", "gamma"), "ExponentialLR": ("gamma",),
              "ConstantLR": ("factor", "total_iters"), "LinearLR": ("start_factor", "end_factor", "total_iters"),
              "PolynomialLR": ("total_iters", "power"), "CosineAnnealingLR": ("T_max", "eta_min")}
    if kind in simple:
        return getattr(sched, kind)(optimizer, **{k: args[k] for k in simple[kind]})
    if kind == "OneCycleLR":
        max_lr = [g.get("max_lr", args.get("max_lr")) for g in schema["param_groups"]]
        return sched.OneCycleLR(optimizer, max_lr=max_lr, total_steps=args["total_steps"], pct_start=args["pct_start"],
                                anneal_strategy=args["anneal_strategy"], cycle_momentum=args["cycle_momentum"],
                                base_momentum=[g.get("base_momentum", args["base_momentum"]) for g in schema["param_groups"]],
                                max_momentum=[g.get("max_momentum", args["max_momentum"]) for g in schema["param_groups"]],
                                div_factor=args["div_factor"], final_div_factor=args["final_div_factor"],
                                three_phase=args["three_phase"])
    if kind == "SequentialLR":
        inner = [_scheduler(s, optimizer, schema) for s in args["schedulers"]]
        return sched.SequentialLR(optimizer, inner, milestones=args["milestones"])
    raise _error(f"export_checkpoint: the program's schedule {kind} has no torch.optim.lr_scheduler class")


def torch_state(model: Any) -> tuple[dict[str, Any], Any, Any, dict[str, Any]]:
    """PyTorch's objects for a training model's state: (the weights as tensors by name, the
    torch.optim optimizer over them with its state, the lr_scheduler at the program's step or
    None, the training metadata). The optimizer and scheduler are built from the metadata and
    hold exactly what the model holds; their state_dict() is what export_checkpoint saves."""
    torch = _torch()
    proto = _model_proto(model)
    schema = _schema(proto, "export_checkpoint")
    inits = _initializers(proto)
    done = int(numpy_helper.to_array(inits[schema["step_counter"]]))
    schema.setdefault("progress", {})["global_step"] = done
    weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in proto.graph.initializer
               if not t.name.startswith("onnxtrain.") and "::" not in t.name}
    kind = schema["optimizer"]["type"]
    params = {n: torch.nn.Parameter(weights[n]) for g in schema["param_groups"] for n in g["params"]}
    groups = []
    for g in schema["param_groups"]:
        entry = {k: (tuple(g[k]) if k == "betas" else g[k]) for k in _OPTIMIZER_KEYS[kind]}
        groups.append({"params": [params[n] for n in g["params"]], **entry})
    extra = {}
    if kind == "Adagrad":
        extra["initial_accumulator_value"] = schema["param_groups"][0].get("initial_accumulator_value", 0.0)
    optimizer = getattr(torch.optim, kind)(groups, **extra)
    scheduler = None
    if schema.get("warmup_steps"):
        raise _error("export_checkpoint: the program's warmup_steps has no torch.optim.lr_scheduler equivalent")
    if schema.get("lr_scheduler") is not None:
        scheduler = _scheduler(schema["lr_scheduler"], optimizer, schema)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
            for _ in range(done):
                scheduler.step()
    if done > 0 or kind == "Adagrad":
        for name, p in params.items():
            entry = {key: torch.from_numpy(numpy_helper.to_array(inits[init]).copy())
                     for key, init in schema["state"].get(name, {}).items()}
            if kind in ("Adam", "AdamW", "Adagrad"):
                entry["step"] = torch.tensor(float(done), dtype=torch.float32)
            if entry:
                optimizer.state[p] = entry
    return weights, optimizer, scheduler, schema


def export_checkpoint(model: Any, folder: str | os.PathLike[str], *, overwrite: bool = False) -> dict[str, str]:
    """Writes a training model's state as a Hugging Face Trainer-style checkpoint folder that
    plain PyTorch reads too:

    - model.safetensors: the graph's initializers (the module's state_dict keys; the program's
      own "onnxtrain.*" tensors and exporter constants named "onnx::..." left out);
    - optimizer.pt: torch.optim's state_dict (SGD momentum_buffer, Adam/AdamW exp_avg,
      exp_avg_sq and step, Adagrad sum and step) for the program's optimizer and param_groups,
      loadable with torch.load(weights_only=True) into an optimizer built over the module's
      parameters in the order the metadata lists them;
    - scheduler.pt: the lr_scheduler's state_dict at the program's step (when it has a schedule);
    - trainer_state.json: global_step and epoch (TrainerState's keys), and
      onnxtrain_training.json: the model's training metadata.

    model: an onnx.ModelProto, a path or a TrainingSession with the training metadata. The
    folder is written whole or not at all (a temporary folder renamed into place); an existing
    non-empty folder is an Error unless overwrite. Returns the written files by role.
    """
    torch = _torch()
    from safetensors.torch import save_file

    folder = os.fspath(folder)
    if os.path.exists(folder) and (not os.path.isdir(folder) or (os.listdir(folder) and not overwrite)):
        raise _error(f"export_checkpoint: {folder} exists and is not an empty folder (overwrite=True replaces it)")
    weights, optimizer, scheduler, schema = torch_state(model)
    scratch = temporary_name(folder)  # <folder>.tmp-PID-N; stale ones of dead writers go
    os.mkdir(scratch)
    try:
        files = {"weights": "model.safetensors", "optimizer": "optimizer.pt", "trainer_state": "trainer_state.json",
                 "metadata": "onnxtrain_training.json"}
        save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(scratch, files["weights"]),
                  metadata={"format": "pt"})
        torch.save(optimizer.state_dict(), os.path.join(scratch, files["optimizer"]))
        if scheduler is not None:
            files["scheduler"] = "scheduler.pt"
            torch.save(scheduler.state_dict(), os.path.join(scratch, files["scheduler"]))
        progress = schema.get("progress", {})
        state = {"global_step": int(progress.get("global_step") or 0), "epoch": float(progress.get("epochs_done") or 0),
                 "max_steps": 0, "log_history": [], "train_batch_size": progress.get("batch_size")}
        with open(os.path.join(scratch, files["trainer_state"]), "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2)
        with open(os.path.join(scratch, files["metadata"]), "w", encoding="utf-8") as f:
            json.dump(schema, f, indent=2)
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        os.replace(scratch, folder)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return {role: os.path.join(folder, name) for role, name in files.items()}


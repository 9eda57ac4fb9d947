"""Training state in and out: PyTorch and Hugging Face checkpoints <-> an ONNX training model.

The model's metadata_props "onnxtrain.training" (docs/training-info-extensions.md) names the
optimizer, each param_group's parameters in PyTorch's order, the initializer that holds each
parameter's optimizer state under PyTorch's state key, the iteration counter and the schedule,
so neither direction guesses a name. Files PyTorch wrote are read with
torch.load(weights_only=True) (no arbitrary unpickling) or with the safetensors package;
training_args.bin (a pickle) is never read.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain._from_torch import _error, _torch

METADATA_KEY = "onnxtrain.training"
SCHEMA_VERSION = 1
# PyTorch's param_groups keys the program's hyperparameters are compared on, per optimizer.
_HYPER = {"SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
          "Adam": ("lr", "betas", "eps", "weight_decay"), "AdamW": ("lr", "betas", "eps", "weight_decay"),
          "Adagrad": ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps")}
# The scheduler arguments a state_dict records under the same names as the schema.
_SCHEDULER_ARGS = ("step_size", "gamma", "factor", "total_iters", "start_factor", "end_factor", "power",
                   "T_max", "eta_min", "total_steps")


def _model_proto(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    if hasattr(model, "model") and callable(model.model):  # a TrainingSession
        return model.model()  # type: ignore[no-any-return]
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    raise _error(f"expected an onnx.ModelProto, a path or a TrainingSession, got {type(model).__name__}")


def training_metadata(model: Any) -> dict[str, Any] | None:
    """The model's training metadata (metadata_props "onnxtrain.training") as a dict, or None
    when the model has none. `model`: an onnx.ModelProto, a path or a TrainingSession. Raises
    onnxtrain.Error when the value is not JSON of schema_version 1."""
    proto = model if isinstance(model, onnx.ModelProto) else _model_proto(model)
    for entry in proto.metadata_props:
        if entry.key == METADATA_KEY:
            try:
                value = json.loads(entry.value)
            except json.JSONDecodeError as e:
                raise _error(f"metadata_props {METADATA_KEY} is not JSON: {e}") from None
            if not isinstance(value, dict) or value.get("schema_version") != SCHEMA_VERSION:
                raise _error(f"metadata_props {METADATA_KEY}: schema_version must be {SCHEMA_VERSION}")
            return value
    return None


def _schema(model: onnx.ModelProto, source: str) -> dict[str, Any]:
    schema = training_metadata(model)
    if schema is None:
        raise _error(f"{source}: the model has no metadata_props {METADATA_KEY} (write it with make_trainable, "
                     "from_torch or `onnxtrain make-trainable` of onnxtrain 0.1 or later)")
    return schema


def _set_metadata(model: onnx.ModelProto, schema: dict[str, Any]) -> None:
    text = json.dumps(schema, separators=(",", ":"))
    for entry in model.metadata_props:
        if entry.key == METADATA_KEY:
            entry.value = text
            return
    model.metadata_props.add(key=METADATA_KEY, value=text)


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Every initializer the program can bind: the graph's and the algorithms'."""
    found = {t.name: t for t in model.graph.initializer}
    for info in model.training_info:
        for t in info.algorithm.initializer:
            found.setdefault(t.name, t)
    return found


def _load_torch_file(path: str, what: str) -> Any:
    torch = _torch()
    if not os.path.isfile(path):
        raise _error(f"{what} {path}: no such file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError for refused globals, RuntimeError for corrupt zips
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _error(f"{what} {path}: not loadable with torch.load(weights_only=True) "
                     f"(only tensors and plain containers are read, never arbitrary objects): {first}") from None


def load_weights(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """A state_dict file as NumPy arrays by key: .safetensors (the safetensors package) or a
    PyTorch .pt/.pth/.bin file (torch.load(weights_only=True); a mapping of tensors, possibly
    under "state_dict"). Raises onnxtrain.Error naming the file."""
    path = os.fspath(path)
    tensors: Any
    if path.endswith(".safetensors"):
        if not os.path.isfile(path):
            raise _error(f"weights {path}: no such file")
        from safetensors.torch import load_file
        try:
            tensors = load_file(path)
        except Exception as e:
            raise _error(f"weights {path}: not a valid safetensors file: {e}") from None
    else:
        tensors = _load_torch_file(path, "weights")
        if isinstance(tensors, Mapping) and isinstance(tensors.get("state_dict"), Mapping):
            tensors = tensors["state_dict"]
    torch = _torch()
    if not isinstance(tensors, Mapping) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise _error(f"weights {path}: expected a state_dict (a mapping of names to tensors)")
    return {str(k): v.detach().cpu().numpy() for k, v in tensors.items()}


def _as_init(array: Any, target: onnx.TensorProto, what: str) -> onnx.TensorProto:
    """`array` as an initializer replacing `target`: same shape, target's element type."""
    torch = _torch()
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().numpy()
    array = np.asarray(array)
    shape = tuple(target.dims)
    if array.shape != shape:
        raise _error(f"{what}: shape {list(array.shape)} does not match initializer '{target.name}' "
                     f"of shape {list(shape)}")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(target.data_type)
    if array.dtype.kind != np.dtype(dtype).kind:
        raise _error(f"{what}: element type {array.dtype} does not fit initializer '{target.name}' ({dtype})")
    return numpy_helper.from_array(np.array(array, dtype=dtype, order="C"), target.name)


def _optimizer_type(groups: list[Mapping[str, Any]], source: str) -> str:
    """PyTorch's optimizer class that wrote a state_dict's param_groups."""
    keys = set(groups[0]) if groups else set()
    if {"momentum", "dampening", "nesterov"} <= keys:
        return "SGD"
    if {"lr_decay", "initial_accumulator_value"} <= keys:
        return "Adagrad"
    if "betas" in keys:
        # torch.optim.AdamW records decoupled_weight_decay True (Adam's is False).
        return "AdamW" if groups[0].get("decoupled_weight_decay") else "Adam"
    raise _error(f"{source}: unknown optimizer: param_groups[0] has keys {sorted(keys)}; supported: "
                 "torch.optim.SGD, Adam, AdamW, Adagrad")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    except (TypeError, ValueError):
        return bool(a == b)


def _number(value: Any) -> Any:
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


class _Import:
    """One import: the model being written and the steps each file says were done."""

    def __init__(self, model: onnx.ModelProto, source: str) -> None:
        self.model = model
        self.source = source
        self.schema = _schema(model, source)
        self.inits = _initializers(model)
        self.steps: dict[str, int] = {}  # where a step count came from -> the count

    def put(self, name: str, array: Any, what: str) -> None:
        target = self.inits.get(name)
        if target is None:
            raise _error(f"{self.source}: the training metadata names initializer '{name}', which the model lacks")
        target.CopyFrom(_as_init(array, target, what))

    def weights(self, tensors: Mapping[str, Any], where: str, strict: bool) -> None:
        trainable = [n for g in self.schema["param_groups"] for n in g["params"]]
        missing = [n for n in trainable if n not in tensors]
        if missing:
            raise _error(f"weights {where}: missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                         "(trained parameters of the model)")
        graph = {t.name for t in self.model.graph.initializer}
        unknown = [k for k in tensors if k not in graph and not k.endswith("num_batches_tracked")]
        if unknown and strict:
            raise _error(f"weights {where}: unexpected keys {unknown[:5]}{' ...' if len(unknown) > 5 else ''} "
                         "(no initializer of the model has the name; strict=False skips them)")
        for key, value in tensors.items():
            if key in graph:
                self.put(key, value, f"weights {where}: '{key}'")

    def optimizer(self, state_dict: Any, where: str, param_names: list[list[str]] | None) -> None:
        if not isinstance(state_dict, Mapping) or "state" not in state_dict or "param_groups" not in state_dict:
            raise _error(f"optimizer {where}: expected an optimizer state_dict (keys 'state' and 'param_groups')")
        groups = list(state_dict["param_groups"])
        kind = _optimizer_type(groups, f"optimizer {where}")
        expected = self.schema["optimizer"]["type"]
        if kind != expected:
            raise _error(f"optimizer {where}: a torch.optim.{kind} state_dict, but the model's program is {expected}")
        schema_groups = self.schema["param_groups"]
        if len(groups) != len(schema_groups):
            raise _error(f"optimizer {where}: {len(groups)} param_groups, the model's program has {len(schema_groups)}")
        self._check_hyperparameters(kind, groups, schema_groups, where)
        state = state_dict["state"]
        steps: set[int] = set()
        for k, (group, mine) in enumerate(zip(groups, schema_groups)):
            names = param_names[k] if param_names is not None else mine["params"]
            if len(group["params"]) != len(names):
                raise _error(f"optimizer {where}: param_groups[{k}] has {len(group['params'])} params, the model's "
                             f"param_groups[{k}] {len(names)} ({names[:3]}...)")
            for index, name in zip(group["params"], names):
                entry = state.get(index)
                if not entry:
                    continue  # not stepped yet: the program's initial state is PyTorch's too
                for key, init in self.schema["state"].get(name, {}).items():
                    if entry.get(key) is None:
                        raise _error(f"optimizer {where}: state[{index}] ('{name}') lacks '{key}'")
                    self.put(init, entry[key], f"optimizer {where}: state[{index}]['{key}'] ('{name}')")
                if "step" in entry:
                    steps.add(int(_number(entry["step"])))
        if len(steps) > 1:
            raise _error(f"optimizer {where}: the parameters' 'step' differ ({sorted(steps)}); the program has one "
                         "iteration counter for all")
        if steps:
            self.steps[f"optimizer {where} state 'step'"] = steps.pop()

    def _check_hyperparameters(self, kind: str, groups: list[Mapping[str, Any]],
                               schema_groups: list[Mapping[str, Any]], where: str) -> None:
        differences = []
        for k, (group, mine) in enumerate(zip(groups, schema_groups)):
            for key in _HYPER[kind]:
                theirs = group.get("initial_lr", group.get("lr")) if key == "lr" else group.get(key)
                if key == "initial_accumulator_value" and key not in group:
                    continue
                if key in mine and not _same(theirs, mine[key]):
                    differences.append(f"param_groups[{k}].{key}: checkpoint {theirs}, program {mine[key]}")
        if differences:
            raise _error(f"optimizer {where}: the hyperparameters differ from the model's program: "
                         + "; ".join(differences) + " (write the program with the checkpoint's: make_trainable "
                         "or from_torch with replace=True)")

    def scheduler(self, state_dict: Any, where: str) -> None:
        if not isinstance(state_dict, Mapping) or "last_epoch" not in state_dict:
            raise _error(f"scheduler {where}: expected an lr_scheduler state_dict (key 'last_epoch')")
        mine = self.schema.get("lr_scheduler")
        if "lr_lambdas" not in state_dict:  # LambdaLR (Hugging Face's schedules) records no arguments
            if mine is None:
                raise _error(f"scheduler {where}: the model's program has no schedule (make it with lr_scheduler=)")
            differences = [f"{key}: checkpoint {state_dict[key]}, program {mine[key]}"
                           for key in _SCHEDULER_ARGS if key in state_dict and key in mine
                           and not _same(state_dict[key], mine[key])]
            if mine.get("type") == "MultiStepLR" and "milestones" in state_dict:
                theirs = sorted(int(m) for m, n in dict(state_dict["milestones"]).items() for _ in range(n))
                if theirs != sorted(mine["milestones"]):
                    differences.append(f"milestones: checkpoint {theirs}, program {mine['milestones']}")
            if differences:
                raise _error(f"scheduler {where}: differs from the model's {mine.get('type')}: " + "; ".join(differences))
        base = state_dict.get("base_lrs")
        if base is not None:
            program = [g["lr"] for g in self.schema["param_groups"]]
            if len(base) == len(program) and not _same(list(base), program) and (mine or {}).get("type") != "OneCycleLR":
                raise _error(f"scheduler {where}: base_lrs {list(base)} differ from the program's lr {program}")
        self.steps[f"scheduler {where} last_epoch"] = int(state_dict["last_epoch"])

    def finish(self, step: int | None, progress: dict[str, Any], sources: list[str]) -> onnx.ModelProto:
        if step is not None:
            self.steps["step="] = int(step)
        if len(set(self.steps.values())) > 1:
            raise _error("the checkpoint's step counts differ: "
                         + ", ".join(f"{where} {n}" for where, n in self.steps.items()))
        counter = self.schema["step_counter"]
        momenta = [n for s in self.schema["state"].values() for n in s.values()]
        if not self.steps:
            if self.schema["optimizer"]["type"] == "SGD" and sources and any(
                    numpy_helper.to_array(self.inits[n]).any() for n in momenta if n in self.inits):
                raise _error("the checkpoint does not record how many steps were done (torch.optim.SGD keeps no "
                             "step count, and there is no scheduler): pass step= (--step)")
            done = 0
        else:
            done = next(iter(self.steps.values()))
        self.put(counter, np.array(done, dtype=np.int64), "the step count")
        record = self.schema.setdefault("progress", {})
        record["global_step"] = done
        record.update({k: v for k, v in progress.items() if v is not None})
        self.schema.setdefault("history", []).append({"by": "import-checkpoint", "sources": sources})
        _set_metadata(self.model, self.schema)
        return self.model


def import_checkpoint(model: Any, *, weights: str | os.PathLike[str] | None = None,
                      optimizer: str | os.PathLike[str] | None = None,
                      scheduler: str | os.PathLike[str] | None = None,
                      hf_folder: str | os.PathLike[str] | None = None, step: int | None = None,
                      param_names: list[list[str]] | None = None, strict: bool = True) -> onnx.ModelProto:
    """The training model `model` with a PyTorch or Hugging Face checkpoint's state in it.

    model: an onnx.ModelProto (not changed), a path or a TrainingSession, with the training
        metadata make_trainable / from_torch write (metadata_props "onnxtrain.training").
    weights: a state_dict file (.safetensors, or .pt/.pth/.bin read with
        torch.load(weights_only=True)): each key names an initializer (from_torch's export keeps
        the module's state_dict keys). Every trained parameter must be there (missing keys are an
        Error); keys that name no initializer are an Error unless strict=False
        (`num_batches_tracked` is always skipped: ONNX's BatchNormalization has no such counter).
    optimizer: an optimizer state_dict file (torch.optim.SGD, Adam, AdamW or Adagrad). Its
        param_groups must match the program's: same count, same number of params per group
        (mapped by position to the group's parameter names in the metadata, or to param_names),
        same hyperparameters (a difference is an Error listing them: rewrite the program with the
        checkpoint's values first). momentum_buffer, exp_avg, exp_avg_sq and sum go to the
        initializers the metadata names; Adam's and Adagrad's per-parameter 'step' must be equal.
    scheduler: an lr_scheduler state_dict file: its arguments must equal the program's schedule
        (a LambdaLR, as Hugging Face's Trainer writes, records none: only base_lrs are checked);
        last_epoch is the number of steps done.
    hf_folder: a Hugging Face Trainer checkpoint folder: model.safetensors (or pytorch_model.bin),
        optimizer.pt, scheduler.pt and trainer_state.json (global_step, epoch) when present.
        training_args.bin, a pickle, is not read.
    step: the number of optimizer steps done, when no file records it (SGD without a scheduler).

    The iteration counter gets the steps done (every source must agree). The metadata records the
    import (progress.global_step, epochs_done from trainer_state.json, history). Returns a new
    onnx.ModelProto; raises onnxtrain.Error naming the file and key for bad input.
    """
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else "model"
    job = _Import(_model_proto(model), source)
    progress: dict[str, Any] = {}
    sources: list[str] = []
    if hf_folder is not None:
        folder = os.fspath(hf_folder)
        if not os.path.isdir(folder):
            raise _error(f"hf_folder {folder}: not a folder")
        for name in ("model.safetensors", "pytorch_model.bin"):
            if weights is None and os.path.isfile(os.path.join(folder, name)):
                weights = os.path.join(folder, name)
        if optimizer is None and os.path.isfile(os.path.join(folder, "optimizer.pt")):
            optimizer = os.path.join(folder, "optimizer.pt")
        if scheduler is None and os.path.isfile(os.path.join(folder, "scheduler.pt")):
            scheduler = os.path.join(folder, "scheduler.pt")
        state_path = os.path.join(folder, "trainer_state.json")
        if os.path.isfile(state_path):
            try:
                with open(state_path, encoding="utf-8") as f:
                    trainer_state = json.load(f)
                job.steps[f"{state_path} global_step"] = int(trainer_state["global_step"])
                progress["epochs_done"] = int(math.floor(float(trainer_state.get("epoch") or 0)))
                progress["batch_size"] = trainer_state.get("train_batch_size")
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise _error(f"{state_path}: not a Trainer state (global_step, epoch): {e}") from None
            sources.append(state_path)
        if weights is None:
            raise _error(f"hf_folder {folder}: no model.safetensors or pytorch_model.bin")
    if weights is not None:
        job.weights(load_weights(weights), os.fspath(weights), strict)
        sources.append(os.fspath(weights))
    if optimizer is not None:
        job.optimizer(_load_torch_file(os.fspath(optimizer), "optimizer"), os.fspath(optimizer), param_names)
        sources.append(os.fspath(optimizer))
    if scheduler is not None:
        job.scheduler(_load_torch_file(os.fspath(scheduler), "scheduler"), os.fspath(scheduler))
        sources.append(os.fspath(scheduler))
    return job.finish(step, progress, sources)

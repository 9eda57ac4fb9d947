"""Checked by mypy (test_typing.py), never run: the package's types as a user meets them.

Each `# type: ignore[code]` marks a line that must be a type error; mypy --strict warns about
an ignore that is not needed, so a stub that accepts these lines fails the test.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx

import onnxtrain


def inference(model: onnx.ModelProto) -> npt.NDArray[np.float32]:
    session = onnxtrain.InferenceSession(model, threads=2, seed=1)
    names: list[str] = [i.name for i in session.inputs]
    shape = session.inputs[0].shape
    if shape is not None:
        dims: list[int | str | None] = list(shape)
        del dims
    dtype: np.dtype[Any] | None = session.outputs[0].dtype
    del dtype
    name: int = session.outputs[0].name  # type: ignore[assignment]
    del name
    out = session.run({names[0]: np.zeros((1, 4), np.float32)})
    y: npt.NDArray[np.float32] = out["y"]
    return y


def training(path: pathlib.Path) -> float:
    model = onnxtrain.make_trainable(path, optimizer="adam", lr=1e-3, freeze=["bias"])
    session = onnxtrain.TrainingSession(model, seed=0, threads=None)
    session.initialize()
    out = session.step({"x": [[0.0] * 4], "label": [1]})
    session.set_state("w", np.zeros(3, np.float32))
    session.set_state({"w": np.zeros(3, np.float32)})
    session.steps_done = session.steps_done + 1
    session.save(path, metadata={"k": "v"})
    inference_model: onnx.ModelProto = onnxtrain.export_inference(session.model())
    del inference_model
    state: dict[str, npt.NDArray[np.float32]] = session.state
    del state
    session.state = {}  # type: ignore[misc]
    return float(out["onnxtrain.loss"])


def errors(model: onnx.ModelProto) -> None:
    onnxtrain.InferenceSession(model, 4)  # type: ignore[call-arg]
    onnxtrain.InferenceSession(3.5)  # type: ignore[arg-type]
    onnxtrain.TrainingSession(model).save(3)  # type: ignore[arg-type]
    onnxtrain.TrainingSession(model).steps_done = "3"  # type: ignore[assignment]
    try:
        onnxtrain.InferenceSession(model).run({})
    except onnxtrain.Error as e:
        error: ValueError = e
        del error

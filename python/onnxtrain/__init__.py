"""onnxtrain: runs and trains ONNX models as the ONNX standard describes training.

A thin layer over onnxtrain's C++ library (the extension module ``onnxtrain._core``):

- :class:`InferenceSession` runs a model's inference graph;
- :class:`TrainingSession` runs its ``training_info`` (TrainingInfoProto): ``initialize``,
  ``step``, ``infer``, the mutable variables as ``state``, ``save``;
- :func:`make_trainable` adds the standard training program (loss, Gradient, optimizer,
  learning-rate schedule) to an inference model, :func:`export_inference` drops it again;
- :func:`train` trains a model on a dataset or any iterable of batches (a DataLoader);
- :func:`from_torch` turns a PyTorch module, loss, optimizer and learning-rate scheduler into
  a model whose training program trains as PyTorch would;
- :func:`import_checkpoint` / :func:`export_checkpoint` move weights, optimizer state and the
  schedule's position between a training model and PyTorch / Hugging Face checkpoints;
  :func:`training_metadata` reads the hyperparameters and provenance the model records;
- :class:`Error` (a ``ValueError``) reports bad input with the command-line tool's message.

Arrays: NumPy in and out; PyTorch CPU tensors and any DLPack or buffer-protocol array in;
``ml_dtypes`` types for bfloat16, float8, int4, float4 and float6. See docs/python.md.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any

# libgomp reads its wait policy when the extension module loads it, so it is chosen here, as the
# `onnxtrain` command chooses it (src/cli/wait_policy.h; docs/performance.md, "Shared cores"),
# unless the user chose a policy: a long spin (30000 pauses) where the sessions' thread count
# follows the load (they drop to one thread when another process keeps a CPU busy), a short one
# (1000) where OMP_NUM_THREADS fixes it. A session given `threads` keeps the long spin: on a CPU
# another process holds, 2 threads then train slower than 1 (docs/python.md).
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000" if "OMP_NUM_THREADS" in os.environ else "30000")

from onnxtrain import _core  # noqa: E402 (after the OpenMP setting above)
from onnxtrain._core import Error, InferenceSession, TrainingSession, ValueInfo, export_inference
from onnxtrain._checkpoint import import_checkpoint, training_metadata
from onnxtrain._checkpoint_export import export_checkpoint
from onnxtrain._from_torch import from_torch
from onnxtrain._train import TrainEvent, TrainResult, train

if TYPE_CHECKING:
    import onnx

    from onnxtrain._core import Model

__all__ = [
    "Error",
    "InferenceSession",
    "TrainEvent",
    "TrainResult",
    "TrainingSession",
    "ValueInfo",
    "export_checkpoint",
    "export_inference",
    "from_torch",
    "import_checkpoint",
    "make_trainable",
    "train",
    "training_metadata",
]

__version__ = "0.1.0"


def make_trainable(model: Model, **options: Any) -> onnx.ModelProto:
    # The docstring is _core.make_trainable's (it lists the options from the C++ table).
    loss_graph = options.get("loss_graph")
    if loss_graph is None or isinstance(loss_graph, (str, os.PathLike)):
        return _core.make_trainable(model, **options)
    # A loss graph in memory (an onnx.ModelProto): the C++ option is a path, so it goes through
    # a temporary file, removed afterwards.
    with tempfile.TemporaryDirectory(prefix="onnxtrain-") as folder:
        path = os.path.join(folder, "loss_graph.onnx")
        with open(path, "wb") as f:
            f.write(loss_graph.SerializeToString())
        return _core.make_trainable(model, **{**options, "loss_graph": path})


make_trainable.__doc__ = _core.make_trainable.__doc__

"""onnxtrain.train: the training loop of ``onnxtrain train``, from Python, on a dataset path,
a dict of arrays or any iterable of batches (a ``torch.utils.data.DataLoader``, a list of
dicts, a generator).

The loop itself is C++ (include/onnxtrain/trainer.h, bound as ``onnxtrain._core._train``);
this module turns the keyword arguments into its options, draws the progress bar and calls the
callbacks.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional, TypeVar, Union

import numpy

from . import _core
from ._core import Error

if TYPE_CHECKING:
    import onnx

    from ._core import Model

__all__ = ["train", "TrainResult", "TrainEvent"]

PathLike = Union[str, "os.PathLike[str]"]
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class TrainEvent:
    """What a callback receives.

    ``kind`` is ``"step"`` (after every step), ``"eval"`` (after every evaluation) or
    ``"epoch_end"`` (after each epoch's checkpoint and evaluation). Epochs and batches count
    from 0; ``step`` is the number of steps done in all (this one included, and those before a
    resume). Fields that do not apply to the kind are None.
    """

    kind: str
    epoch: int
    step: int
    batch: Optional[int] = None  #: step: the batch within the epoch (from 0)
    total: Optional[int] = None  #: step: the steps the run takes, when known
    batches: Optional[int] = None  #: step: batches per epoch, when known
    loss: Optional[float] = None  #: step: the model's onnxtrain.loss output (NaN without one)
    lr: Optional[float] = None  #: step: the model's onnxtrain.lr output, when it has one
    steps_per_s: Optional[float] = None  #: step: steps of this run per second so far
    test_loss: Optional[float] = None  #: eval: mean cross-entropy over the eval batches
    test_accuracy: Optional[float] = None  #: eval: fraction of samples classified right
    epoch_end: Optional[bool] = None  #: eval: after the epoch's last batch (else eval_every or a stop)
    checkpoint: Optional[str] = None  #: epoch_end: the checkpoint just written (None: none)


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns.

    ``model`` is the trained model (an ``onnx.ModelProto`` with its training_info, made on first
    use from the session the run ended with, which the result keeps until then), with the
    metadata_props the output is written with: the training metadata ("onnxtrain.training",
    :func:`training_metadata`) with its progress (global_step, epochs_done, batch_size, seed,
    data) updated, also when no output is written.
    """

    steps: int  #: steps run in all (those before a resume included)
    last_loss: float  #: onnxtrain.loss of the last step (NaN when the model has none)
    test_loss: Optional[float]  #: mean cross-entropy of the last evaluation (None: no evaluation)
    test_accuracy: Optional[float]  #: accuracy of the last evaluation (None: no evaluation)
    interrupted: bool  #: Ctrl-C (or another signal's exception) stopped the run
    stopped_early: bool  #: a callback returned True
    checkpoint: Optional[str]  #: the last checkpoint written (None: none)
    output: Optional[str]  #: the trained model's file (None: not written)
    _trained: Optional[_core._Trained] = dataclasses.field(default=None, repr=False, compare=False)
    _model: Optional[onnx.ModelProto] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def model(self) -> onnx.ModelProto:
        """The trained model as an ``onnx.ModelProto`` (with training_info)."""
        if self._model is None:
            assert self._trained is not None
            self._model = self._trained.model()
        return self._model


def train(
    model: Model,
    train_data: Any,
    eval_data: Any = None,
    *,
    output: Optional[PathLike] = None,
    epochs: int = 1,
    batch_size: int = 32,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    max_steps: int = 0,
    eval_every: int = 0,
    map: Union[Mapping[str, str], Sequence[str], None] = None,
    scale: Union[Mapping[str, Union[float, str]], Sequence[str], None] = None,
    metrics: Optional[PathLike] = None,
    checkpoint_every: int = 0,
    checkpoint: Optional[PathLike] = None,
    resume: Optional[PathLike] = None,
    initialize: bool = False,
    export_inference: Optional[PathLike] = None,
    threads: Optional[int] = None,
    collective_timeout: float = 600.0,
    checksum_every: int = 0,
    sync_batch_norm: bool = False,
    shard_optimizer_state: bool = False,
    progress: Union[bool, str, None] = None,
    callbacks: Union[Callable[[TrainEvent], object], Any, Iterable[Any], None] = None,
) -> TrainResult:
    """Trains a model that carries training_info, as ``onnxtrain train`` does.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        A model with training_info (see :func:`onnxtrain.make_trainable`).
    train_data : str, os.PathLike, dict of arrays, or iterable of batches
        A dataset path as the CLI's ``--data`` takes (a folder of IDX or .npy files, a .npz or a
        .csv file; its train split), or a dict of column name to array (the whole dataset;
        dim 0 indexes the samples): both are cut into batches by ``batch_size``, ``shuffle``,
        ``seed`` and ``drop_last``. Or an iterable whose elements are the batches: dicts of
        column name to array (NumPy, PyTorch, DLPack or buffer protocol), or tuples/lists of
        arrays, whose element i is column "i" and feeds the model's i-th step input (the
        inference graph's inputs, then the training algorithm's, as
        ``TrainingSession.step_inputs()`` lists them), or single arrays (column "0"). Each
        epoch iterates it anew (``iter()`` again), so an iterator or generator serves one
        epoch only. ``len(train_data)``, when defined, is the number of batches per epoch.
        With an iterable, ``batch_size``, ``shuffle`` and ``drop_last`` must keep their
        defaults: the iterable decides (e.g. the DataLoader's own arguments).
    eval_data : path, dict of arrays, or iterable of batches, optional
        What the model is evaluated on after each epoch (and every ``eval_every`` steps): a
        path's test split, a dict of arrays (in batches of ``batch_size``), or the batches of an
        iterable. Evaluation reports the mean cross-entropy and the accuracy of the model's one
        floating output (class scores) against the integer labels the step takes; a model
        without those is an Error. By default, a dataset path's test split when it has one and
        the model can be evaluated on it (as the CLI does).
    output : path, optional
        Where the trained model (with training_info) is written, atomically. None: not written
        (it is the result's ``model``).
    epochs, batch_size, shuffle, seed, drop_last, max_steps, eval_every, initialize, threads
        As the CLI's flags. ``seed`` also seeds random ops (Dropout); ``threads`` None: one
        per CPU that other processes leave free, followed as the run goes (OMP_NUM_THREADS,
        where set, instead); a number fixes it (runs bit-identical from run to run need one).
    map : dict or list of "INPUT=COLUMN", optional
        Which column a step input reads, where its name does not say.
    scale : dict or list of "COLUMN=FACTOR", optional
        Factors for floating inputs, e.g. ``{"image": 1/255}`` or ``["image=1/255"]``.
    metrics : path, optional
        Appends JSON lines: one record per step and per evaluation.
    checkpoint_every : int
        Also checkpoint every N steps (a checkpoint is always written at each epoch end).
    checkpoint : path, optional
        Where checkpoints go. Default: ``output`` with ``.ckpt.onnx``; none when ``output`` is
        None too.
    resume : path, optional
        Continue from a checkpoint: its epoch, batch and step count. With a path or a dict of
        arrays the run ends bit-identical to an uninterrupted one; with an iterable, the first
        batches of the resumed epoch are read and skipped, which is exact only when the iterable
        yields the same batches again (e.g. a DataLoader whose sampler is seeded per epoch).
    export_inference : path, optional
        Also write the inference-only model here.
    collective_timeout, checksum_every, sync_batch_norm, shard_optimizer_state
        Under ``mpirun`` (data-parallel, docs/distributed.md), as the CLI's
        ``--collective-timeout`` (seconds, 0: forever), ``--checksum-every``,
        ``--sync-batch-norm`` (PyTorch's SyncBatchNorm) and ``--shard-optimizer-state``
        (ZeRO stage 1; an Error outside mpirun).
    progress : bool or "lines", optional
        None: a tqdm progress bar when stderr is a terminal or in Jupyter, else the CLI's
        progress lines on stderr. True: the bar (the lines without tqdm); "lines": the lines;
        False: nothing.
    callbacks : callable, object, or a list of them, optional
        Called with a :class:`TrainEvent`: an object's ``on_step``, ``on_eval`` and
        ``on_epoch_end`` methods (those it has) for those events, or a plain callable for every
        event. A callback that returns True stops the run early: it ends as at ``max_steps``
        (evaluated, output written); other return values are ignored.

    Returns
    -------
    TrainResult

    Raises
    ------
    onnxtrain.Error
        Bad input, with the CLI's message: an unreadable model or dataset, a column that feeds
        no input, a batch without a column or of a wrong dtype or shape, NaN or Inf in a batch,
        an unwritable output path. Outputs are checked before training and written atomically:
        a failure leaves no half-written file (and the last checkpoint intact).
    KeyboardInterrupt
        Ctrl-C: the loop stops after the current step, writes a checkpoint and re-raises the
        interrupt, with the run's :class:`TrainResult` as its ``train_result`` attribute.
    TypeError
        A ``train_data`` that is neither a path, a dict of arrays nor an iterable.
    """
    _check_data(train_data, "train_data", epochs)
    if batch_size != 32 or not shuffle or drop_last:
        if not isinstance(train_data, (str, os.PathLike, collections.abc.Mapping)):
            raise Error("batch_size, shuffle and drop_last apply to a dataset path or a dict of arrays; "
                        "the batches of an iterable train_data are its elements (set them on its DataLoader)")
    if eval_data is not None:
        _check_data(eval_data, "eval_data", 2 if epochs > 1 or eval_every > 0 else 1)
    options: dict[str, Any] = {
        "output": _path(output),
        "map": _pairs(map, "map", lambda v: str(v)),
        "scale": _pairs(scale, "scale", _factor),
        "epochs": epochs,
        "batch_size": batch_size,
        "shuffle": bool(shuffle),
        "seed": seed,
        "drop_last": bool(drop_last),
        "max_steps": max_steps,
        "eval_every": eval_every,
        "metrics": _path(metrics),
        "checkpoint_every": checkpoint_every,
        "checkpoint": _path(checkpoint),
        "resume": _path(resume),
        "initialize": bool(initialize),
        "export_inference": _path(export_inference),
        "threads": 0 if threads is None else threads,
        "collective_timeout": float(collective_timeout),
        "checksum_every": checksum_every,
        "sync_batch_norm": bool(sync_batch_norm),
        "shard_optimizer_state": bool(shard_optimizer_state),
    }
    world = _core._world()
    if world is not None and world[0] != 0:
        progress = False  # rank 0 alone shows progress (and writes files), as the CLI
    bar = _progress_bar(progress, epochs)
    options["quiet"] = bar is not None or progress is False
    handlers = {kind: _handler(kind, callbacks, bar) for kind in ("step", "eval", "epoch_end")}
    log = None if progress is False else (bar.write if bar is not None else _write_stderr)
    try:
        r = _core._train(model, train_data, eval_data, options, handlers["step"], handlers["eval"],
                         handlers["epoch_end"], log)
    finally:
        if bar is not None:
            bar.close()
    result = TrainResult(
        steps=r["steps"], last_loss=r["last_loss"], test_loss=r["test_loss"], test_accuracy=r["test_accuracy"],
        interrupted=r["interrupt"] is not None, stopped_early=r["stopped_early"], checkpoint=r["checkpoint"],
        output=options["output"] if r["interrupt"] is None and options["output"] else None, _trained=r["trained"])
    if r["interrupt"] is not None:
        if bar is not None:
            where = f"checkpoint written to {result.checkpoint}" if result.checkpoint else "no checkpoint written"
            _write_stderr(f"interrupted: {where}\n")
        interrupt = r["interrupt"]
        interrupt.train_result = result
        raise interrupt
    return result


def _path(value: Optional[PathLike]) -> str:
    return "" if value is None else os.fspath(value)


def _factor(value: Union[float, str]) -> str:
    return value if isinstance(value, str) else repr(float(value))


def _pairs(value: Union[Mapping[str, _T], Sequence[str], None], name: str, text: Callable[[_T], str]) -> list[str]:
    """A dict or a list of "NAME=VALUE" as the CLI's repeated flag takes it."""
    if value is None:
        return []
    if isinstance(value, collections.abc.Mapping):
        return [f"{key}={text(v)}" for key, v in value.items()]
    if isinstance(value, str):
        return [value]
    return [str(item) for item in value]


def _is_array(value: object) -> bool:
    return any(hasattr(value, a) for a in ("__array__", "__dlpack__", "__array_interface__"))


def _check_data(data: object, name: str, passes: int) -> None:
    """Errors a train_data or eval_data shows before anything runs; `passes`: how many times
    the loop may iterate it."""
    if isinstance(data, (str, os.PathLike, collections.abc.Mapping)):
        return
    if _is_array(data):
        raise TypeError(f"{name}: an array is not a dataset: pass a dict of arrays "
                        "({'x': x, 'label': y}) or an iterable of batches")
    if not isinstance(data, collections.abc.Iterable):
        raise TypeError(f"{name}: expected a dataset path, a dict of arrays or an iterable of batches, "
                        f"got {type(data).__name__}")
    if isinstance(data, collections.abc.Iterator) and passes > 1:
        raise Error(f"{name} is an iterator (a generator?), which can be iterated once only, but the run "
                    "iterates it again (epochs > 1, or evaluations after each epoch and every eval_every "
                    "steps): pass a list, a DataLoader or another re-iterable object")


def _asks_stop(answer: object) -> bool:
    """A callback's answer: True (Python's or NumPy's) stops the run; anything else does not."""
    return answer is True or (isinstance(answer, numpy.bool_) and bool(answer))


def _handler(kind: str, callbacks: Any, bar: Optional[_Bar]) -> Optional[Callable[[dict[str, Any]], bool]]:
    """The function the loop calls for `kind`'s events, or None when nothing listens."""
    listeners: list[Any]
    if callbacks is None:
        listeners = []
    elif callable(callbacks) or any(hasattr(callbacks, "on_" + k) for k in ("step", "eval", "epoch_end")):
        listeners = [callbacks]
    else:
        listeners = list(callbacks)
    calls: list[Callable[[TrainEvent], object]] = []
    for listener in listeners:
        if any(hasattr(listener, "on_" + k) for k in ("step", "eval", "epoch_end")):
            method = getattr(listener, "on_" + kind, None)
            if method is not None:
                calls.append(method)
        elif callable(listener):
            calls.append(listener)
        else:
            raise TypeError(f"callbacks: {listener!r} is neither callable nor has on_step/on_eval/on_epoch_end")
    if bar is not None:
        calls.insert(0, getattr(bar, kind))
    if not calls:
        return None

    def handle(fields: dict[str, Any]) -> bool:
        event = TrainEvent(kind=kind, **fields)
        stop = False
        for call in calls:
            stop = _asks_stop(call(event)) or stop
        return stop

    return handle


def _write_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _in_jupyter() -> bool:
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None
    except Exception:  # an IPython without a shell
        return False
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


def _progress_bar(progress: Union[bool, str, None], epochs: int) -> Optional[_Bar]:
    """The tqdm bar `progress` asks for, or None for the CLI's lines or silence."""
    if progress is False or progress == "lines":
        return None
    if progress not in (None, True):
        raise Error(f"progress must be None, True, False or 'lines', got {progress!r}")
    jupyter = _in_jupyter()
    if progress is None and not (jupyter or sys.stderr.isatty()):
        return None
    try:
        if jupyter:
            from tqdm.auto import tqdm  # type: ignore[import-untyped]
        else:
            from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:
        return None
    return _Bar(tqdm, epochs)


class _Bar:
    """A tqdm bar over the run's steps: epoch, smoothed loss and lr, evaluations above it."""

    def __init__(self, tqdm: Any, epochs: int) -> None:
        self._tqdm = tqdm
        self._epochs = epochs
        self._bar: Any = None
        self._loss: Optional[float] = None

    def step(self, e: TrainEvent) -> None:
        if self._bar is None:
            self._bar = self._tqdm(total=e.total, initial=e.step - 1, desc=f"epoch {e.epoch + 1}/{self._epochs}",
                                   unit="step", file=sys.stderr, dynamic_ncols=True)
        # The same smoothing as the CLI's progress lines.
        loss = float("nan") if e.loss is None else e.loss  # a step event always has one
        self._loss = loss if self._loss is None else 0.95 * self._loss + 0.05 * loss
        self._bar.set_description(f"epoch {e.epoch + 1}/{self._epochs}", refresh=False)
        postfix = {"loss": f"{self._loss:.4f}"}
        if e.lr is not None:
            postfix["lr"] = f"{e.lr:.3g}"
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(1)

    def eval(self, e: TrainEvent) -> None:
        self.write(f"eval  epoch {e.epoch + 1}  step {e.step}  test loss {e.test_loss:.4g}  "
                   f"test accuracy {e.test_accuracy:.4g}\n")

    def epoch_end(self, e: TrainEvent) -> None:
        pass

    def write(self, text: str) -> None:
        self._tqdm.write(text.rstrip("\n"), file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

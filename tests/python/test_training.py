"""make_trainable, export_inference and TrainingSession, against NumPy, PyTorch and the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from conftest import mlp, mlp_reference, model, package_env
from onnx import TensorProto, helper, numpy_helper

import onnxtrain

WEIGHTS = ["b1", "b2", "w1", "w2"]


def trainable(m=None, **options):
    return onnxtrain.make_trainable(mlp() if m is None else m, **options)


def test_make_trainable_adds_training_info(mlp_model):
    t = onnxtrain.make_trainable(mlp_model, optimizer="adam", lr=0.001)
    assert isinstance(t, onnx.ModelProto) and len(t.training_info) == 1
    keys = {b.key for b in t.training_info[0].update_binding}
    assert set(WEIGHTS) <= keys
    assert len(mlp_model.training_info) == 0  # the argument is not changed
    onnx.checker.check_model(t)


def test_sgd_step_matches_torch(batch):
    # One plain SGD step by hand in PyTorch on the same weights and batch.
    m = mlp()
    x, label = batch
    session = onnxtrain.TrainingSession(trainable(m, optimizer="sgd", lr=0.1))
    w = {t.name: torch.tensor(numpy_helper.to_array(t), requires_grad=True) for t in m.graph.initializer}
    logits = torch.tanh(torch.tensor(x) @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(label))
    loss.backward()
    out = session.step({"x": x, "label": label})
    np.testing.assert_allclose(out["onnxtrain.loss"], loss.item(), rtol=1e-5)
    np.testing.assert_allclose(out["logits"], logits.detach().numpy(), rtol=1e-5, atol=1e-6)
    state = session.state
    for name in WEIGHTS:
        expected = (w[name] - 0.1 * w[name].grad).detach().numpy()
        np.testing.assert_allclose(state[name], expected, rtol=1e-5, atol=1e-6)
    assert session.steps_done == 1


def test_metadata_of_steps(mlp_model):
    session = onnxtrain.TrainingSession(trainable(mlp_model))
    assert session.num_algorithms == 1
    assert [(i.name, i.dtype, i.shape) for i in session.step_inputs()] == [
        ("x", np.dtype(np.float32), ("N", 4)),
        ("label", np.dtype(np.int64), ("N",)),
    ]
    names = [o.name for o in session.step_outputs(0)]
    assert names[:3] == ["logits", "onnxtrain.loss", "onnxtrain.lr"]
    assert [i.name for i in session.inference_inputs] == ["x"]
    assert [o.name for o in session.inference_outputs] == ["logits"]
    with pytest.raises(IndexError, match="algorithm 1 out of range"):
        session.step_inputs(1)


def test_state_is_read_only_and_keeps_its_values(batch):
    session = onnxtrain.TrainingSession(trainable(lr=0.5))
    before = session.state
    copy = {k: np.array(v) for k, v in before.items()}
    assert not before["w1"].flags.writeable
    with pytest.raises(ValueError):
        before["w1"][0, 0] = 1
    session.step({"x": batch[0], "label": batch[1]})
    after = session.state
    for k in WEIGHTS:
        np.testing.assert_array_equal(before[k], copy[k])  # the old view did not change
        assert not np.array_equal(after[k], copy[k])


def test_step_outputs_that_are_state_are_read_only(batch):
    session = onnxtrain.TrainingSession(trainable())
    out = session.step({"x": batch[0], "label": batch[1]})
    assert out["logits"].flags.writeable
    new_w1 = out["onnxtrain.new.w1"]
    assert not new_w1.flags.writeable
    np.testing.assert_array_equal(new_w1, session.state["w1"])


def test_infer_uses_the_current_state(batch):
    m = mlp()
    session = onnxtrain.TrainingSession(trainable(m, lr=0.5))
    np.testing.assert_allclose(session.infer({"x": batch[0]})["logits"], mlp_reference(m, batch[0]), rtol=1e-5, atol=1e-6)
    session.step({"x": batch[0], "label": batch[1]})
    updated = session.model()
    np.testing.assert_allclose(
        session.infer({"x": batch[0]})["logits"], mlp_reference(updated, batch[0]), rtol=1e-5, atol=1e-6
    )
    assert not np.allclose(mlp_reference(updated, batch[0]), mlp_reference(m, batch[0]))


def test_set_state(batch):
    session = onnxtrain.TrainingSession(trainable())
    w1 = np.ones((4, 8), np.float32)
    session.set_state("w1", w1)
    w1[0, 0] = 5  # copied: the session does not see this
    np.testing.assert_array_equal(session.state["w1"], np.ones((4, 8)))
    session.set_state({"b1": np.zeros(8, np.float32), "b2": torch.ones(3)})
    np.testing.assert_array_equal(session.state["b2"], [1, 1, 1])
    with pytest.raises(onnxtrain.Error, match="'nope' is not a mutable variable"):
        session.set_state("nope", w1)
    with pytest.raises(onnxtrain.Error, match=r"variable 'w1' is float32\[4,8\], cannot set it to float64\[4,8\]"):
        session.set_state("w1", np.zeros((4, 8)))
    # A mapping whose second value is bad leaves the first variable as it was.
    with pytest.raises(onnxtrain.Error, match="'w2'"):
        session.set_state({"b1": np.full(8, 7, np.float32), "w2": np.zeros((2, 2), np.float32)})
    np.testing.assert_array_equal(session.state["b1"], np.zeros(8))
    with pytest.raises(TypeError):
        session.set_state("w1")  # type: ignore[call-overload]


def test_step_errors_change_nothing(batch):
    session = onnxtrain.TrainingSession(trainable())
    before = {k: np.array(v) for k, v in session.state.items()}
    with pytest.raises(onnxtrain.Error, match="label"):
        session.step({"x": batch[0]})
    with pytest.raises(onnxtrain.Error, match="'extra' is not an input of any training algorithm"):
        session.step({"x": batch[0], "label": batch[1], "extra": batch[1]})
    with pytest.raises(onnxtrain.Error, match="input 'label' expects int64"):
        session.step({"x": batch[0], "label": batch[1].astype(np.int32)})
    with pytest.raises(IndexError):
        session.step({"x": batch[0], "label": batch[1]}, algorithm=3)
    for k, v in session.state.items():
        np.testing.assert_array_equal(v, before[k])
    assert session.steps_done == 0


def test_nan_guard(batch):
    x = batch[0].copy()
    x[0, 0] = np.nan
    session = onnxtrain.TrainingSession(trainable())
    with pytest.raises(onnxtrain.Error, match="NaN"):
        session.step({"x": x, "label": batch[1]})
    unguarded = onnxtrain.TrainingSession(trainable(), nan_guard=False)
    unguarded.step({"x": x, "label": batch[1]}, algorithm=0)
    assert np.isnan(unguarded.state["w1"]).any()


def test_initialize_and_seed():
    t = trainable(init="normal:0.02")
    a, b, c = (onnxtrain.TrainingSession(t, seed=s) for s in (1, 1, 2))
    for s in (a, b, c):
        s.initialize()
    np.testing.assert_array_equal(a.state["w1"], b.state["w1"])
    assert not np.array_equal(a.state["w1"], c.state["w1"])
    assert abs(float(np.std(a.state["w1"])) - 0.02) < 0.01
    np.testing.assert_array_equal(a.state["b1"], np.zeros(8))


def test_steps_done_is_settable():
    session = onnxtrain.TrainingSession(trainable())
    session.steps_done = 7
    assert session.steps_done == 7


def test_save_and_model(tmp_path, batch):
    session = onnxtrain.TrainingSession(trainable(), threads=1)
    session.step({"x": batch[0], "label": batch[1]})
    path = tmp_path / "trained.onnx"
    session.save(path, metadata={"epoch": "3"})
    saved = onnx.load(path)
    assert {p.key: p.value for p in saved.metadata_props}["epoch"] == "3"
    in_memory = session.model()
    assert len(in_memory.training_info) == 1
    for a, b in zip(saved.graph.initializer, in_memory.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    np.testing.assert_array_equal(
        {t.name: numpy_helper.to_array(t) for t in in_memory.graph.initializer}["w1"], session.state["w1"]
    )
    # The saved model resumes where the session is.
    resumed = onnxtrain.TrainingSession(path, threads=1)
    a = session.step({"x": batch[0], "label": batch[1]})["onnxtrain.loss"]
    b = resumed.step({"x": batch[0], "label": batch[1]})["onnxtrain.loss"]
    np.testing.assert_array_equal(a, b)


def test_save_to_a_bad_path_writes_nothing(tmp_path):
    session = onnxtrain.TrainingSession(trainable())
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_bytes(b"previous")
    for bad in (tmp_path / "missing" / "m.onnx", tmp_path / "file" / "m.onnx", tmp_path / "folder"):
        with pytest.raises(onnxtrain.Error, match=re.escape(str(bad))):
            session.save(bad)
    with pytest.raises(TypeError, match="path must be a path"):
        session.save(3)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]
    assert (tmp_path / "file").read_bytes() == b"previous" and not any((tmp_path / "folder").iterdir())


def test_a_model_without_training_info_has_no_algorithms(mlp_model, batch):
    session = onnxtrain.TrainingSession(mlp_model)
    assert session.num_algorithms == 0 and session.state == {}
    with pytest.raises(onnxtrain.Error, match="'x' is not an input of any training algorithm"):
        session.step({"x": batch[0]})
    assert session.infer({"x": batch[0]})["logits"].shape == (5, 3)


def test_export_inference(mlp_model, tmp_path, batch):
    session = onnxtrain.TrainingSession(trainable(lr=0.5))
    session.step({"x": batch[0], "label": batch[1]})
    inference = onnxtrain.export_inference(session.model())
    assert len(inference.training_info) == 0
    np.testing.assert_allclose(
        onnxtrain.InferenceSession(inference).run({"x": batch[0]})["logits"],
        session.infer({"x": batch[0]})["logits"],
        rtol=1e-6,
    )
    session.save(tmp_path / "t.onnx")
    assert len(onnxtrain.export_inference(tmp_path / "t.onnx").training_info) == 0


def test_make_trainable_options():
    assert len(trainable(optimizer="adamw", lr=1e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.01).training_info) == 1
    frozen = trainable(freeze=["w.*"])
    keys = {b.key for b in frozen.training_info[0].update_binding}
    assert "b1" in keys and "w1" not in keys and "w2" not in keys
    only = trainable(train="b2")
    assert {"b2"} == {b.key for b in only.training_info[0].update_binding} & set(WEIGHTS)
    scheduled = onnxtrain.TrainingSession(trainable(lr=1.0, lr_schedule="step", step_size=1, gamma=0.5, warmup_steps=None))
    x, label = np.zeros((1, 4), np.float32), np.zeros(1, np.int64)
    lrs = [float(scheduled.step({"x": x, "label": label})["onnxtrain.lr"]) for _ in range(3)]
    assert lrs == [1.0, 0.5, 0.25]  # StepLR: lr gamma^floor(t / step_size)
    with pytest.raises(onnxtrain.Error, match="already has training_info"):
        onnxtrain.make_trainable(trainable())
    assert len(onnxtrain.make_trainable(trainable(), replace=True).training_info) == 1


def test_make_trainable_bad_options(mlp_model):
    with pytest.raises(TypeError, match="unexpected keyword argument 'learning_rate'; the options are: loss, "):
        onnxtrain.make_trainable(mlp_model, learning_rate=0.1)
    with pytest.raises(TypeError, match="lr must be a number, got str"):
        onnxtrain.make_trainable(mlp_model, lr="0.1")
    with pytest.raises(TypeError, match="warmup_steps must be an int, got float"):
        onnxtrain.make_trainable(mlp_model, warmup_steps=1.5)
    with pytest.raises(TypeError, match="freeze item must be a str"):
        onnxtrain.make_trainable(mlp_model, freeze=[1])
    with pytest.raises(onnxtrain.Error, match="optimizer: 'rmsprop' is not one of adagrad, adam, adamw, momentum, nesterov, sgd"):
        onnxtrain.make_trainable(mlp_model, optimizer="rmsprop")
    with pytest.raises(onnxtrain.Error, match="lr: must be positive"):
        onnxtrain.make_trainable(mlp_model, lr=0)
    with pytest.raises(onnxtrain.Error, match="init: normal:STD needs a number"):
        onnxtrain.make_trainable(mlp_model, init="normal:x")
    with pytest.raises(onnxtrain.Error, match="matches no initializer"):
        onnxtrain.make_trainable(mlp_model, freeze="nothing_like_this")
    with pytest.raises(onnxtrain.Error, match="output 'nope'"):
        onnxtrain.make_trainable(mlp_model, output_name="nope")


def test_keywords_are_the_cli_flags():
    # Every make-trainable flag of `onnxtrain make-trainable --help` is a keyword ('-' -> '_'),
    # model and --output aside (make_trainable writes no file), and nothing else is.
    help_text = subprocess.run(
        [sys.executable, "-m", "onnxtrain", "make-trainable", "--help"], capture_output=True, text=True, check=True,
        env=package_env(),
    ).stdout
    flags = set(re.findall(r"^\s+(?:-\w,)?--([\w-]+)", help_text, re.M)) - {"help", "output"}
    keywords = {k for k, _ in onnxtrain._core._make_trainable_keywords()}
    assert keywords == {f.replace("-", "_") for f in flags}
    for keyword in keywords:
        assert keyword in onnxtrain.make_trainable.__doc__


def test_loss_graph_as_path_and_as_model(tmp_path, batch):
    # A custom loss: the mean of squared logits minus a float label, [N, 3].
    loss = model(
        [
            helper.make_node("Sub", ["logits", "target"], ["d"]),
            helper.make_node("Mul", ["d", "d"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3]), helper.make_tensor_value_info("target", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    onnx.save(loss, tmp_path / "loss.onnx")
    target = np.ones((5, 3), np.float32)
    results = []
    for graph in (tmp_path / "loss.onnx", loss):
        session = onnxtrain.TrainingSession(trainable(loss_graph=graph))
        results.append(session.step({"x": batch[0], "target": target})["onnxtrain.loss"])
    logits = mlp_reference(mlp(), batch[0])
    np.testing.assert_allclose(results[0], np.mean((logits - target) ** 2), rtol=1e-5)
    np.testing.assert_array_equal(results[0], results[1])


def cli(*args, cwd):
    """`onnxtrain ARGS` through the console script's entry point, as a separate process."""
    r = subprocess.run([sys.executable, "-m", "onnxtrain", *map(str, args)], capture_output=True, text=True, cwd=cwd, env=package_env())
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_reproduces_the_cli(tmp_path, batch):
    # make-trainable + step by the CLI and by the package, same options, same threads: the same
    # losses (the CLI prints 7 digits) and bit-identical weights.
    onnx.save(mlp(), tmp_path / "mlp.onnx")
    np.save(tmp_path / "x.npy", batch[0])
    np.save(tmp_path / "label.npy", batch[1])
    options = dict(optimizer="adam", lr=0.05, weight_decay=0.01, lr_schedule="cosine", total_steps=10)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    cli("make-trainable", "mlp.onnx", "-o", "cli.onnx", *flags, cwd=tmp_path)
    out = cli("step", "cli.onnx", "-i", "x=x.npy", "-i", "label=label.npy", "--steps", 3, "--threads", 1, "-o", "stepped.onnx", cwd=tmp_path)
    cli_losses = [float(v) for v in re.findall(r"onnxtrain\.loss=(\S+)", out)]

    t = onnxtrain.make_trainable(tmp_path / "mlp.onnx", **options)
    assert t.training_info[0] == onnx.load(tmp_path / "cli.onnx").training_info[0]
    session = onnxtrain.TrainingSession(t, threads=1)
    losses = [float(session.step({"x": batch[0], "label": batch[1]})["onnxtrain.loss"]) for _ in range(3)]
    np.testing.assert_allclose(losses, cli_losses, rtol=1e-6)
    saved = onnx.load(tmp_path / "stepped.onnx")
    initializers = [*saved.graph.initializer, *saved.training_info[0].algorithm.initializer]
    stepped = {i.name: numpy_helper.to_array(i) for i in initializers}
    for name, value in session.state.items():
        np.testing.assert_array_equal(value, stepped[name], err_msg=name)

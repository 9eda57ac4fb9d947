"""onnxtrain.train: the training loop from Python (python/onnxtrain/_train.py, src/python/train.cpp).

A 4-16-3 MLP (conftest.mlp) made trainable with momentum SGD learns three Gaussian blobs (an .npz with a test
split). The same run through the CLI, through a DataLoader of tuples, through dict batches and
through a dict of arrays must end with bit-identical weights; checkpoints resume exactly;
callbacks see every event and can stop the run; Ctrl-C (a real SIGINT to a child process)
checkpoints and raises KeyboardInterrupt; bad input is an onnxtrain.Error and writes nothing.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from conftest import mlp, package_env
from onnx import numpy_helper

import onnxtrain

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
WEIGHTS = ("w1", "b1", "w2", "b2")


def blobs(n, seed):
    """Three Gaussian blobs in 4 dims: x float32 [n, 4], label int64 [n]."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 3, n)
    centers = np.eye(3, 4, dtype=np.float32) * 3
    return (centers[label] + rng.normal(size=(n, 4))).astype(np.float32), label.astype(np.int64)


@pytest.fixture
def setup(tmp_path):
    model = tmp_path / "train.onnx"
    onnx.save(onnxtrain.make_trainable(mlp(hidden=16), optimizer="momentum", lr=0.05), model)
    x, label = blobs(100, 1)
    tx, tlabel = blobs(40, 2)
    data = tmp_path / "blobs.npz"
    np.savez(data, x=x, label=label, **{"test/x": tx, "test/label": tlabel})
    return {"dir": tmp_path, "model": model, "data": data, "x": x, "label": label, "tx": tx, "tlabel": tlabel}


def weights(model):
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(model)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name in WEIGHTS}


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() == set(WEIGHTS)
    for name in wa:
        assert wa[name].tobytes() == wb[name].tobytes(), name


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "onnxtrain", *map(str, args)], capture_output=True, text=True,
                          env=package_env())


def test_a_path_trains_as_the_cli_does(setup):
    d = setup["dir"]
    cli = run_cli("train", setup["model"], "--data", setup["data"], "--epochs", 3, "--batch-size", 16, "--seed", 7,
                  "--metrics", d / "cli.jsonl", "-o", d / "cli.onnx", "-q")
    assert cli.returncode == 0, cli.stderr
    result = onnxtrain.train(setup["model"], setup["data"], epochs=3, batch_size=16, seed=7, metrics=d / "py.jsonl",
                             output=d / "py.onnx", progress=False)
    assert result.steps == 3 * 7  # ceil(100 / 16) batches per epoch
    assert result.output == str(d / "py.onnx") and not result.interrupted and not result.stopped_early
    assert result.checkpoint == str(d / "py.ckpt.onnx")
    assert result.test_accuracy > 0.8  # three well separated blobs
    assert_same_weights(d / "py.onnx", d / "cli.onnx")
    assert_same_weights(result.model, d / "cli.onnx")
    assert f"test accuracy {result.test_accuracy:.4f}" in cli.stdout
    cli_records = [json.loads(line) for line in open(d / "cli.jsonl")]
    py_records = [json.loads(line) for line in open(d / "py.jsonl")]
    assert [(r["type"], r["step"]) for r in py_records] == [(r["type"], r["step"]) for r in cli_records]
    assert [r.get("loss") for r in py_records] == [r.get("loss") for r in cli_records]
    assert py_records[-1]["test_accuracy"] == result.test_accuracy


def test_a_dataloader_of_tuples_trains_as_the_unshuffled_path(setup):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    d = setup["dir"]
    path = onnxtrain.train(setup["model"], setup["data"], epochs=2, batch_size=16, shuffle=False, progress=False)
    loader = DataLoader(TensorDataset(torch.from_numpy(setup["x"]), torch.from_numpy(setup["label"])), batch_size=16)
    test_loader = DataLoader(TensorDataset(torch.from_numpy(setup["tx"]), torch.from_numpy(setup["tlabel"])),
                             batch_size=16)
    # (x, label): element i feeds the i-th step input, x then label.
    loaded = onnxtrain.train(str(setup["model"]), loader, test_loader, epochs=2, output=d / "loader.onnx",
                             progress=False)
    assert loaded.steps == path.steps == 14
    assert_same_weights(d / "loader.onnx", path.model)
    assert loaded.test_loss == path.test_loss and loaded.test_accuracy == path.test_accuracy


def test_dict_batches_and_a_dict_of_arrays(setup):
    torch = pytest.importorskip("torch")
    path = onnxtrain.train(setup["model"], setup["data"], batch_size=25, shuffle=False, progress=False)
    x, label = setup["x"], setup["label"]
    # Batches as a list of dicts: NumPy images scaled by 1, torch labels as int32 (-> int64).
    batches = [{"x": x[i:i + 25], "label": torch.from_numpy(label[i:i + 25].astype(np.int32))}
               for i in range(0, 100, 25)]
    listed = onnxtrain.train(onnx.load(setup["model"]), batches, {"x": setup["tx"], "label": setup["tlabel"]},
                             progress=False)
    assert_same_weights(listed.model, path.model)
    # The same test samples, but the path's split runs in batches of 25 (25 + 15) and the dict of
    # arrays in batches of 32 (32 + 8): products of other row counts, whose kernels may sum in
    # another order (equal on AVX-512, 6.8e-10 apart relatively on an AVX2 machine).
    assert listed.test_loss == pytest.approx(path.test_loss, rel=1e-6)
    assert listed.test_accuracy == path.test_accuracy
    # A DataLoader over a dataset of dict samples collates them into dict batches.
    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return {"x": x[i], "label": label[i]}

    loader = torch.utils.data.DataLoader(Samples(), batch_size=25)
    assert_same_weights(onnxtrain.train(setup["model"], loader, progress=False).model, path.model)
    # The whole dataset as a dict: batched, shuffled and dropped like a path.
    whole = onnxtrain.train(setup["model"], {"x": x, "label": label}, batch_size=25, shuffle=False, progress=False)
    assert_same_weights(whole.model, path.model)
    assert whole.test_loss is None  # no eval_data, no test split
    # map and scale as dicts: x read from the column "features", scaled by 2 (as the CLI's flags).
    cli_style = onnxtrain.train(setup["model"], setup["data"], batch_size=25, shuffle=False, scale=["x=2"],
                                progress=False)
    mapped = onnxtrain.train(setup["model"], [{"features": b["x"], "label": b["label"]} for b in batches],
                             map={"x": "features"}, scale={"features": 2}, progress=False)
    assert_same_weights(mapped.model, cli_style.model)


def test_eval_every_metrics_and_export(setup):
    d = setup["dir"]
    result = onnxtrain.train(setup["model"], setup["data"], d / "blobs.npz", epochs=2, batch_size=20, eval_every=2,
                             metrics=d / "m.jsonl", export_inference=d / "inference.onnx", progress=False)
    records = [json.loads(line) for line in open(d / "m.jsonl")]
    evals = [r["step"] for r in records if r["type"] == "eval"]
    assert evals == [2, 4, 5, 6, 8, 10]  # every 2 steps, and at each epoch's end (5 batches)
    assert [r["step"] for r in records if r["type"] == "step"] == list(range(1, 11))
    assert all("lr" in r for r in records if r["type"] == "step")
    # The threads each step ran on: without `threads`, one per CPU other processes leave free.
    assert all(1 <= r["threads"] <= len(os.sched_getaffinity(0)) for r in records if r["type"] == "step")
    inference = onnx.load(d / "inference.onnx")
    assert len(inference.training_info) == 0
    session = onnxtrain.InferenceSession(inference)
    logits = session.run({"x": setup["tx"]})["logits"]
    assert np.mean(np.argmax(logits, 1) == setup["tlabel"]) == pytest.approx(result.test_accuracy)
    assert not (d / "inference.onnx.training.onnx").exists()


def test_resume_from_a_checkpoint_is_bit_identical(setup):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    d = setup["dir"]
    whole = onnxtrain.train(setup["model"], setup["data"], epochs=3, batch_size=16, seed=3, progress=False)
    first = onnxtrain.train(setup["model"], setup["data"], epochs=3, batch_size=16, seed=3, max_steps=10,
                            checkpoint_every=10, checkpoint=d / "ckpt.onnx", progress=False)
    assert first.steps == 10 and first.checkpoint == str(d / "ckpt.onnx")
    rest = onnxtrain.train(setup["model"], setup["data"], epochs=3, batch_size=16, seed=3, resume=d / "ckpt.onnx",
                           progress=False)
    assert rest.steps == 21
    assert_same_weights(rest.model, whole.model)
    # A deterministic DataLoader: the resumed epoch skips the batches done.
    loader = DataLoader(TensorDataset(torch.from_numpy(setup["x"]), torch.from_numpy(setup["label"])), batch_size=16)
    seen = []
    whole = onnxtrain.train(setup["model"], loader, epochs=2, progress=False)
    onnxtrain.train(setup["model"], loader, epochs=2, max_steps=9, checkpoint_every=9, checkpoint=d / "l.onnx",
                    progress=False)
    rest = onnxtrain.train(setup["model"], loader, epochs=2, resume=d / "l.onnx", progress=False,
                           callbacks=lambda e: seen.append((e.kind, e.epoch, e.batch, e.step)))
    assert seen[0] == ("step", 1, 2, 10)  # epoch 2 from its third batch
    assert rest.steps == 14
    assert_same_weights(rest.model, whole.model)


class Recorder:
    def __init__(self, stop_at_step=None):
        self.events = []
        self.stop_at_step = stop_at_step

    def on_step(self, e):
        self.events.append(e)
        return np.bool_(e.step == self.stop_at_step)

    def on_eval(self, e):
        self.events.append(e)

    def on_epoch_end(self, e):
        self.events.append(e)


def test_callbacks_see_every_event_and_may_stop(setup):
    d = setup["dir"]
    recorder, everything = Recorder(), []
    result = onnxtrain.train(setup["model"], setup["data"], epochs=2, batch_size=50, output=d / "o.onnx",
                             progress=False, callbacks=[recorder, everything.append])
    kinds = [(e.kind, e.epoch, e.step) for e in recorder.events]
    assert kinds == [("step", 0, 1), ("step", 0, 2), ("eval", 0, 2), ("epoch_end", 0, 2),
                     ("step", 1, 3), ("step", 1, 4), ("eval", 1, 4), ("epoch_end", 1, 4)]
    assert everything == recorder.events
    step = recorder.events[1]
    assert step.batch == 1 and step.total == 4 and step.batches == 2 and step.lr == pytest.approx(0.05)
    assert step.loss > 0 and step.steps_per_s > 0
    assert recorder.events[3].checkpoint == str(d / "o.ckpt.onnx")
    last_eval = recorder.events[-2]
    assert (last_eval.test_loss, last_eval.test_accuracy) == (result.test_loss, result.test_accuracy)
    assert last_eval.epoch_end is True
    # Returning True (NumPy's too) stops early: evaluated, output written.
    stopper = Recorder(stop_at_step=3)
    stopped = onnxtrain.train(setup["model"], setup["data"], epochs=5, batch_size=50, output=d / "s.onnx",
                              progress=False, callbacks=stopper)
    assert stopped.stopped_early and stopped.steps == 3 and not stopped.interrupted
    assert stopper.events[-1].kind == "eval" and stopper.events[-1].epoch_end is False
    assert os.path.exists(d / "s.onnx")
    # Other return values do not stop.
    assert onnxtrain.train(setup["model"], setup["data"], batch_size=50, progress=False,
                           callbacks=lambda e: "stop").steps == 2


def test_progress_lines_bar_and_silence(setup, capsys):
    onnxtrain.train(setup["model"], setup["data"], batch_size=50, progress="lines")
    err = capsys.readouterr().err
    assert "epoch 1/1  step 2/2  loss" in err and "eval  epoch 1  step 2" in err and "trained 2 steps" in err
    pytest.importorskip("tqdm")
    onnxtrain.train(setup["model"], setup["data"], batch_size=50, progress=True)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "2/2" in err and "eval  epoch 1  step 2" in err
    onnxtrain.train(setup["model"], setup["data"], batch_size=50, progress=False)
    assert capsys.readouterr().err == ""


def test_a_signal_during_a_callback_interrupts_with_a_checkpoint(setup):
    d = setup["dir"]

    def ctrl_c_at_step_3(e):
        if e.kind == "step" and e.step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # Python raises KeyboardInterrupt in this callback

    with pytest.raises(KeyboardInterrupt) as info:
        onnxtrain.train(setup["model"], setup["data"], epochs=2, batch_size=10, output=d / "o.onnx", progress=False,
                        callbacks=ctrl_c_at_step_3)
    result = info.value.train_result
    assert result.interrupted and result.steps == 3 and result.output is None
    assert not (d / "o.onnx").exists()
    meta = {p.key: p.value for p in onnx.load(d / "o.ckpt.onnx").metadata_props}
    assert (meta["onnxtrain.epoch"], meta["onnxtrain.batch"], meta["onnxtrain.steps_done"]) == ("0", "3", "3")


CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import onnxtrain
    model, data, out = sys.argv[1:4]
    x, label = np.load(data)["x"], np.load(data)["label"]

    class Batches:  # re-iterable, Python code between steps
        def __iter__(self):
            for i in range(0, 100, 4):
                yield {"x": x[i:i + 4], "label": label[i:i + 4]}

    def started(e):
        if e.step == 5:
            print("started", flush=True)

    try:
        onnxtrain.train(model, Batches(), epochs=100000, output=out, progress=False, callbacks=started)
    except KeyboardInterrupt as e:
        r = e.train_result
        print(json.dumps({"steps": r.steps, "interrupted": r.interrupted, "checkpoint": r.checkpoint}), flush=True)
""")


def test_ctrl_c_stops_after_the_step_and_leaves_a_checkpoint(setup):
    d = setup["dir"]
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(setup["model"]), str(setup["data"]), str(d / "o.onnx")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=package_env())
    assert child.stdout.readline().strip() == "started"
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    report = json.loads(out)
    assert report["interrupted"] and report["steps"] >= 5
    assert report["checkpoint"] == str(d / "o.ckpt.onnx")
    assert not (d / "o.onnx").exists()
    checkpoint = onnx.load(report["checkpoint"])
    onnx.checker.check_model(checkpoint)
    meta = {p.key: p.value for p in checkpoint.metadata_props}
    assert int(meta["onnxtrain.steps_done"]) == report["steps"]
    assert int(meta["onnxtrain.epoch"]) * 25 + int(meta["onnxtrain.batch"]) == report["steps"]
    resumed = onnxtrain.train(setup["model"], [{"x": setup["x"][:4], "label": setup["label"][:4]}] * 25,
                              epochs=100000, max_steps=report["steps"] + 2, resume=report["checkpoint"], progress=False)
    assert resumed.steps == report["steps"] + 2


def test_bad_input_is_a_clear_error_and_writes_nothing(setup):
    d = setup["dir"]
    out = d / "out.onnx"

    def error(*args, **kwargs):
        with pytest.raises(onnxtrain.Error) as info:
            onnxtrain.train(setup["model"], *args, output=out, progress=False, **kwargs)
        return str(info.value)

    batches = [{"x": setup["x"][:10], "label": setup["label"][:10]}, {"x": setup["x"][10:20]}]
    assert "epoch 1, batch 2: no column 'label' (input 'label' reads it)" in error(batches)
    assert "input 'label' int64[N] reads no column of train_data (columns: x); choose one with --map" in error(
        [{"x": setup["x"][:10]}])
    fractional = [{"x": setup["x"][:10], "label": np.full(10, 0.5, np.float32)}]
    assert "column 'label' holds 0.5 at element 0, which is not a whole number" in error(fractional)
    strings = [{"x": np.array([["a"] * 4] * 10), "label": setup["label"][:10]}]
    assert "column 'x'" in error(strings)
    assert "has samples of shape [3]" in error([{"x": setup["x"][:10, :3], "label": setup["label"][:10]}])
    assert "no such file or folder" in error(d / "missing.npz")
    assert "does not exist" in error(setup["data"], checkpoint=d / "nowhere" / "c.onnx")
    assert "is an iterator" in error(iter(batches), epochs=2)
    assert "batch_size, shuffle and drop_last apply to a dataset path" in error(batches, batch_size=10)
    assert "eval_data" in error(setup["data"], eval_data=[{"x": setup["tx"][:5]}])
    nan = setup["x"][:10].copy()
    nan[3, 2] = np.nan
    assert "epoch 1, batch 1: input 'x' holds NaN at element 14" in error([{"x": nan, "label": setup["label"][:10]}])
    with pytest.raises(TypeError):
        onnxtrain.train(setup["model"], setup["x"])
    with pytest.raises(TypeError):
        onnxtrain.train(setup["model"], 42)
    assert sorted(p.name for p in d.iterdir()) == ["blobs.npz", "train.onnx"]


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_idx_folder(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_model", os.path.join(os.path.dirname(__file__), "..", "..", "examples", "fashion_mnist", "make_model.py"))
    subprocess.run([sys.executable, spec.origin, str(tmp_path)], check=True, capture_output=True)
    model = onnxtrain.make_trainable(tmp_path / "mlp.onnx", optimizer="adam", lr=1e-3)
    result = onnxtrain.train(model, FASHION_MNIST, batch_size=128, scale={"image": 1 / 255}, max_steps=200,
                             progress=False)
    assert result.steps == 200
    assert result.test_accuracy > 0.75  # 10 classes; a 784-512-512-10 MLP passes 0.8 in one epoch

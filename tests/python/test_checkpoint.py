"""Checkpoints in and out (onnxtrain.import_checkpoint / export_checkpoint) and the training
metadata. The contract: PyTorch trains k steps and saves; onnxtrain imports and trains m steps;
the weights equal PyTorch's after k + m steps (float64, rtol 1e-6); and the reverse."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import onnxtrain  # noqa: E402

K, M = 3, 4
RTOL = 1e-6

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99)),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01),
}
SCHEDULERS = {
    "sgd": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "adam": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5),
    "adamw": lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.5, total_iters=4),
    "adagrad": lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9),
}
CASES = [(name, scheduled) for name in OPTIMIZERS for scheduled in (False, True)]


def _module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 4, dtype=torch.float64, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(K + M)]


def _torch_setup(name: str, scheduled: bool) -> tuple[torch.nn.Module, object, object]:
    module = _module()
    optimizer = OPTIMIZERS[name](module.parameters())
    return module, optimizer, SCHEDULERS[name](optimizer) if scheduled else None


def _torch_steps(module, optimizer, scheduler, batches) -> None:
    loss = torch.nn.CrossEntropyLoss()
    for x, y in batches:
        optimizer.zero_grad()
        loss(module(x), y).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def _onnx_model(name: str, scheduled: bool):
    module, optimizer, scheduler = _torch_setup(name, scheduled)
    return onnxtrain.from_torch(module, _batches()[0][0], loss=torch.nn.CrossEntropyLoss(), optimizer=optimizer,
                                lr_scheduler=scheduler)


def _onnx_steps(session, batches) -> None:
    for x, y in batches:
        session.step({"input": x.numpy(), "label": y.numpy()})


def _assert_equal(session, module) -> None:
    state = session.state
    for key, p in module.named_parameters():
        np.testing.assert_allclose(state[key], p.detach().numpy(), rtol=RTOL, atol=0, err_msg=key)


def _save_torch(folder, module, optimizer, scheduler) -> dict[str, str]:
    paths = {"weights": str(folder / "model.pt"), "optimizer": str(folder / "optimizer.pt")}
    torch.save(module.state_dict(), paths["weights"])
    torch.save(optimizer.state_dict(), paths["optimizer"])
    if scheduler is not None:
        paths["scheduler"] = str(folder / "scheduler.pt")
        torch.save(scheduler.state_dict(), paths["scheduler"])
    return paths


@pytest.mark.parametrize("name,scheduled", CASES)
def test_import_then_continue_equals_pytorch(tmp_path, name, scheduled):
    batches = _batches()
    module, optimizer, scheduler = _torch_setup(name, scheduled)
    _torch_steps(module, optimizer, scheduler, batches[:K])
    paths = _save_torch(tmp_path, module, optimizer, scheduler)
    # torch.optim.SGD records no step count: without a scheduler it is given.
    step = K if name == "sgd" and not scheduled else None
    model = onnxtrain.import_checkpoint(_onnx_model(name, scheduled), step=step, **paths)
    meta = onnxtrain.training_metadata(model)
    assert meta["progress"]["global_step"] == K
    assert meta["history"][-1]["by"] == "import-checkpoint"
    counter = next(t for t in model.training_info[0].algorithm.initializer if t.name == meta["step_counter"])
    assert list(counter.dims) == []  # the scalar counter keeps its shape
    session = onnxtrain.TrainingSession(model)
    _onnx_steps(session, batches[K:])
    _torch_steps(module, optimizer, scheduler, batches[K:])
    _assert_equal(session, module)


@pytest.mark.parametrize("name,scheduled", CASES)
def test_export_then_pytorch_continues(tmp_path, name, scheduled):
    from safetensors.torch import load_file

    batches = _batches()
    session = onnxtrain.TrainingSession(_onnx_model(name, scheduled))
    _onnx_steps(session, batches[:K])
    files = onnxtrain.export_checkpoint(session, tmp_path / "ckpt")
    module, optimizer, scheduler = _torch_setup(name, scheduled)
    module.load_state_dict(load_file(files["weights"]))
    optimizer.load_state_dict(torch.load(files["optimizer"], weights_only=True))
    if scheduled:
        scheduler.load_state_dict(torch.load(files["scheduler"], weights_only=True))
    else:
        assert "scheduler" not in files
    with open(files["trainer_state"]) as f:
        assert json.load(f)["global_step"] == K
    _torch_steps(module, optimizer, scheduler, batches[K:])
    _onnx_steps(session, batches[K:])
    _assert_equal(session, module)


def test_hf_style_folder_with_lambda_scheduler(tmp_path):
    """A Trainer-layout folder (model.safetensors, optimizer.pt, scheduler.pt of a LambdaLR,
    trainer_state.json), written by plain PyTorch the way transformers.Trainer writes it."""
    from safetensors.torch import save_file

    batches = _batches()
    module, optimizer, _ = _torch_setup("adamw", False)
    total = K + M
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: max(0.0, (total - t) / total))
    _torch_steps(module, optimizer, scheduler, batches[:K])
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(folder / "model.safetensors"))
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": K, "epoch": 1.5, "train_batch_size": 8}))
    # The program's LinearLR(1, 0, total) is the same schedule as the lambda.
    m2 = _module()
    o2 = OPTIMIZERS["adamw"](m2.parameters())
    s2 = torch.optim.lr_scheduler.LinearLR(o2, start_factor=1.0, end_factor=0.0, total_iters=total)
    model = onnxtrain.from_torch(m2, batches[0][0], loss=torch.nn.CrossEntropyLoss(), optimizer=o2, lr_scheduler=s2)
    model = onnxtrain.import_checkpoint(model, hf_folder=folder)
    meta = onnxtrain.training_metadata(model)
    assert (meta["progress"]["global_step"], meta["progress"]["epochs_done"], meta["progress"]["batch_size"]) == (K, 1, 8)
    session = onnxtrain.TrainingSession(model)
    _onnx_steps(session, batches[K:])
    _torch_steps(module, optimizer, scheduler, batches[K:])
    _assert_equal(session, module)


def _hf_classes():
    """A tiny transformers model built from its config (no download): an MLP classifier whose
    parameter names survive the ONNX export as initializer names, and a Trainer that reads the
    data in order (Trainer's default RandomSampler would need its seeded order replicated)."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_outputs import SequenceClassifierOutput

    class TinyConfig(transformers.PretrainedConfig):
        model_type = "onnxtrain_tiny_mlp"

        def __init__(self, in_features=8, hidden=16, classes=3, **kwargs):
            super().__init__(**kwargs)
            self.in_features, self.hidden, self.classes = in_features, hidden, classes

    class TinyClassifier(transformers.PreTrainedModel):
        config_class = TinyConfig

        def __init__(self, config):
            super().__init__(config)
            self.hidden = torch.nn.Linear(config.in_features, config.hidden)
            self.out = torch.nn.Linear(config.hidden, config.classes)
            self.post_init()

        def forward(self, input, labels=None):
            logits = self.out(torch.tanh(self.hidden(input)))
            if labels is None:
                return logits  # what the ONNX export traces
            return SequenceClassifierOutput(loss=torch.nn.functional.cross_entropy(logits, labels), logits=logits)

    class InOrderTrainer(transformers.Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return torch.utils.data.SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

    return transformers, TinyConfig, TinyClassifier, InOrderTrainer


class _Rows(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input": self.x[i], "labels": self.y[i]}


# transformers' get_*_schedule_with_warmup as the torch schedulers the program expresses: the
# LambdaLR factor is t / W for t < W (0 at step 0), then (N - t) / (N - W) (linear) or
# (1 + cos(pi (t - W) / (N - W))) / 2 (cosine). LinearLR cannot start at 0 (start_factor > 0),
# so step 0 is a ConstantLR(factor=0) and t in [1, W) a LinearLR from 1/W to 1 over W - 1 steps.
def _hf_schedule_as_torch(kind, optimizer, warmup, total):
    lr = torch.optim.lr_scheduler
    decay = (lr.LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=total - warmup) if kind == "linear"
             else lr.CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=0.0))
    return lr.SequentialLR(optimizer, [lr.ConstantLR(optimizer, factor=0.0, total_iters=1),
                                       lr.LinearLR(optimizer, start_factor=1 / warmup, end_factor=1.0,
                                                   total_iters=warmup - 1), decay], milestones=[1, warmup])


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_hf_trainer_folder(tmp_path, kind):
    """A checkpoint folder written by transformers.Trainer itself (a float64 model built from its
    config, AdamW with the Trainer's two param_groups (weight decay on weights, none on biases),
    a warm-up schedule, gradient clipping at max_grad_norm): onnxtrain imports checkpoint-K and
    trains M steps on the batches the Trainer sees next; the weights equal the Trainer's own
    continuation (train(resume_from_checkpoint=checkpoint-K)) and its uninterrupted K + M steps."""
    pytest.importorskip("accelerate")  # transformers.Trainer needs it
    transformers, TinyConfig, TinyClassifier, InOrderTrainer = _hf_classes()
    batch, warmup, total = 4, 2, K + M
    g = torch.Generator().manual_seed(1)
    x = torch.randn(total * batch, 8, dtype=torch.float64, generator=g) * 3
    y = torch.randint(0, 3, (total * batch,), generator=g)
    data = _Rows(x, y)

    def trainer(out, seed):
        torch.manual_seed(seed)
        args = transformers.TrainingArguments(
            output_dir=str(out), max_steps=total, save_strategy="steps", save_steps=K, per_device_train_batch_size=batch,
            learning_rate=0.05, weight_decay=0.1, adam_beta1=0.8, lr_scheduler_type=kind, warmup_steps=warmup,
            max_grad_norm=1.0, optim="adamw_torch", use_cpu=True, report_to=[], seed=0, logging_strategy="no",
            disable_tqdm=True)
        return InOrderTrainer(model=TinyClassifier(TinyConfig()).double(), args=args, train_dataset=data)

    whole = trainer(tmp_path / "whole", 0)
    whole.train()
    folder = tmp_path / "whole" / f"checkpoint-{K}"
    resumed = trainer(tmp_path / "resumed", 1)
    resumed.train(resume_from_checkpoint=str(folder))

    # The program: the Trainer's own optimizer (create_optimizer) on a fresh copy, its schedule.
    template = trainer(tmp_path / "template", 2)
    optimizer = template.create_optimizer()
    assert [len(gr["params"]) for gr in optimizer.param_groups] == [2, 2]
    schedule = _hf_schedule_as_torch(kind, optimizer, warmup, total)
    hf = transformers.get_scheduler(kind, torch.optim.SGD([torch.zeros(1)], lr=0.05), num_warmup_steps=warmup,
                                    num_training_steps=total)
    model = onnxtrain.from_torch(template.model, x[:batch], loss=torch.nn.CrossEntropyLoss(), optimizer=optimizer,
                                 lr_scheduler=schedule, grad_clip_norm=1.0)
    for _ in range(total):  # the stand-in schedule gives the Trainer's rates (stepped after from_torch read it)
        np.testing.assert_allclose(schedule.get_last_lr()[0], hf.get_last_lr()[0], rtol=1e-12, atol=1e-15)
        for s in (schedule, hf):
            s.optimizer.step()
            s.step()

    model = onnxtrain.import_checkpoint(model, hf_folder=folder)
    meta = onnxtrain.training_metadata(model)
    assert (meta["progress"]["global_step"], meta["progress"]["batch_size"]) == (K, batch)
    assert [g["params"] for g in meta["param_groups"]] == [["hidden.weight", "out.weight"], ["hidden.bias", "out.bias"]]
    session = onnxtrain.TrainingSession(model)
    before = {k: v.copy() for k, v in session.state.items() if k in dict(whole.model.named_parameters())}
    for t in range(K, total):
        session.step({"input": x[t * batch:(t + 1) * batch].numpy(), "label": y[t * batch:(t + 1) * batch].numpy()})
    _assert_equal(session, resumed.model)
    _assert_equal(session, whole.model)
    assert any(not np.allclose(before[k], session.state[k]) for k in before)  # it did train


def _bad(tmp_path):
    batches = _batches()
    module, optimizer, scheduler = _torch_setup("adam", True)
    _torch_steps(module, optimizer, scheduler, batches[:K])
    return module, optimizer, scheduler, _onnx_model("adam", True)


def test_shape_mismatch_and_missing_keys(tmp_path):
    module, _, _, model = _bad(tmp_path)
    weights = dict(module.state_dict())
    weights["0.weight"] = torch.zeros(5, 5, dtype=torch.float64)
    torch.save(weights, tmp_path / "shape.pt")
    with pytest.raises(onnxtrain.Error, match=r"shape.pt: '0.weight': shape \[5, 5\] does not match initializer '0.weight' of shape \[5, 4\]"):
        onnxtrain.import_checkpoint(model, weights=tmp_path / "shape.pt")
    del weights["0.weight"]
    torch.save(weights, tmp_path / "missing.pt")
    with pytest.raises(onnxtrain.Error, match=r"missing.pt: missing keys \['0.weight'\]"):
        onnxtrain.import_checkpoint(model, weights=tmp_path / "missing.pt")


def test_unknown_optimizer_and_mismatched_hyperparameters(tmp_path):
    module, _, _, model = _bad(tmp_path)
    rms = torch.optim.RMSprop(module.parameters())
    torch.save(rms.state_dict(), tmp_path / "rms.pt")
    with pytest.raises(onnxtrain.Error, match=r"rms.pt: unknown optimizer"):
        onnxtrain.import_checkpoint(model, optimizer=tmp_path / "rms.pt")
    other = torch.optim.Adam(module.parameters(), lr=0.5)
    torch.save(other.state_dict(), tmp_path / "lr.pt")
    with pytest.raises(onnxtrain.Error, match=r"param_groups\[0\].lr: checkpoint 0.5, program 0.01"):
        onnxtrain.import_checkpoint(model, optimizer=tmp_path / "lr.pt")
    sgd = torch.optim.SGD(module.parameters(), lr=0.01)
    torch.save(sgd.state_dict(), tmp_path / "sgd.pt")
    with pytest.raises(onnxtrain.Error, match=r"torch.optim.SGD state_dict, but the model's program is Adam"):
        onnxtrain.import_checkpoint(model, optimizer=tmp_path / "sgd.pt")


def test_truncated_safetensors(tmp_path):
    from safetensors.torch import save_file

    module, _, _, model = _bad(tmp_path)
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])
    with pytest.raises(onnxtrain.Error, match=r"w.safetensors: not a valid safetensors file"):
        onnxtrain.import_checkpoint(model, weights=path)


class Opaque:  # torch.load(weights_only=True) refuses to rebuild it
    pass


def test_pickle_that_weights_only_refuses_writes_nothing(tmp_path):
    module, _, _, model = _bad(tmp_path)
    torch.save({"0.weight": Opaque()}, tmp_path / "evil.pt")
    with pytest.raises(onnxtrain.Error, match=r"evil.pt: not loadable with torch.load\(weights_only=True\)"):
        onnxtrain.import_checkpoint(model, weights=tmp_path / "evil.pt")
    # The console script: exit 2, the message, no output file.
    import onnx
    onnx.save(model, tmp_path / "train.onnx")
    out = tmp_path / "out.onnx"
    run = subprocess.run([sys.executable, "-m", "onnxtrain", "import-checkpoint", str(tmp_path / "train.onnx"),
                          "-o", str(out), "--weights", str(tmp_path / "evil.pt")], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    assert "evil.pt: not loadable with torch.load(weights_only=True)" in run.stderr
    assert not out.exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_console_script_import_and_export(tmp_path):
    import onnx

    module, optimizer, scheduler, model = _bad(tmp_path)
    paths = _save_torch(tmp_path, module, optimizer, scheduler)
    onnx.save(model, tmp_path / "train.onnx")
    out = tmp_path / "imported.onnx"
    # What killed writers leave (a process that has exited: its pid is free) is removed by the
    # next write of the same target; a live process's is kept.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f"imported.onnx.tmp-{dead_pid}-17").write_bytes(b"partial")
    (tmp_path / f"x.tmp-{dead_pid}-18").mkdir()
    (tmp_path / f"x.tmp-{dead_pid}-18" / "model.safetensors").write_bytes(b"partial")
    (tmp_path / f"imported.onnx.tmp-{os.getpid()}-19").write_bytes(b"a live writer's")
    run = subprocess.run([sys.executable, "-m", "onnxtrain", "import-checkpoint", str(tmp_path / "train.onnx"), "-o",
                          str(out), "--weights", paths["weights"], "--optimizer", paths["optimizer"], "--scheduler",
                          paths["scheduler"]], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert sorted(p for p in os.listdir(tmp_path) if ".tmp-" in p) == [f"imported.onnx.tmp-{os.getpid()}-19",
                                                                      f"x.tmp-{dead_pid}-18"]
    assert f"imported step {K}" in run.stdout
    run = subprocess.run([sys.executable, "-m", "onnxtrain", "export-checkpoint", str(out), "-o", str(tmp_path / "x")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert sorted(os.listdir(tmp_path / "x")) == ["model.safetensors", "onnxtrain_training.json", "optimizer.pt",
                                                  "scheduler.pt", "trainer_state.json"]
    assert sorted(p for p in os.listdir(tmp_path) if ".tmp-" in p) == [f"imported.onnx.tmp-{os.getpid()}-19"]
    run = subprocess.run([sys.executable, "-m", "onnxtrain", "info", str(out)], capture_output=True, text=True)
    assert "progress: epochs_done 0, global_step 3" in run.stdout
    assert "written by: make-trainable, import-checkpoint" in run.stdout


def test_metadata_written_by_make_trainable_and_train(tmp_path):
    model = _onnx_model("sgd", True)
    meta = onnxtrain.training_metadata(model)
    assert meta["schema_version"] == 1
    assert meta["optimizer"]["type"] == "SGD"
    assert meta["param_groups"][0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert meta["param_groups"][0]["momentum"] == 0.9 and meta["param_groups"][0]["weight_decay"] == 1e-3
    assert meta["state"]["0.weight"] == {"momentum_buffer": "onnxtrain.momentum.0.weight"}
    assert meta["lr_scheduler"] == {"type": "StepLR", "step_size": 2, "gamma": 0.5}
    assert meta["loss"]["type"] == "CrossEntropyLoss" and meta["loss"]["label"] == "label"
    batches = _batches()
    data = {"input": np.concatenate([x.numpy() for x, _ in batches]), "label": np.concatenate([y.numpy() for _, y in batches])}
    result = onnxtrain.train(model, data, batch_size=8, epochs=2, seed=5, progress=False, output=tmp_path / "trained.onnx")
    meta = onnxtrain.training_metadata(tmp_path / "trained.onnx")
    assert meta["progress"]["global_step"] == 2 * (K + M)
    assert meta["progress"]["epochs_done"] == 2 and meta["progress"]["seed"] == 5
    assert meta["history"][-1]["by"] == "train"
    # TrainResult.model carries the metadata the output was written with, also without an output.
    assert onnxtrain.training_metadata(result.model) == meta
    unsaved = onnxtrain.train(model, data, batch_size=8, epochs=1, max_steps=3, seed=5, progress=False)
    progress = onnxtrain.training_metadata(unsaved.model)["progress"]
    assert (progress["global_step"], progress["epochs_done"], progress["batch_size"]) == (3, 0, 8)

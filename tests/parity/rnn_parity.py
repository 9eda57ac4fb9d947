#!/usr/bin/env python3
"""RNN, GRU and LSTM parity with PyTorch: onnxtrain's forward kernels and their gradients
against torch.nn and torch.autograd.

Three kinds of cases, each run with `onnxtrain run` and compared with torch in float32
(rtol 1e-4, atol 1e-5):
- exported: torch.nn.LSTM / GRU / RNN (2 layers, uni- and bidirectional, batch_first or not,
  tanh and relu RNNs) exported by torch.onnx.export, whose exporter reorders the gates and
  emits one ONNX node per layer (GRU with linear_before_reset = 1);
- hand-built: one ONNX node with layout = 1 whose weights this script reorders from torch's
  (torch's LSTM gates are i f g o, ONNX's i o f c; torch's GRU gates are r z n, ONNX's z r h),
  with initial states, checked against a batch_first torch module;
- gradients: the exported modules (weights kept as initializers named like torch's
  parameters) with loss = sum(y * R_y) + sum(h_n * R_h) (+ sum(c_n * R_c)) for fixed random R
  and a Gradient node (xs = every parameter, x and the initial states); each gradient is
  compared with torch.autograd.grad of the same loss.

Usage: rnn_parity.py --onnxtrain build/release/src/onnxtrain
Runs with the project's .venv (PyTorch 2.13, onnx; scripts/setup-deps creates it).
"""
import argparse
import io
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper, TensorProto

RTOL, ATOL = 1e-4, 1e-5
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6


def torch_module(kind, bidirectional, batch_first, layers=2, nonlinearity="tanh"):
    args = dict(input_size=INPUT, hidden_size=HIDDEN, num_layers=layers, bidirectional=bidirectional,
                batch_first=batch_first)
    if kind == "RNN":
        return torch.nn.RNN(nonlinearity=nonlinearity, **args)
    return getattr(torch.nn, kind)(**args)


def random_inputs(kind, module, gen):
    d = 2 if module.bidirectional else 1
    x = torch.randn((BATCH, SEQ, INPUT) if module.batch_first else (SEQ, BATCH, INPUT), generator=gen)
    h0 = torch.randn(module.num_layers * d, BATCH, HIDDEN, generator=gen)
    if kind == "LSTM":
        return x, (h0, torch.randn(module.num_layers * d, BATCH, HIDDEN, generator=gen))
    return x, h0


def run_onnxtrain(onnxtrain, workdir, name, model_bytes, feeds):
    path = os.path.join(workdir, name + ".onnx")
    with open(path, "wb") as f:
        f.write(model_bytes)
    cmd = [onnxtrain, "run", path, "--output-dir", os.path.join(workdir, name + "_out")]
    for key, value in feeds.items():
        file = os.path.join(workdir, f"{name}_{key}.npy")
        np.save(file, value)
        cmd += ["--input", f"{key}={file}"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"onnxtrain run exited {run.returncode}\n{run.stdout}{run.stderr}")
    return lambda output: np.load(os.path.join(workdir, name + "_out", output + ".npy"))


def compare(name, results, what=None):
    ok = True
    for output, (got, want) in results.items():
        if got.shape != want.shape or not np.allclose(got, want, rtol=RTOL, atol=ATOL):
            worst = np.max(np.abs(got - want)) if got.shape == want.shape else float("nan")
            print(f"FAIL {name}: {output} {want.shape} vs {got.shape}: max |diff| {worst:.3g}")
            ok = False
    print(("ok   " if ok else "FAIL ") + f"{name}: {what or ', '.join(results)} against torch")
    return ok


def check_exported(onnxtrain, workdir, name, kind, module, gen, opset):
    x, state = random_inputs(kind, module, gen)
    with torch.no_grad():
        y, final = module(x, state)
    states = list(state) if kind == "LSTM" else [state]
    finals = list(final) if kind == "LSTM" else [final]
    state_names = ["h0", "c0"][: len(states)]
    final_names = ["hn", "cn"][: len(finals)]
    buffer = io.BytesIO()
    torch.onnx.export(module, (x, state if kind != "LSTM" else tuple(states)), buffer, dynamo=False, opset_version=opset,
                      input_names=["x"] + state_names, output_names=["y"] + final_names)
    ops = {n.op_type for n in onnx.load_from_string(buffer.getvalue()).graph.node}
    if kind not in ops:
        raise RuntimeError(f"the exported graph has no {kind} node: {sorted(ops)}")
    feeds = {"x": x.numpy(), **{n: s.numpy() for n, s in zip(state_names, states)}}
    load = run_onnxtrain(onnxtrain, workdir, name, buffer.getvalue(), feeds)
    results = {"y": (load("y"), y.numpy())}
    for n, f in zip(final_names, finals):
        results[n] = (load(n), f.numpy())
    return compare(name, results)


def check_gradients(onnxtrain, workdir, name, kind, module, gen, opset):
    x, state = random_inputs(kind, module, gen)
    states = list(state) if kind == "LSTM" else [state]
    state_names = ["h0", "c0"][: len(states)]
    final_names = ["hn", "cn"][: len(states)]
    params = dict(module.named_parameters())

    # The reference: autograd of the loss with respect to the parameters, x and the states.
    leaves = [t.clone().requires_grad_() for t in [x] + states]
    y, final = module(leaves[0], tuple(leaves[1:]) if kind == "LSTM" else leaves[1])
    outputs = [y] + (list(final) if kind == "LSTM" else [final])
    weights = [torch.randn(o.shape, generator=gen) for o in outputs]
    loss = sum((o * w).sum() for o, w in zip(outputs, weights))
    names = list(params) + ["x"] + state_names
    grads = torch.autograd.grad(loss, list(params.values()) + leaves)
    expected = {n: g.numpy() for n, g in zip(names, grads)}

    # do_constant_folding=False keeps the parameters as initializers under torch's names (the
    # exporter's gate reordering stays as Slice/Concat nodes the gradient flows through).
    buffer = io.BytesIO()
    torch.onnx.export(module, (x, state if kind != "LSTM" else tuple(states)), buffer, dynamo=False, opset_version=opset,
                      input_names=["x"] + state_names, output_names=["y"] + final_names,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    m = onnx.load_from_string(buffer.getvalue())
    g = m.graph
    missing = sorted(set(params) - {i.name for i in g.initializer})
    if missing:
        raise RuntimeError(f"parameters not found as initializers: {missing}")
    terms = []
    for output, w in zip(["y"] + final_names, weights):
        g.initializer.append(numpy_helper.from_array(w.numpy(), "R_" + output))
        g.node.append(helper.make_node("Mul", [output, "R_" + output], ["weighted_" + output]))
        g.node.append(helper.make_node("ReduceSum", ["weighted_" + output], ["sum_" + output], keepdims=0))
        terms.append("sum_" + output)
    g.node.append(helper.make_node("Sum", terms, ["loss"]))
    gradient_outputs = ["grad_" + n for n in names]
    g.node.append(helper.make_node("Gradient", names, gradient_outputs, domain="ai.onnx.preview.training",
                                   name="gradient", xs=names, y="loss"))
    for o in gradient_outputs:
        g.output.append(helper.make_empty_tensor_value_info(o))
    m.opset_import.append(helper.make_opsetid("ai.onnx.preview.training", 1))
    feeds = {"x": x.numpy(), **{n: s.numpy() for n, s in zip(state_names, states)}}
    load = run_onnxtrain(onnxtrain, workdir, name, m.SerializeToString(), feeds)
    return compare(name, {"gradient of " + n: (load("grad_" + n), expected[n]) for n in names},
                   f"gradients of {len(params)} parameters, x, {', '.join(state_names)}")


# ONNX gate order from torch's, as row blocks of a [gates * HIDDEN, ...] weight or bias.
GATE_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2], "RNN": [0]}


def onnx_weights(kind, module):
    """W, R, B of a one-layer torch module, in ONNX's gate order and shapes."""
    order = GATE_ORDER[kind]

    def reorder(t):
        blocks = t.detach().numpy().reshape(len(order), HIDDEN, -1)
        return blocks[order].reshape(len(order) * HIDDEN, -1)

    suffixes = ["", "_reverse"] if module.bidirectional else [""]
    w = np.stack([reorder(getattr(module, "weight_ih_l0" + s)) for s in suffixes])
    r = np.stack([reorder(getattr(module, "weight_hh_l0" + s)) for s in suffixes])
    b = np.stack([np.concatenate([reorder(getattr(module, "bias_ih_l0" + s)).ravel(),
                                  reorder(getattr(module, "bias_hh_l0" + s)).ravel()]) for s in suffixes])
    return w, r, b


def check_hand_built(onnxtrain, workdir, name, kind, bidirectional, gen):
    module = torch_module(kind, bidirectional, batch_first=True, layers=1)
    x, state = random_inputs(kind, module, gen)
    with torch.no_grad():
        y, final = module(x, state)  # y [batch, seq, directions * hidden]
    d = 2 if bidirectional else 1
    w, r, b = onnx_weights(kind, module)
    states = list(state) if kind == "LSTM" else [state]
    finals = list(final) if kind == "LSTM" else [final]
    # layout 1: states are [batch, directions, hidden], Y is [batch, seq, directions, hidden].
    to_layout1 = lambda s: s.numpy().transpose(1, 0, 2).copy()
    inputs = ["X", "W", "R", "B", "", "initial_h"] + (["initial_c"] if kind == "LSTM" else [])
    outputs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    attrs = dict(hidden_size=HIDDEN, layout=1, direction="bidirectional" if bidirectional else "forward")
    if kind == "GRU":
        attrs["linear_before_reset"] = 1  # torch applies the reset gate after the product
    node = helper.make_node(kind, inputs, outputs, **attrs)
    feeds = {"X": x.numpy(), **{n: to_layout1(s) for n, s in zip(inputs[5:], states)}}
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape)) for n, v in feeds.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (("W", w), ("R", r), ("B", b))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    load = run_onnxtrain(onnxtrain, workdir, name, model.SerializeToString(), feeds)
    results = {"Y": (load("Y"), y.numpy().reshape(BATCH, SEQ, d, HIDDEN))}
    for n, f in zip(outputs[1:], finals):
        results[n] = (load(n), to_layout1(f))
    return compare(name, results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxtrain", required=True, help="path of the onnxtrain executable")
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    cases = []
    for kind in ["LSTM", "GRU", "RNN"]:
        for bidirectional in [False, True]:
            for batch_first in [False, True]:
                suffix = f"{kind.lower()}_{'bi' if bidirectional else 'uni'}_{'bf' if batch_first else 'sf'}"
                module = torch_module(kind, bidirectional, batch_first)
                for name, check in [("exported_" + suffix, check_exported), ("gradients_" + suffix, check_gradients)]:
                    cases.append((name, lambda c=check, k=kind, m=module, n=name: c(
                        args.onnxtrain, workdir, n, k, m, gen, opset=14)))
        for bidirectional in [False, True]:
            name = f"layout1_{kind.lower()}_{'bi' if bidirectional else 'uni'}"
            cases.append((name, lambda k=kind, b=bidirectional, n=name: check_hand_built(
                args.onnxtrain, workdir, n, k, b, gen)))
    relu = torch_module("RNN", True, False, nonlinearity="relu")
    for name, check in [("exported_rnn_relu_opset17", check_exported), ("gradients_rnn_relu_opset17", check_gradients)]:
        cases.append((name, lambda c=check, n=name: c(args.onnxtrain, workdir, n, "RNN", relu, gen, opset=17)))
    ok = True
    with tempfile.TemporaryDirectory() as workdir:
        for name, check in cases:
            try:
                ok = check() and ok
            except Exception as e:  # report and go on with the other cases
                print(f"FAIL {name}: {e}")
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

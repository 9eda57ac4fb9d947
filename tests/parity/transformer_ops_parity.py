#!/usr/bin/env python3
"""Parity of the transformer ops with torch.nn.functional, forward and backward.

Each case is a one-node ONNX model run with `onnxtrain run`, compared with PyTorch 2.13 in
float32 (rtol 1e-4, atol 1e-5):
  Attention-23 (causal; GQA with 8 query over 2 key/value heads; 3-D inputs) against
    F.scaled_dot_product_attention(is_causal=True, enable_gqa=True);
  RMSNormalization-23 against F.rms_norm; Gelu-20 (both approximations) against F.gelu;
  RotaryEmbedding-23 (halves and interleaved, partial rotation) against the rotation written
    in torch;
and their backward ops (ai.onnxtrain.AttentionGrad, RMSNormalizationGrad, GeluGrad, and the
RotaryEmbedding rule's RotaryEmbedding with -sin) fed dY = R against torch.autograd.grad of
sum(Y * R).

Usage: transformer_ops_parity.py --onnxtrain build/release/src/onnxtrain
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

RTOL, ATOL = 1e-4, 1e-5
rng = np.random.default_rng(7)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def run_onnxtrain(onnxtrain, tmp, name, nodes, feeds, outputs, opset):
    inputs = [helper.make_tensor_value_info(k, TensorProto.INT64 if v.dtype == np.int64 else TensorProto.FLOAT, v.shape)
              for k, v in feeds.items()]
    graph = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("ai.onnxtrain", 1)],
                              ir_version=10)
    path = os.path.join(tmp, name + ".onnx")
    onnx.save(model, path)
    cmd = [onnxtrain, "run", path, "--output-dir", os.path.join(tmp, name)]
    for k, v in feeds.items():
        np.save(os.path.join(tmp, f"{name}_{k}.npy"), v)
        cmd += ["--input", f"{k}={os.path.join(tmp, f'{name}_{k}.npy')}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{name}: onnxtrain run failed:\n{r.stderr}")
    return [np.load(os.path.join(tmp, name, o + ".npy")) for o in outputs]


def compare(name, got, want):
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    if got.shape != want.shape or not np.allclose(got, want, rtol=RTOL, atol=ATOL):
        err = np.max(np.abs(got - want)) if got.shape == want.shape else f"shape {got.shape} vs {want.shape}"
        print(f"FAIL {name}: max |diff| {err}")
        return False
    print(f"ok   {name}")
    return True


def attention_cases(onnxtrain, tmp):
    ok = True
    for label, hq, hkv, rank3 in [("causal", 4, 4, False), ("causal GQA", 8, 2, False), ("causal GQA 3-D", 8, 2, True)]:
        b, s, d = 2, 9, 8
        q, k, v, r = randn(b, hq, s, d), randn(b, hkv, s, d), randn(b, hkv, s, d), randn(b, hq, s, d)
        tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
        y = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=hq != hkv)
        grads = torch.autograd.grad(y, (tq, tk, tv), torch.tensor(r))
        attrs = {"is_causal": 1}
        to3 = lambda a: a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], -1)  # noqa: E731
        if rank3:
            attrs.update(q_num_heads=hq, kv_num_heads=hkv)
            q, k, v, r = to3(q), to3(k), to3(v), to3(r)
            y, grads = y.detach().numpy().transpose(0, 2, 1, 3).reshape(r.shape), [to3(g.numpy()) for g in grads]
        feeds = {"Q": q, "K": k, "V": v, "R": r}
        got = run_onnxtrain(onnxtrain, tmp, "attention_" + label.replace(" ", "_").replace("-", ""),
                            [helper.make_node("Attention", ["Q", "K", "V"], ["Y"], **attrs),
                             helper.make_node("AttentionGrad", ["R", "Q", "K", "V"], ["dQ", "dK", "dV"], domain="ai.onnxtrain",
                                              version=23, **attrs)],
                            feeds, ["Y", "dQ", "dK", "dV"], 23)
        for n, g, w in zip(["Y", "dQ", "dK", "dV"], got, [y, *grads]):
            ok &= compare(f"Attention {label} {n}", g, w)
    return ok


def rms_norm_cases(onnxtrain, tmp):
    x, w, r = randn(6, 5, 16), randn(16), randn(6, 5, 16)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = F.rms_norm(tx, (16,), tw, eps=1e-5)
    gx, gw = torch.autograd.grad(y, (tx, tw), torch.tensor(r))
    got = run_onnxtrain(onnxtrain, tmp, "rms_norm",
                        [helper.make_node("RMSNormalization", ["X", "W"], ["Y"], axis=-1, epsilon=1e-5),
                         helper.make_node("RMSNormalizationGrad", ["R", "X", "W"], ["dX", "dW"], domain="ai.onnxtrain", axis=-1,
                                          epsilon=1e-5)],
                        {"X": x, "W": w, "R": r}, ["Y", "dX", "dW"], 23)
    return all([compare(f"RMSNormalization {n}", g, t) for n, g, t in zip(["Y", "dX", "dW"], got, [y, gx, gw])])


def gelu_cases(onnxtrain, tmp):
    ok = True
    for approximate in ["none", "tanh"]:
        x, r = randn(7, 11) * 3, randn(7, 11)
        tx = torch.tensor(x, requires_grad=True)
        y = F.gelu(tx, approximate=approximate)
        (gx,) = torch.autograd.grad(y, (tx,), torch.tensor(r))
        got = run_onnxtrain(onnxtrain, tmp, "gelu_" + approximate,
                            [helper.make_node("Gelu", ["X"], ["Y"], approximate=approximate),
                             helper.make_node("GeluGrad", ["R", "X"], ["dX"], domain="ai.onnxtrain", approximate=approximate)],
                            {"X": x, "R": r}, ["Y", "dX"], 20)
        ok &= compare(f"Gelu {approximate} Y", got[0], y) & compare(f"Gelu {approximate} dX", got[1], gx)
    return ok


def rotate(x, cos, sin, interleaved, dim):
    """x [B, H, S, D], cos/sin [B, S, dim / 2]: the RoPE rotation of the first `dim` values."""
    rot, rest = x[..., :dim], x[..., dim:]
    c, s = cos[:, None], sin[:, None]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else rot.chunk(2, dim=-1)
    a, b = c * x1 - s * x2, s * x1 + c * x2
    out = torch.stack((a, b), dim=-1).flatten(-2) if interleaved else torch.cat((a, b), dim=-1)
    return torch.cat((out, rest), dim=-1)


def rotary_cases(onnxtrain, tmp):
    ok = True
    for interleaved, dim in [(0, 8), (1, 8), (0, 4)]:
        x, r = randn(2, 3, 5, 8), randn(2, 3, 5, 8)
        theta = rng.uniform(0, 6, (10, dim // 2)).astype(np.float32)
        cos, sin = np.cos(theta), np.sin(theta)
        ids = rng.integers(0, 10, (2, 5)).astype(np.int64)
        tx = torch.tensor(x, requires_grad=True)
        y = rotate(tx, torch.tensor(cos[ids]), torch.tensor(sin[ids]), interleaved, dim)
        (gx,) = torch.autograd.grad(y, (tx,), torch.tensor(r))
        attrs = {"interleaved": interleaved, "rotary_embedding_dim": dim}
        got = run_onnxtrain(onnxtrain, tmp, f"rotary_{interleaved}_{dim}",
                            [helper.make_node("RotaryEmbedding", ["X", "cos", "sin", "ids"], ["Y"], **attrs),
                             helper.make_node("Neg", ["sin"], ["nsin"]),
                             helper.make_node("RotaryEmbedding", ["R", "cos", "nsin", "ids"], ["dX"], **attrs)],
                            {"X": x, "cos": cos, "sin": sin, "ids": ids, "R": r}, ["Y", "dX"], 23)
        label = f"RotaryEmbedding interleaved={interleaved} dim={dim}"
        ok &= compare(label + " Y", got[0], y) & compare(label + " dX", got[1], gx)
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--onnxtrain", required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        ok = all([attention_cases(a.onnxtrain, tmp), rms_norm_cases(a.onnxtrain, tmp), gelu_cases(a.onnxtrain, tmp),
                  rotary_cases(a.onnxtrain, tmp)])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

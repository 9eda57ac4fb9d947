#!/usr/bin/env python3
"""Writes the inference models of the Fashion-MNIST examples with onnx (the project's .venv).

  mlp.onnx  x float32[N, 784] -> Gemm 784x512 -> Relu -> Gemm 512x512 -> Relu -> Gemm 512x10 -> logits
  cnn.onnx  x float32[N, 1, 28, 28] -> Conv 5x5 32 (pad 2) -> Relu -> MaxPool 2 -> Conv 5x5 64 (pad 2)
            -> Relu -> MaxPool 2 -> Flatten -> Gemm 3136x1024 -> Relu -> Gemm 1024x10 -> logits

Weights are drawn as PyTorch's default initialization does (uniform in +-1/sqrt(fan_in)), with
a fixed seed. Make them trainable with `onnxtrain make-trainable` (see scripts/demo).

Usage: make_model.py OUT_DIR [--seed N]
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def uniform(rng, shape, fan_in):
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def linear(rng, nodes, inits, name, x, n_in, n_out, y):
    inits.append(numpy_helper.from_array(uniform(rng, (n_out, n_in), n_in), name + ".weight"))
    inits.append(numpy_helper.from_array(uniform(rng, (n_out,), n_in), name + ".bias"))
    nodes.append(helper.make_node("Gemm", [x, name + ".weight", name + ".bias"], [y], name=name, transB=1))


def conv(rng, nodes, inits, name, x, c_in, c_out, y):
    fan_in = c_in * 5 * 5
    inits.append(numpy_helper.from_array(uniform(rng, (c_out, c_in, 5, 5), fan_in), name + ".weight"))
    inits.append(numpy_helper.from_array(uniform(rng, (c_out,), fan_in), name + ".bias"))
    nodes.append(helper.make_node("Conv", [x, name + ".weight", name + ".bias"], [y], name=name,
                                  kernel_shape=[5, 5], pads=[2, 2, 2, 2]))


def model(graph):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxtrain-examples")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def mlp(rng):
    nodes, inits = [], []
    linear(rng, nodes, inits, "fc1", "x", 784, 512, "h1")
    nodes.append(helper.make_node("Relu", ["h1"], ["a1"]))
    linear(rng, nodes, inits, "fc2", "a1", 512, 512, "h2")
    nodes.append(helper.make_node("Relu", ["h2"], ["a2"]))
    linear(rng, nodes, inits, "fc3", "a2", 512, 10, "logits")
    return model(helper.make_graph(nodes, "fashion_mnist_mlp",
                                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 784])],
                                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits))


def cnn(rng):
    nodes, inits = [], []
    conv(rng, nodes, inits, "conv1", "x", 1, 32, "c1")
    nodes.append(helper.make_node("Relu", ["c1"], ["r1"]))
    nodes.append(helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]))
    conv(rng, nodes, inits, "conv2", "p1", 32, 64, "c2")
    nodes.append(helper.make_node("Relu", ["c2"], ["r2"]))
    nodes.append(helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]))
    nodes.append(helper.make_node("Flatten", ["p2"], ["f"], axis=1))
    linear(rng, nodes, inits, "fc1", "f", 64 * 7 * 7, 1024, "h")
    nodes.append(helper.make_node("Relu", ["h"], ["a"]))
    linear(rng, nodes, inits, "fc2", "a", 1024, 10, "logits")
    return model(helper.make_graph(nodes, "fashion_mnist_cnn",
                                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28])],
                                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    onnx.save(mlp(rng), os.path.join(args.out_dir, "mlp.onnx"))
    onnx.save(cnn(rng), os.path.join(args.out_dir, "cnn.onnx"))
    print(f"wrote {args.out_dir}/mlp.onnx and {args.out_dir}/cnn.onnx")


if __name__ == "__main__":
    main()

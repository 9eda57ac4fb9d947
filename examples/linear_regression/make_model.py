"""Writes a linear-regression model that carries its own training program.

    .venv/bin/python make_model.py OUT_DIR

OUT_DIR gets model.onnx, x.npy and y.npy. The model's inference graph is Y = X·W + B; its
TrainingInfoProto holds
  - an algorithm graph: loss = mean((Y - Y_true)^2), the gradient of the loss written out
    with plain ONNX ops (dY = 2/N (Y - Y_true), dW = X^T dY, dB = sum(dY)), one step of
    gradient descent (W - lr dW, B - lr dB) and an iteration counter T + 1;
  - update_binding W <- W_new, B <- B_new, T <- T_new;
  - an initialization graph that resets W, B and T to zero (initialization_binding).
Train it with: onnxtrain step OUT_DIR/model.onnx --input X=OUT_DIR/x.npy --input Y_true=OUT_DIR/y.npy --steps 20 -o trained.onnx
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = (x @ np.array([[1.5], [-2.0], [0.5]], dtype=np.float32) + 0.3).astype(np.float32)
    np.save(os.path.join(out_dir, "x.npy"), x)
    np.save(os.path.join(out_dir, "y.npy"), y)

    f32 = lambda a: numpy_helper.from_array(np.asarray(a, dtype=np.float32))  # noqa: E731

    def init(name, array):
        t = numpy_helper.from_array(np.asarray(array))
        t.name = name
        return t

    inference = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["Y"])],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])],
        [init("W", np.zeros((3, 1), np.float32)), init("B", np.zeros((1,), np.float32))],
    )
    algorithm = helper.make_graph(
        [
            helper.make_node("Sub", ["Y", "Y_true"], ["diff"]),
            helper.make_node("Mul", ["diff", "diff"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0),
            helper.make_node("Shape", ["X"], ["x_shape"]),
            helper.make_node("Gather", ["x_shape", "zero"], ["n_int"], axis=0),
            helper.make_node("Cast", ["n_int"], ["n"], to=TensorProto.FLOAT),
            helper.make_node("Div", ["two", "n"], ["scale"]),
            helper.make_node("Mul", ["diff", "scale"], ["dY"]),
            helper.make_node("Transpose", ["X"], ["Xt"]),
            helper.make_node("MatMul", ["Xt", "dY"], ["dW"]),
            helper.make_node("ReduceSum", ["dY"], ["dB"], keepdims=0),
            helper.make_node("Mul", ["lr", "dW"], ["step_W"]),
            helper.make_node("Sub", ["W", "step_W"], ["W_new"]),
            helper.make_node("Mul", ["lr", "dB"], ["step_B"]),
            helper.make_node("Sub", ["B", "step_B"], ["B_new"]),
            helper.make_node("Add", ["T", "one"], ["T_new"]),
        ],
        "gradient_descent",
        [helper.make_tensor_value_info("Y_true", TensorProto.FLOAT, ["N", 1])],
        [
            helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("W_new", TensorProto.FLOAT, [3, 1]),
            helper.make_tensor_value_info("B_new", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("T_new", TensorProto.INT64, []),
        ],
        [init("lr", np.float32(0.1)), init("two", np.float32(2.0)), init("zero", np.int64(0)),
         init("one", np.int64(1)), init("T", np.int64(0))],
    )
    initialization = helper.make_graph(
        [
            helper.make_node("Constant", [], ["W_zero"], value=f32(np.zeros((3, 1)))),
            helper.make_node("Constant", [], ["B_zero"], value=f32(np.zeros((1,)))),
            helper.make_node("Constant", [], ["T_zero"], value=numpy_helper.from_array(np.int64(0))),
        ],
        "reset",
        [],
        [
            helper.make_tensor_value_info("W_zero", TensorProto.FLOAT, [3, 1]),
            helper.make_tensor_value_info("B_zero", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("T_zero", TensorProto.INT64, []),
        ],
    )
    model = helper.make_model(inference, opset_imports=[helper.make_opsetid("", 13)])
    info = model.training_info.add()
    info.algorithm.CopyFrom(algorithm)
    info.initialization.CopyFrom(initialization)
    for key, value in [("W", "W_new"), ("B", "B_new"), ("T", "T_new")]:
        info.update_binding.add(key=key, value=value)
    for key, value in [("W", "W_zero"), ("B", "B_zero"), ("T", "T_zero")]:
        info.initialization_binding.add(key=key, value=value)
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out_dir, "model.onnx"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

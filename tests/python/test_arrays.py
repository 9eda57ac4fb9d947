"""Arrays in and out: every element type, NumPy, ml_dtypes and PyTorch, zero-copy and copies.

The oracle for the mapping of ONNX element types to NumPy dtypes is onnx's own
helper.tensor_dtype_to_np_dtype; for values, NumPy, ml_dtypes' casts and PyTorch's arithmetic.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from conftest import model
from onnx import TensorProto, helper

import onnxtrain
from onnxtrain import _core

OPSET = 28  # Cast-28: every narrow type, float6 included

# Element types whose arrays round-trip through Identity, with values to send.
PLAIN = {
    TensorProto.FLOAT: [1.5, -2.25, 0.0],
    TensorProto.DOUBLE: [1e300, -1e-300, 0.5],
    TensorProto.FLOAT16: [1.5, -65504.0, 2.0**-24],
    TensorProto.INT8: [-128, 127, 0],
    TensorProto.INT16: [-32768, 32767, 1],
    TensorProto.INT32: [-(2**31), 2**31 - 1, 2],
    TensorProto.INT64: [-(2**63), 2**63 - 1, 3],
    TensorProto.UINT8: [0, 255, 4],
    TensorProto.UINT16: [0, 65535, 5],
    TensorProto.UINT32: [0, 2**32 - 1, 6],
    TensorProto.UINT64: [0, 2**64 - 1, 7],
    TensorProto.BOOL: [True, False, True],
}
# Types NumPy lacks (ml_dtypes), with values every one of them holds exactly.
NARROW = [
    TensorProto.BFLOAT16,
    TensorProto.FLOAT8E4M3FN,
    TensorProto.FLOAT8E4M3FNUZ,
    TensorProto.FLOAT8E5M2,
    TensorProto.FLOAT8E5M2FNUZ,
    TensorProto.FLOAT4E2M1,
    TensorProto.FLOAT6E2M3,
    TensorProto.FLOAT6E3M2,
    TensorProto.INT4,
    TensorProto.UINT4,
    TensorProto.INT2,
    TensorProto.UINT2,
]
NARROW_VALUES = {
    TensorProto.UINT4: [0.0, 1.0, 15.0],
    TensorProto.INT4: [-8.0, -1.0, 7.0],
    TensorProto.UINT2: [0.0, 1.0, 3.0],
    TensorProto.INT2: [-2.0, -1.0, 1.0],
}
DEFAULT_NARROW_VALUES = [-1.5, 0.5, 4.0]


def identity_model(elem_type):
    return model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", elem_type, [3])],
        [helper.make_tensor_value_info("y", elem_type, [3])],
        opset=OPSET,
    )


@pytest.mark.parametrize("elem_type", list(PLAIN), ids=lambda t: TensorProto.DataType.Name(t))
def test_numpy_types_round_trip(elem_type):
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    x = np.array(PLAIN[elem_type], dtype=dtype)
    session = onnxtrain.InferenceSession(identity_model(elem_type))
    assert session.inputs[0].dtype == dtype
    y = session.run({"x": x})["y"]
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("elem_type", NARROW, ids=lambda t: TensorProto.DataType.Name(t))
def test_ml_dtypes_in_and_out(elem_type):
    # Cast to and from float32 checks the values, not only the bits: what onnxtrain reads from an
    # ml_dtypes array and what it returns as one must be what ml_dtypes means by those arrays.
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    values = np.array(NARROW_VALUES.get(elem_type, DEFAULT_NARROW_VALUES), np.float32)
    m = model(
        [
            helper.make_node("Cast", ["x"], ["x_float"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["f"], ["y"], to=elem_type),
        ],
        [helper.make_tensor_value_info("x", elem_type, [3]), helper.make_tensor_value_info("f", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("x_float", TensorProto.FLOAT, [3]), helper.make_tensor_value_info("y", elem_type, [3])],
        opset=OPSET,
    )
    session = onnxtrain.InferenceSession(m)
    assert session.inputs[0].dtype == dtype and session.outputs[1].dtype == dtype
    x = values.astype(dtype)
    out = session.run({"x": x, "f": values})
    np.testing.assert_array_equal(out["x_float"], values)
    assert out["y"].dtype == dtype
    np.testing.assert_array_equal(out["y"].astype(np.float32), values)
    np.testing.assert_array_equal(out["y"].view(np.uint8 if dtype.itemsize == 1 else np.uint16),
                                  x.view(np.uint8 if dtype.itemsize == 1 else np.uint16))


TORCH_TYPES = [
    (torch.float32, TensorProto.FLOAT),
    (torch.float64, TensorProto.DOUBLE),
    (torch.float16, TensorProto.FLOAT16),
    (torch.bfloat16, TensorProto.BFLOAT16),
    (torch.int8, TensorProto.INT8),
    (torch.int16, TensorProto.INT16),
    (torch.int32, TensorProto.INT32),
    (torch.int64, TensorProto.INT64),
    (torch.uint8, TensorProto.UINT8),
    (torch.bool, TensorProto.BOOL),
    (torch.float8_e4m3fn, TensorProto.FLOAT8E4M3FN),
    (torch.float8_e5m2, TensorProto.FLOAT8E5M2),
    (torch.float8_e4m3fnuz, TensorProto.FLOAT8E4M3FNUZ),
    (torch.float8_e5m2fnuz, TensorProto.FLOAT8E5M2FNUZ),
]


@pytest.mark.parametrize("torch_dtype,elem_type", TORCH_TYPES, ids=lambda v: str(v))
def test_torch_tensors_in(torch_dtype, elem_type):
    # Cast to float64 reads the values (onnxtrain's Identity has no float8 row).
    m = model(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE)],
        [helper.make_tensor_value_info("x", elem_type, [3])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3])],
        opset=OPSET,
    )
    t = torch.tensor([1.0, -2.0, 0.5 if torch_dtype.is_floating_point else 0.0]).to(torch_dtype)
    y = onnxtrain.InferenceSession(m).run({"x": t})["y"]
    np.testing.assert_array_equal(y, t.to(torch.float64).numpy())


@pytest.mark.parametrize("torch_dtype,elem_type", [(torch.float16, TensorProto.FLOAT16), (torch.bfloat16, TensorProto.BFLOAT16)])
def test_half_arithmetic_matches_torch(torch_dtype, elem_type):
    m = model(
        [helper.make_node("Mul", ["a", "b"], ["y"])],
        [helper.make_tensor_value_info(n, elem_type, [64]) for n in "ab"],
        [helper.make_tensor_value_info("y", elem_type, [64])],
    )
    torch.manual_seed(0)
    a, b = torch.randn(64).to(torch_dtype), torch.randn(64).to(torch_dtype)
    y = onnxtrain.InferenceSession(m).run({"a": a, "b": b})["y"]
    # Both round the exact float32 product of two halfs (exact in float32) to nearest even.
    np.testing.assert_array_equal(y.astype(np.float32), (a * b).to(torch.float32).numpy())
    if torch_dtype == torch.bfloat16:
        assert y.dtype == np.dtype(ml_dtypes.bfloat16)


def aligned(n, dtype, offset):
    """A NumPy array of n elements whose data starts `offset` bytes after a 64-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    buf = np.empty(n * itemsize + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    return buf[start : start + n * itemsize].view(dtype)


def test_zero_copy_in_when_aligned():
    session = onnxtrain.InferenceSession(identity_model(TensorProto.FLOAT))
    x = aligned(3, np.float32, 0)
    x[:] = [1, 2, 3]
    before = _core._copies_in()
    np.testing.assert_array_equal(session.run({"x": x})["y"], [1, 2, 3])
    assert _core._copies_in() == before  # viewed
    t = torch.tensor([4.0, 5.0, 6.0])  # PyTorch's CPU allocator aligns to 64 bytes
    np.testing.assert_array_equal(session.run({"x": t})["y"], [4, 5, 6])
    assert _core._copies_in() == before
    x = aligned(3, np.float32, 4)
    x[:] = [7, 8, 9]
    np.testing.assert_array_equal(session.run({"x": x})["y"], [7, 8, 9])
    assert _core._copies_in() == before + 1  # not aligned: one copy


def test_viewed_input_is_not_changed_and_outlives_the_call():
    m = model(
        [helper.make_node("Neg", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    t = torch.tensor([1.0, 2.0, 3.0])
    y = onnxtrain.InferenceSession(m).run({"x": t})["y"]
    assert t.tolist() == [1.0, 2.0, 3.0] and y.tolist() == [-1.0, -2.0, -3.0]


def test_non_contiguous_and_read_only_arrays():
    m = model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
    )
    session = onnxtrain.InferenceSession(m)
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(session.run({"x": base.T})["y"], base.T)
    tb = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    np.testing.assert_array_equal(session.run({"x": tb.T})["y"], tb.T.numpy())
    ro = np.ascontiguousarray(base.T)
    ro.flags.writeable = False
    np.testing.assert_array_equal(session.run({"x": ro})["y"], ro)


def test_scalars_and_lists_go_through_numpy():
    m = model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [helper.make_tensor_value_info("a", TensorProto.DOUBLE, []), helper.make_tensor_value_info("b", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])],
    )
    m.graph.node[0].input[1] = "b_float"
    m.graph.node.insert(0, helper.make_node("Cast", ["b"], ["b_float"], to=TensorProto.DOUBLE))
    y = onnxtrain.InferenceSession(m).run({"a": 0.5, "b": [1, 2]})["y"]
    np.testing.assert_array_equal(y, [1.5, 2.5])


def test_unsupported_arrays():
    session = onnxtrain.InferenceSession(identity_model(TensorProto.FLOAT))
    with pytest.raises(onnxtrain.Error, match="feed 'x': arrays of complex"):
        session.run({"x": np.zeros(3, np.complex64)})
    with pytest.raises(onnxtrain.Error, match="feed 'x': element 0 of the object array is object"):
        session.run({"x": object()})


def test_empty_and_scalar_tensors():
    m = model(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["s"], ["t"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 3]), helper.make_tensor_value_info("s", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, 3]), helper.make_tensor_value_info("t", TensorProto.INT64, [])],
    )
    out = onnxtrain.InferenceSession(m).run({"x": np.zeros((0, 3), np.float32), "s": np.int64(7)})
    assert out["y"].shape == (0, 3) and out["y"].dtype == np.float32
    assert out["t"].shape == () and out["t"] == 7


def test_mapping_of_dtypes_is_onnx_s():
    # Every type of onnx.proto that a Tensor holds has the dtype onnx's helper names.
    m = identity_model(TensorProto.FLOAT)
    for elem_type in list(PLAIN) + NARROW:
        m.graph.input[0].type.tensor_type.elem_type = elem_type
        m.graph.output[0].type.tensor_type.elem_type = elem_type
        info = onnxtrain.InferenceSession(m).inputs[0]
        assert info.dtype == helper.tensor_dtype_to_np_dtype(elem_type), onnx.TensorProto.DataType.Name(elem_type)

"""InferenceSession: models from paths, ModelProtos and bytes; run(); metadata; bad input."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from conftest import identity, mlp_reference, model
from onnx import TensorProto, helper

import onnxtrain


def test_run_matches_numpy(mlp_model, batch):
    x, _ = batch
    session = onnxtrain.InferenceSession(mlp_model)
    out = session.run({"x": x})
    assert list(out) == ["logits"]
    assert out["logits"].dtype == np.float32 and out["logits"].shape == (5, 3)
    np.testing.assert_allclose(out["logits"], mlp_reference(mlp_model, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["str", "pathlib", "proto", "bytes"])
def test_model_sources(kind, mlp_model, batch, tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model, path)
    source = {"str": str(path), "pathlib": path, "proto": mlp_model, "bytes": mlp_model.SerializeToString()}[kind]
    out = onnxtrain.InferenceSession(source).run({"x": batch[0]})
    np.testing.assert_allclose(out["logits"], mlp_reference(mlp_model, batch[0]), rtol=1e-5, atol=1e-6)


def test_metadata(mlp_model):
    session = onnxtrain.InferenceSession(mlp_model)
    (x,) = session.inputs
    assert (x.name, x.dtype, x.shape, x.type) == ("x", np.dtype(np.float32), ("N", 4), "float32[N,4]")
    (y,) = session.outputs
    assert (y.name, y.dtype, y.shape) == ("logits", np.dtype(np.float32), ("N", 3))
    assert session.optional_inputs == []
    assert "logits" in repr(y)


def test_metadata_unknown_dims_and_rank():
    m = model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        check=False,  # the checker wants a shape on outputs; onnxtrain takes a model without
    )
    session = onnxtrain.InferenceSession(m)
    assert session.inputs[0].shape == (None, 2)
    assert session.outputs[0].shape is None


def test_wrong_dtype_is_error_with_cpp_message(mlp_model):
    session = onnxtrain.InferenceSession(mlp_model)
    with pytest.raises(onnxtrain.Error, match=r"input 'x' expects float32\[N,4\] but was fed float64\[2,4\]"):
        session.run({"x": np.zeros((2, 4))})


def test_error_is_value_error(mlp_model):
    assert issubclass(onnxtrain.Error, ValueError)
    with pytest.raises(ValueError):
        onnxtrain.InferenceSession(mlp_model).run({})


def test_missing_feed(mlp_model):
    with pytest.raises(onnxtrain.Error, match="missing feed for input 'x'"):
        onnxtrain.InferenceSession(mlp_model).run({})


def test_unknown_feed(mlp_model, batch):
    with pytest.raises(onnxtrain.Error, match="'z'"):
        onnxtrain.InferenceSession(mlp_model).run({"x": batch[0], "z": batch[0]})


def test_wrong_rank_and_dim(mlp_model):
    session = onnxtrain.InferenceSession(mlp_model)
    with pytest.raises(onnxtrain.Error, match="input 'x'"):
        session.run({"x": np.zeros((2, 4, 1), np.float32)})
    with pytest.raises(onnxtrain.Error, match="input 'x'"):
        session.run({"x": np.zeros((2, 5), np.float32)})


def test_feeds_must_be_a_mapping_of_arrays(mlp_model, batch):
    session = onnxtrain.InferenceSession(mlp_model)
    with pytest.raises(TypeError, match="mapping"):
        session.run([batch[0]])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="names must be str"):
        session.run({0: batch[0]})  # type: ignore[dict-item]
    with pytest.raises(onnxtrain.Error, match="feed 'x'.*element 0 of the object array is object"):
        session.run({"x": np.array([object()], dtype=object)})


def test_bad_model_path(tmp_path):
    with pytest.raises(onnxtrain.Error, match="missing.onnx: no such file"):
        onnxtrain.InferenceSession(tmp_path / "missing.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(onnxtrain.Error, match="garbage.onnx"):
        onnxtrain.InferenceSession(garbage)
    with pytest.raises(TypeError, match="model must be a path"):
        onnxtrain.InferenceSession(3)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.onnx"]


def test_unsupported_operator_names_the_node():
    m = model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu0")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(onnxtrain.Error, match="NoSuchOp"):
        onnxtrain.InferenceSession(m)


def test_bad_threads(mlp_model):
    with pytest.raises(onnxtrain.Error, match="threads"):
        onnxtrain.InferenceSession(mlp_model, threads=-1)
    assert onnxtrain.InferenceSession(mlp_model, threads=1, seed=3, fuse=False).run(
        {"x": np.ones((1, 4), np.float32)}
    )["logits"].shape == (1, 3)


def test_seed_reproduces_random_ops():
    m = model(
        [helper.make_node("RandomNormal", [], ["y"], shape=[4], dtype=TensorProto.FLOAT)],
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    a = onnxtrain.InferenceSession(m, seed=7).run({})["y"]
    b = onnxtrain.InferenceSession(m, seed=7).run({})["y"]
    c = onnxtrain.InferenceSession(m, seed=8).run({})["y"]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_sequence_and_optional_values():
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    opt = helper.make_value_info("o", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None)))
    m = model(
        [
            helper.make_node("SequenceLength", ["s"], ["n"]),
            helper.make_node("ConcatFromSequence", ["s"], ["cat"], axis=0),
            helper.make_node("SplitToSequence", ["cat"], ["parts"], axis=0),
            helper.make_node("OptionalHasElement", ["o"], ["has"]),
            helper.make_node("Identity", ["o"], ["o_out"]),
        ],
        [seq, opt],
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("cat", TensorProto.FLOAT, None),
            helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("has", TensorProto.BOOL, []),
            helper.make_value_info("o_out", opt.type),
        ],
        opset=18,
        check=False,  # the checker wants shapes on the sequence and optional outputs
    )
    session = onnxtrain.InferenceSession(m)
    assert session.inputs[0].dtype is None and session.inputs[0].type == "sequence(float32)"
    a, b = np.array([1, 2], np.float32), np.array([3], np.float32)
    out = session.run({"s": [a, b], "o": None})
    assert out["n"] == 2 and out["has"] == False  # noqa: E712 (a NumPy bool)
    np.testing.assert_array_equal(out["cat"], [1, 2, 3])
    assert isinstance(out["parts"], list) and [p.tolist() for p in out["parts"]] == [[1], [2], [3]]
    assert out["o_out"] is None
    out = session.run({"s": (b,), "o": b})
    assert out["n"] == 1 and out["has"] == True  # noqa: E712
    np.testing.assert_array_equal(out["o_out"], b)
    with pytest.raises(onnxtrain.Error, match="feed 's'.*pass a list"):
        session.run({"s": a, "o": None})


def test_strings_in_and_out():
    m = model(
        [helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="UPPER")],
        [helper.make_tensor_value_info("x", TensorProto.STRING, [3])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [3])],
    )
    session = onnxtrain.InferenceSession(m)
    assert session.inputs[0].dtype == np.dtype(object)
    for x in (np.array(["ab", "ç", "x y"]), np.array([b"ab", "ç".encode(), b"x y"]), ["ab", "ç", "x y"]):
        y = session.run({"x": x})["y"]
        assert y.dtype == object and y.tolist() == ["AB", "Ç", "X Y"]


def test_path_like_objects(tmp_path, mlp_model, batch):
    class Path:
        def __fspath__(self) -> str:
            return str(tmp_path / "m.onnx")

    onnx.save(mlp_model, tmp_path / "m.onnx")
    assert onnxtrain.InferenceSession(Path()).run({"x": batch[0]})["logits"].shape == (5, 3)
    assert isinstance(tmp_path, pathlib.Path)


def test_outputs_are_writable_and_outlive_the_session(mlp_model, batch):
    session = onnxtrain.InferenceSession(mlp_model)
    y = session.run({"x": batch[0]})["logits"]
    del session
    np.testing.assert_allclose(y, mlp_reference(mlp_model, batch[0]), rtol=1e-5, atol=1e-6)
    assert y.flags.writeable
    y[0, 0] = 42
    assert y[0, 0] == 42


def test_output_that_is_a_feed_is_read_only(batch):
    # Identity's output is its input's memory: the array must not let Python write into the feed.
    y = onnxtrain.InferenceSession(identity(TensorProto.FLOAT, ["N", 4])).run({"x": batch[0]})["y"]
    np.testing.assert_array_equal(y, batch[0])
    assert not y.flags.writeable


def test_output_that_is_an_initializer_is_read_only():
    w = np.arange(3, dtype=np.float32)
    m = model(
        [helper.make_node("Identity", ["w"], ["y"])],
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    session = onnxtrain.InferenceSession(m)
    y = session.run({})["y"]
    np.testing.assert_array_equal(y, w)
    assert not y.flags.writeable
    with pytest.raises(ValueError):
        y[0] = 5
    np.testing.assert_array_equal(session.run({})["y"], w)

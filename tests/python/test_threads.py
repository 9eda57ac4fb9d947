"""The GIL is released while sessions run, and one session's calls from threads serialize."""

from __future__ import annotations

import threading
import time

import numpy as np
from conftest import model, mlp_reference
from onnx import TensorProto, helper, numpy_helper

import onnxtrain


def heavy_model(n=768, depth=6):
    """x[n, n] -> `depth` MatMuls by a fixed [n, n] weight: about depth * 2 n^3 flops."""
    w = np.eye(n, dtype=np.float32) * 0.5
    nodes, prev = [], "x"
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"h{i}"]))
        prev = f"h{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    return model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        [numpy_helper.from_array(w, "w")],
    )


def test_python_runs_while_a_session_runs():
    session = onnxtrain.InferenceSession(heavy_model(), threads=1)
    x = np.ones((768, 768), np.float32)
    session.run({"x": x})  # plans once, outside the measurement
    times = []

    def work():
        start = time.perf_counter()
        for _ in range(3):
            session.run({"x": x})
        times.append(time.perf_counter() - start)

    t = threading.Thread(target=work)
    ticks = [time.perf_counter()]
    t.start()
    while t.is_alive():
        ticks.append(time.perf_counter())
    t.join()
    gaps = np.diff(ticks)
    # With the GIL held by run(), this loop would stall for a whole run (at least a third of the
    # thread's time); released, it keeps ticking (Python's switch interval is 5 ms).
    assert times[0] > 0.05, "the model ran too fast to tell"
    assert gaps.max() < times[0] / 6, (gaps.max(), times[0])


def test_two_sessions_run_at_the_same_time():
    sessions = [onnxtrain.InferenceSession(heavy_model(), threads=1) for _ in range(2)]
    x = np.ones((768, 768), np.float32)
    for s in sessions:
        s.run({"x": x})
    spans: list[list[tuple[float, float]]] = [[], []]
    barrier = threading.Barrier(2)

    def work(i):
        barrier.wait()
        for _ in range(3):
            start = time.perf_counter()
            sessions[i].run({"x": x})
            spans[i].append((start, time.perf_counter()))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Runs on separate sessions overlap in time: neither waits for the other (nor for the GIL).
    overlap = any(a0 < b1 and b0 < a1 for a0, a1 in spans[0] for b0, b1 in spans[1])
    assert overlap, spans


def test_one_session_from_several_threads(mlp_model):
    session = onnxtrain.InferenceSession(mlp_model)
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(rng.integers(1, 9), 4)).astype(np.float32) for _ in range(8)]
    errors = []

    def work(k):
        for i in range(40):
            x = inputs[(k + i) % len(inputs)]
            y = session.run({"x": x})["logits"]
            if not np.allclose(y, mlp_reference(mlp_model, x), rtol=1e-5, atol=1e-6):
                errors.append((k, i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_training_steps_from_several_threads(batch):
    session = onnxtrain.TrainingSession(onnxtrain.make_trainable(mlp_model_for_threads()))
    feeds = {"x": batch[0], "label": batch[1]}

    def work():
        for _ in range(25):
            session.step(feeds)
            _ = session.state

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert session.steps_done == 100
    assert np.isfinite(session.state["w1"]).all()


def mlp_model_for_threads():
    from conftest import mlp

    return mlp(seed=5)

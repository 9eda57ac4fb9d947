"""bench/bench_primitives.cpp (onnxtrain-bench-primitives): the program bench/onednn_versions.py
builds against both oneDNN releases. Here against the one onnxtrain links: each subcommand's JSON
fields, its FLOP count, and its errors.

Run by ctest (bench_yardsticks) with ONNXTRAIN_BENCH_PRIMITIVES naming the program.
"""
import json
import os
import subprocess

import pytest


def tool():
    path = os.environ.get("ONNXTRAIN_BENCH_PRIMITIVES")
    if not path:
        pytest.skip("ONNXTRAIN_BENCH_PRIMITIVES is not set (ctest sets it)")
    return path


def run(*args):
    out = subprocess.run([tool(), *args, "--threads", "1", "--repeats", "2"], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def test_product_times_sgemm_and_the_matmul_primitive():
    r = run("product", "--m", "24", "--n", "40", "--k", "16")
    assert r["gflop"] == pytest.approx(2 * 24 * 40 * 16 / 1e9)
    assert r["sgemm_ms"] > 0 and r["matmul_ms"] > 0
    assert r["matmul_impl"] and r["onednn"].split(".")[0].isdigit()


def test_lstm_layer():
    r = run("lstm", "--steps", "3", "--batch", "2", "--input", "5", "--hidden", "4")
    assert r["gflop"] == pytest.approx(2 * 3 * 2 * 4 * 4 * (5 + 4) / 1e9)  # 4 gates of H over input + hidden
    assert r["ms"] > 0 and r["impl"]


def test_convolution_inference_and_training():
    args = ["conv", "--batch", "2", "--in-channels", "3", "--out-channels", "4", "--size", "6", "--kernel", "3"]
    inference = run(*args)
    taps = 2 * 4 * 6 * 6 * 3 * 3 * 3  # pads 1 keep 6x6
    assert inference["gflop"] == pytest.approx(2 * taps / 1e9)
    assert inference["forward_ms"] > 0 and inference["forward_impl"] and "backward_data_ms" not in inference
    training = run(*args, "--training")
    assert training["gflop"] == pytest.approx(3 * 2 * taps / 1e9)
    for key in ("forward", "backward_data", "backward_weights"):
        assert training[key + "_ms"] > 0 and training[key + "_impl"]
    strided = run("conv", "--batch", "1", "--in-channels", "2", "--out-channels", "2", "--size", "7", "--kernel", "3",
                  "--stride", "2")
    assert strided["gflop"] == pytest.approx(2 * (1 * 2 * 4 * 4 * 2 * 3 * 3) / 1e9)  # (7 + 2 - 3) / 2 + 1 = 4


def test_bad_arguments():
    zero = subprocess.run([tool(), "product", "--m", "0", "--n", "1", "--k", "1"], capture_output=True, text=True)
    assert zero.returncode != 0 and "--m" in zero.stderr
    none = subprocess.run([tool()], capture_output=True, text=True)
    assert none.returncode != 0 and "subcommand" in (none.stdout + none.stderr).lower()

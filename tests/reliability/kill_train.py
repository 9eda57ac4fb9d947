"""Fault injection: kill -9 at random moments of `onnxtrain train` (issue 19).

An MLP (32-256-10, Adam) trains 3 epochs of 32 batches with a checkpoint after every step,
on one thread. A reference run goes uninterrupted; then each of --kills trials starts the same
run, sends SIGKILL at a moment drawn uniformly from [0, 1.1 x the reference run's wall time],
and checks:
  - the checkpoint, when one was written, loads (`onnxtrain info`) and is at the step the run
    reached or the one before (a kill during a checkpoint's save leaves the previous one);
  - `train --resume` from it (a fresh run when the kill came before the first checkpoint)
    exits 0 and writes an output and a last checkpoint equal byte for byte to the reference
    run's: steps are deterministic on a fixed thread count, the batch order is a function of
    --seed and the position, and a resumed run's output carries no trace of the resume;
  - no temporary file ("<file>.tmp-PID-N") is left after the resumed run, although each trial
    plants one of the dead writer's for each file the resumed run writes, as a filesystem
    without O_TMPFILE would leave it; a planted one of a live process (this script) is kept.
Every kill moment must pass. The seed of the kill moments is printed (ONNXTRAIN_KILL_SEED
repeats a run). Exit 0 when all pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TMP_PATTERN = re.compile(r"\.tmp-(\d+)-(\d+)$")


def make_inputs(folder: str) -> None:
    rng = np.random.default_rng(0)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.normal(size=shape) * 0.1).astype(np.float32), name)

    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["logits"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
                              [init("W1", 32, 256), init("b1", 256), init("W2", 256, 10), init("b2", 10)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder + "/mlp.onnx")
    np.savez(folder + "/data.npz", x=rng.normal(size=(512, 32)).astype(np.float32),
             label=rng.integers(0, 10, size=512))


def temporaries(folder: str) -> list[str]:
    return sorted(name for name in os.listdir(folder) if TMP_PATTERN.search(name))


def last_metrics_step(path: str) -> int:
    step = 0
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    step = json.loads(line)["step"]
                except (ValueError, KeyError):
                    pass  # a line cut short by the kill
    return step


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnxtrain", required=True)
    parser.add_argument("--kills", type=int, default=50)
    args = parser.parse_args()
    exe = args.onnxtrain
    seed = int(os.environ.get("ONNXTRAIN_KILL_SEED", time.time_ns() % 1_000_000))
    print(f"kill moments seeded with ONNXTRAIN_KILL_SEED={seed}")
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="onnxtrain-kill-")
    failures: list[str] = []
    try:
        make_inputs(work)
        subprocess.run([exe, "make-trainable", work + "/mlp.onnx", "-o", work + "/train.onnx", "--optimizer", "adam"],
                       check=True, stdout=subprocess.DEVNULL)

        def train_command(folder: str, resume: str | None = None) -> list[str]:
            command = [exe, "train", work + "/train.onnx", "--data", work + "/data.npz", "--batch-size", "16",
                       "--epochs", "3", "--checkpoint-every", "1", "--threads", "1", "-q",
                       "-o", folder + "/out.onnx", "--metrics", folder + "/metrics.jsonl"]
            return command + (["--resume", resume] if resume else [])

        ref = work + "/ref"
        os.makedirs(ref)
        start = time.monotonic()
        subprocess.run(train_command(ref), check=True)
        run_time = time.monotonic() - start
        steps = last_metrics_step(ref + "/metrics.jsonl")
        expected = {name: open(f"{ref}/{name}", "rb").read() for name in ("out.onnx", "out.ckpt.onnx")}
        print(f"reference run: {steps} steps, {steps} checkpoints, {run_time:.2f} s")

        outcomes = {"before the first checkpoint": 0, "during a checkpoint's save": 0, "between saves": 0,
                    "after the run ended": 0}
        left_by_kill = 0
        trial_dir = work + "/trial"
        for trial in range(args.kills):
            shutil.rmtree(trial_dir, ignore_errors=True)
            os.makedirs(trial_dir)
            delay = rng.uniform(0, 1.1 * run_time)
            process = subprocess.Popen(train_command(trial_dir))
            time.sleep(delay)
            process.send_signal(signal.SIGKILL)
            status = process.wait()
            where = f"trial {trial} (kill after {delay:.3f} s, pid {process.pid})"
            left = temporaries(trial_dir)
            left_by_kill += len(left)
            reached = last_metrics_step(trial_dir + "/metrics.jsonl")
            checkpoint = trial_dir + "/out.ckpt.onnx"
            saved = None
            if os.path.exists(checkpoint):
                info = subprocess.run([exe, "info", checkpoint], capture_output=True, text=True)
                match = re.search(r"global_step (\d+)", info.stdout)
                if info.returncode != 0 or not match:
                    failures.append(f"{where}: the checkpoint does not load: {info.stdout[-300:]}{info.stderr}")
                    continue
                saved = int(match.group(1))
                if saved not in (reached, reached - 1):
                    failures.append(f"{where}: the checkpoint is at step {saved}, the run reached {reached}")
            if status == 0:
                outcomes["after the run ended"] += 1
            elif saved is None:
                outcomes["before the first checkpoint"] += 1
            elif saved < reached:
                outcomes["during a checkpoint's save"] += 1
            else:
                outcomes["between saves"] += 1
            # What a writer killed on a filesystem without O_TMPFILE leaves, and a live writer's
            # file. A write removes the stale ones of its own target: the resumed run writes the
            # output, and a checkpoint unless it resumes from the last one.
            for name in ("out.ckpt.onnx", "out.onnx") if saved != steps else ("out.onnx",):
                with open(f"{trial_dir}/{name}.tmp-{process.pid}-{trial}", "wb") as f:
                    f.write(b"partial")
            live = f"{trial_dir}/out.onnx.tmp-{os.getpid()}-1"
            with open(live, "wb") as f:
                f.write(b"a live writer's")
            resumed = subprocess.run(train_command(trial_dir, checkpoint if saved is not None else None),
                                     capture_output=True, text=True)
            if resumed.returncode != 0:
                failures.append(f"{where}: the resumed run exited {resumed.returncode}: {resumed.stderr[-500:]}")
                continue
            for name, want in expected.items():
                if open(f"{trial_dir}/{name}", "rb").read() != want:
                    failures.append(f"{where}: {name} after resuming from step {saved} differs from the reference run's")
            remaining = temporaries(trial_dir)
            if remaining != [os.path.basename(live)]:
                failures.append(f"{where}: temporary files after the resumed run: {remaining} (want only the live one)")
        shutil.rmtree(trial_dir, ignore_errors=True)
        print(f"{args.kills} kills: " + ", ".join(f"{n} {what}" for what, n in outcomes.items()))
        print(f"temporary files left by the killed runs: {left_by_kill}; after the resumed runs: "
              f"{'none but the live writer planted' if not any('temporary' in f for f in failures) else 'some'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for failure in failures:
        print("FAIL:", failure)
    print(f"{len(failures)} failure(s)" if failures else "all kills passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

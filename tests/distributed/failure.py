#!/usr/bin/env python3
"""Failure and resume under mpirun (issue 17, docs/distributed.md), on the Fashion-MNIST MLP
(examples/fashion_mnist/make_model.py, Adam) with synthetic data, 2 ranks:

- resume, same N: a run stopped by --max-steps after 9 steps (checkpoint every 3) and resumed
  from its checkpoint equals the uninterrupted run bit-identically (weights and optimizer
  state); resumed with 3 ranks instead, it completes and stays within per-tensor rtol 1e-5 of
  the uninterrupted run (the samples of a step do not depend on N; only the rounding of the
  split batch does);
- a rank that fails: a label out of range in rank 1's share of the first batch makes both
  ranks end within 60 s, exit status non-zero, the message names rank 1, no output written;
- a rank killed (SIGKILL) during a run with --checkpoint-every: every rank ends within 60 s
  and the last checkpoint loads and resumes to the end;
- a rank stopped (SIGSTOP, as a rank stuck in a kernel would be): rank 0 gives up after
  --collective-timeout 3 s, names itself and the timeout, and the run ends within 60 s;
- --checksum-every catches ranks whose models diverge: an MPMD run whose two ranks get
  models with different learning rates fails at the first check, naming rank 1 and a tensor.
Skipped (exit 77, ctest SKIP_RETURN_CODE) without mpirun.

Usage: failure.py --onnxtrain PATH
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np

import onnx

from equivalence import mpi_setup, variables  # this script's folder comes first on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 128


def run(cmd, env):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def rank_pid(marker, rank):
    """The pid of the process of `rank` started with ONNXTRAIN_TEST_RUN=marker, or None."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"ONNXTRAIN_TEST_RUN={marker}".encode() in env and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(pid)
    return None


def signal_and_wait(proc, pid, sig):
    """Sends `sig` to the rank process `pid` of the mpirun `proc` and waits up to 60 s for the
    run to end: (its output, seconds it took), or None (proc killed) when it did not end."""
    os.kill(pid, sig)
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None
    return out, time.monotonic() - start


class Checks:
    def __init__(self):
        self.failures = 0

    def check(self, ok, what, detail=""):
        print(f"{what}: {'ok' if ok else 'FAIL ' + detail}")
        self.failures += not ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnxtrain", required=True)
    args = parser.parse_args()
    setup = mpi_setup()
    if setup is None:
        return 77
    mpirun, env = setup
    mpi = [mpirun, "--oversubscribe"]
    checks = Checks()
    rng = np.random.default_rng(19)
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)
        samples = BATCH * 19 + 100
        images = rng.integers(0, 256, (samples, 784), dtype=np.uint8)
        labels = rng.integers(0, 10, samples, dtype=np.int64)
        np.savez(p("data.npz"), image=images, label=labels)
        run([sys.executable, os.path.join(HERE, "..", "..", "examples", "fashion_mnist", "make_model.py"), d], env)
        for name, lr in (("train.onnx", "1e-3"), ("train_lr2.onnx", "2e-3")):
            run([args.onnxtrain, "make-trainable", p("mlp.onnx"), "-o", p(name), "--loss", "cross_entropy",
                 "--optimizer", "adam", "--lr", lr], env)
        common = ["train", p("train.onnx"), "--data", p("data.npz"), "--map", "x=image", "--scale", "image=1/255",
                  "--batch-size", str(BATCH), "--seed", "5", "--threads", "1", "-q"]

        # --- resume with the same N, and with another N ---
        run(mpi + ["-np", "2", args.onnxtrain] + common + ["--epochs", "2", "-o", p("whole.onnx")], env)
        run(mpi + ["-np", "2", args.onnxtrain] + common +
            ["--epochs", "2", "--max-steps", "9", "--checkpoint-every", "3", "-o", p("part.onnx")], env)
        run(mpi + ["-np", "2", args.onnxtrain] + common + ["--epochs", "2", "--resume", p("part.ckpt.onnx"),
                                                           "-o", p("resumed.onnx")], env)
        whole, resumed = variables(p("whole.onnx")), variables(p("resumed.onnx"))
        same = whole.keys() == resumed.keys() and all(np.array_equal(whole[k], resumed[k]) for k in whole)
        checks.check(same, f"resume on 2 ranks after 9 of 40 steps: {len(whole)} tensors bit-identical")
        run(mpi + ["-np", "3", args.onnxtrain] + common + ["--epochs", "2", "--resume", p("part.ckpt.onnx"),
                                                           "-o", p("resumed3.onnx")], env)
        resumed3 = variables(p("resumed3.onnx"))
        worst = max(np.linalg.norm(resumed3[k] - whole[k]) / max(np.linalg.norm(whole[k]), 1e-30)
                    for k in whole if whole[k].dtype.kind == "f")
        checks.check(worst <= 1e-5, f"resume on 3 ranks of a 2-rank checkpoint: largest per-tensor |diff|/|w| {worst:.3g}")

        # --- a rank that fails: a bad label in rank 1's share (rows 64..127 of batch 1) ---
        bad = labels.copy()
        bad[100] = 10
        np.savez(p("bad.npz"), image=images, label=bad)
        start = time.monotonic()
        failed = subprocess.run(mpi + ["-np", "2", args.onnxtrain] + common[:3] + [p("bad.npz")] + common[4:] +
                                ["--no-shuffle", "-o", p("bad.onnx")], capture_output=True, text=True, env=env,
                                timeout=120)
        took = time.monotonic() - start
        text = failed.stdout + failed.stderr
        checks.check(failed.returncode != 0 and "error: rank 1 of 2" in text and "outside [0, 10)" in text and took < 60,
                     f"a failing rank ends both in {took:.1f} s, naming rank 1", text[-1500:])
        checks.check(not os.path.exists(p("bad.onnx")), "the failed run wrote no output")

        # --- a rank killed during training with checkpoints ---
        def start_run(marker, extra):
            run_env = dict(env, ONNXTRAIN_TEST_RUN=marker)
            return subprocess.Popen(mpi + ["-np", "2", "-x", "ONNXTRAIN_TEST_RUN", args.onnxtrain] + common + extra,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=run_env)

        def wait_for(condition, seconds):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if condition():
                    return True
                time.sleep(0.02)
            return False

        marker = uuid.uuid4().hex
        checkpoint = p("killed.ckpt.onnx")
        proc = start_run(marker, ["--epochs", "200", "--checkpoint-every", "5", "--checkpoint", checkpoint,
                                  "-o", p("killed.onnx")])
        found = wait_for(lambda: os.path.exists(checkpoint) and rank_pid(marker, 1), 60)
        pid = rank_pid(marker, 1)
        if found and pid:
            ended = signal_and_wait(proc, pid, signal.SIGKILL)
            if ended is None:
                checks.check(False, "killing rank 1 ends the run", "still running after 60 s")
            else:
                out, took = ended
                checks.check(proc.returncode != 0, f"killing rank 1 ends the run in {took:.1f} s (exit {proc.returncode})")
            try:
                onnx.checker.check_model(onnx.load(checkpoint))
                run(mpi + ["-np", "2", args.onnxtrain] + common + ["--epochs", "1", "--resume", checkpoint,
                                                                   "-o", p("after_kill.onnx")], env)
                checks.check(os.path.exists(p("after_kill.onnx")), "the last checkpoint loads and resumes")
            except Exception as e:  # noqa: BLE001 - any failure to load is the failure tested for
                checks.check(False, "the last checkpoint loads and resumes", str(e))
        else:
            proc.kill()
            checks.check(False, "killing rank 1", "the run wrote no checkpoint within 60 s")

        # --- a rank stopped: the others time out ---
        marker = uuid.uuid4().hex
        proc = start_run(marker, ["--epochs", "200", "--collective-timeout", "3", "-o", p("stopped.onnx")])
        found = wait_for(lambda: rank_pid(marker, 1), 60)
        time.sleep(0.5)  # into the training steps
        pid = rank_pid(marker, 1)
        if found and pid:
            try:
                ended = signal_and_wait(proc, pid, signal.SIGSTOP)
                if ended is None:
                    checks.check(False, "a stopped rank ends the run", "still running after 60 s")
                else:
                    out, took = ended
                    checks.check(proc.returncode != 0 and "error: rank 0 of 2" in out and "--collective-timeout 3" in out,
                                 f"a stopped rank: rank 0 times out and the run ends in {took:.1f} s", out[-1500:])
            finally:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        else:
            proc.kill()
            checks.check(False, "a stopped rank", "rank 1 not found")

        # --- diverged ranks: different learning rates on the two ranks (MPMD) ---
        options = common[2:] + ["--max-steps", "4", "--checksum-every", "2"]
        diverged = subprocess.run(mpi + ["-np", "1", args.onnxtrain, "train", p("train.onnx")] + options +
                                  ["-o", p("diverged.onnx"), ":", "-np", "1", args.onnxtrain, "train",
                                   p("train_lr2.onnx")] + options + ["-o", p("diverged.onnx")],
                                  capture_output=True, text=True, env=env, timeout=120)
        text = diverged.stdout + diverged.stderr
        checks.check(diverged.returncode != 0 and "error: rank 1 of 2" in text and "differs from rank 0's" in text
                     and "after step 2" in text, "--checksum-every names the diverged rank and tensor", text[-1500:])
    print("PASS" if checks.failures == 0 else f"FAIL: {checks.failures}")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())

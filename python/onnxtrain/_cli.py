"""The ``onnxtrain`` console script: the C++ command line, run in this process, plus the two
commands that need PyTorch (import-checkpoint, export-checkpoint), run in Python."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from onnxtrain import _core
from onnxtrain._files import write_bytes_atomic

CHECKPOINT_COMMANDS = ("import-checkpoint", "export-checkpoint")


def _checkpoint_main(argv: list[str]) -> int:
    """onnxtrain import-checkpoint / export-checkpoint (docs/python.md, Checkpoints)."""
    parser = argparse.ArgumentParser(prog=f"onnxtrain {argv[0]}")
    parser.add_argument("model", help="the .onnx training model (with its onnxtrain.training metadata)")
    if argv[0] == "import-checkpoint":
        parser.add_argument("-o", "--output", required=True, help="where to write the model with the checkpoint's state")
        parser.add_argument("--weights", help="state_dict: .safetensors, or .pt/.pth/.bin (torch.load weights_only)")
        parser.add_argument("--optimizer", help="an optimizer state_dict file (torch.save)")
        parser.add_argument("--scheduler", help="an lr_scheduler state_dict file (torch.save)")
        parser.add_argument("--hf-folder", help="a Hugging Face Trainer checkpoint folder")
        parser.add_argument("--step", type=int, help="optimizer steps done, when no file records it")
        parser.add_argument("--no-strict", action="store_true", help="skip weights that name no initializer")
    else:
        parser.add_argument("-o", "--output", required=True, help="the checkpoint folder to write")
        parser.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    from onnxtrain._checkpoint import import_checkpoint
    from onnxtrain._checkpoint_export import export_checkpoint
    try:
        if argv[0] == "export-checkpoint":
            files = export_checkpoint(args.model, args.output, overwrite=args.overwrite)
            print(f"wrote {args.output}: " + ", ".join(os.path.basename(p) for p in files.values()))
            return 0
        model = import_checkpoint(args.model, weights=args.weights, optimizer=args.optimizer,
                                  scheduler=args.scheduler, hf_folder=args.hf_folder, step=args.step,
                                  strict=not args.no_strict)
        # Atomically: a temporary file beside the output, renamed into place.
        write_bytes_atomic(args.output, model.SerializeToString())
        print(f"wrote {args.output}: imported step {_global_step(model)}")
        return 0
    except (_core.Error, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _global_step(model: object) -> int:
    from onnxtrain._checkpoint import training_metadata
    schema = training_metadata(model) or {}
    return int(schema.get("progress", {}).get("global_step", 0))


def main() -> int:
    """Runs ``onnxtrain`` with ``sys.argv`` and returns its exit status.

    As the native executable: Ctrl-C ends a command (a ``train`` checkpoints first), output
    goes to the process's stdout and stderr, the status is 0, 1 (internal error) or 2 (bad
    input or flags). import-checkpoint and export-checkpoint run here, in Python (PyTorch).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if len(sys.argv) > 1 and sys.argv[1] in CHECKPOINT_COMMANDS:
        return _checkpoint_main(sys.argv[1:])
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return _core.cli_main(sys.argv)


if __name__ == "__main__":
    sys.exit(main())

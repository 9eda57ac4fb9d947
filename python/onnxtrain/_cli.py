"""The ``onnxtrain`` console script: the C++ command line, run in this process."""

from __future__ import annotations

import signal
import sys

from onnxtrain import _core


def main() -> int:
    """Runs ``onnxtrain`` with ``sys.argv`` and returns its exit status.

    As the native executable: Ctrl-C ends a command (a ``train`` checkpoints first), output
    goes to the process's stdout and stderr, the status is 0, 1 (internal error) or 2 (bad
    input or flags).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return _core.cli_main(sys.argv)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m onnxtrain ...``: the same as the ``onnxtrain`` command."""

import sys

from onnxtrain._cli import main

sys.exit(main())

"""``python -m bisect_onnx``: the same as the ``bisect-onnx`` command."""

import sys

from bisect_onnx.cli import main

sys.exit(main())

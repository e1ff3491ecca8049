"""``python -m bisect_onnx``: the same as the ``bisect-onnx`` command."""

import sys

from bisect_onnx.cli.command import main

sys.exit(main())

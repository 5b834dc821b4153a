"""``python -m cluster.cli ARGS``: the ``fanout`` command without its console script (tests, subprocesses)."""
import sys

from cluster.cli import main

sys.exit(main())

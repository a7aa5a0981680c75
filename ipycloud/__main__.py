"""``python -m ipycloud``: the same as the ``ipycloud`` command."""

import sys

from ipycloud.cli import main

sys.exit(main())

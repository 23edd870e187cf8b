"""`python -m mvsink.cli`: the `mvsink` command."""

import sys

from mvsink.cli import main

sys.exit(main())

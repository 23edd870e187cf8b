"""`python -m services.write`: the write service process."""

import sys

from mvsink.service import not_yet_implemented

sys.exit(not_yet_implemented("write", 5))

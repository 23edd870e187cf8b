"""`python -m services.append`: the append service process."""

import sys

from mvsink.service import not_yet_implemented

sys.exit(not_yet_implemented("append", 4))

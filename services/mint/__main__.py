"""`python -m services.mint`: the mint service process."""

import sys

from mvsink.service import not_yet_implemented

sys.exit(not_yet_implemented("mint", 4))

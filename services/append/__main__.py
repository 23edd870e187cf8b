"""`python -m services.append`: the append service process."""

import sys

from mvsink.service import run_service
from services.append.shell import run

sys.exit(run_service("append", run))

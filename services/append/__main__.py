"""`python -m services.append`: the append service process."""

import sys

import services.append
from mvsink.io.service import run_service
from mvsink.stack.state import stack_endpoints
from services.append.shell import run

sys.exit(run_service("append", run, services.append.__doc__, endpoints=stack_endpoints))

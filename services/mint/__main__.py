"""`python -m services.mint`: the mint service process."""

import sys

import services.mint
from mvsink.io.service import run_service
from mvsink.stack.state import stack_endpoints
from services.mint.shell import run

sys.exit(run_service("mint", run, services.mint.__doc__, endpoints=stack_endpoints))

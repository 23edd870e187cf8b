"""`python -m services.write`: the write service process (a Spark driver)."""

import sys

import services.write
from mvsink.io.service import run_service
from mvsink.stack.state import stack_endpoints
from services.write.shell import run

sys.exit(run_service("write", run, services.write.__doc__, endpoints=stack_endpoints))

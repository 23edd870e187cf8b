"""`python -m services.ct`: one continual task's process (a Spark driver)."""

import sys

import services.ct
from mvsink.io.service import run_service
from mvsink.stack.state import stack_endpoints
from services.ct.shell import run

sys.exit(run_service("ct", run, services.ct.__doc__, endpoints=stack_endpoints))

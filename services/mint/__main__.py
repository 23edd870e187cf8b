"""`python -m services.mint`: the mint service process."""

import sys

import services.mint
from mvsink.io.service import run_service
from services.mint.shell import run

sys.exit(run_service("mint", run, services.mint.__doc__))

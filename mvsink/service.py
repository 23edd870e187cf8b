"""What every service process shares before its operator logic runs: configuration loading and
a clear, non-zero exit for a service whose operator has not landed yet.
"""

from __future__ import annotations

import sys

from mvsink.config import load_config
from mvsink.errors import MvsinkError


def not_yet_implemented(name: str, issue: int) -> int:
    """Validate the configuration, then exit 3 saying the operator lands with `issue`.

    Used by the service entry points until their operators are ported, so a deployment of
    today's image fails loudly and by name instead of idling.
    """
    try:
        config = load_config()
    except MvsinkError as error:
        print(f"{name}: configuration error: {error}", file=sys.stderr)
        return 2
    print(
        f"{name}: sink {config.sink_id} / shard {config.shard_id}: the {name} operator is not "
        f"implemented yet (issue #{issue}); exiting",
        file=sys.stderr,
    )
    return 3

"""`mvsink inspect <topic>`: print every record of one of mvsink's topics, decoded, one line
each (`partition offset key record`, `[schema id N]` after a record in the Schema Registry's wire
format); undecodable records are printed with their error, so the command never stops at bad
input. Both framings are read: a registry-framed record's schema is looked up in the configured
registry, or named by its `mvsink-schema` header where none is configured."""

from __future__ import annotations

import time

from mvsink.core.codec import registered_id
from mvsink.core.errors import DecodeError
from mvsink.io.kafka import decode_message, poll_message, tail_consumer
from mvsink.io.registry import OWN, Framing


def inspect_topic(
    bootstrap: str, topic: str, *, follow: bool = False, limit: int = 0, framing: Framing = OWN
) -> int:
    """Print the records of `topic` from the beginning (a registry-framed one's schema id looked
    up through `framing`); with `follow`, keep printing new ones until interrupted. Returns the
    number printed."""
    consumer = tail_consumer(bootstrap, topic)
    printed, idle_since = 0, time.monotonic()
    try:
        while not limit or printed < limit:
            message = poll_message(consumer, 0.5)
            if message is None:
                if not follow and time.monotonic() - idle_since > 2.0:
                    break
                continue
            idle_since = time.monotonic()
            key = (message.key() or b"").decode(errors="replace")
            try:
                shown = repr(decode_message(message, framing=framing))
            except DecodeError as error:
                shown = f"UNDECODABLE ({error.reason})"
            schema_id = registered_id(message.value() or b"")
            if schema_id is not None:
                shown += f" [schema id {schema_id}]"
            print(f"{message.partition()}\t{message.offset()}\t{key}\t{shown}", flush=True)
            printed += 1
    finally:
        consumer.close()
    return printed

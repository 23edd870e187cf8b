"""Which sinks a host serves: the decisions of a service process that serves every sink defined
on the sinks topic (`[service] sinks = all`, `mvsink.io.host`), pure.

```
 sinks topic ──absorb_definition──> defined ─┐
 ownership, caught up ──absorb_ready────────>├── maybe_act ──> Start(definition) | Stop(sink, why)
 a unit that ended on its own ──absorb_ended─┘        (the shell runs one unit per started sink)
```

Invariants:
1. A unit runs only while the host is `ready` (it owns the sinks topic's partition, when the
   service is exclusive, and has read that partition to the end it had when it got it): a host
   never acts on a definition an older record of the topic gave, replayed before the latest.
2. At most one unit per sink, serving its latest definition's settings: an altered definition
   (a shared setting changed) stops the unit, and the next `maybe_act` starts it with the new
   settings; a definition written again with the same settings (provisioning twice) changes
   nothing.
3. A dropped or deleted (tombstoned) sink's unit is stopped and not started again until the
   sink is defined anew.
4. A unit that ended on its own (a mint fenced by a newer one) is not started again for the
   same definition; a new definition, or the host getting the topic again, starts it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mvsink.core.messages import SinkDefinition

#: Why a unit stops (`Stop.why`).
DROPPED, DELETED, ALTERED, NOT_READY = "dropped", "deleted", "altered", "not ready"


@dataclass(frozen=True)
class Start:
    """Serve `definition`'s sink with a unit."""

    definition: SinkDefinition


@dataclass(frozen=True)
class Stop:
    """Stop the unit serving `sink`, for `why` (one of `DROPPED`, `DELETED`, `ALTERED`,
    `NOT_READY`)."""

    sink: str
    why: str


Command = Start | Stop


def settings(definition: SinkDefinition) -> SinkDefinition:
    """What a unit serves of `definition`: everything but who wrote it, when, and `dropped`."""
    return replace(definition, defined_by="", at_ms=0, dropped=False)


class HostState:
    """The sinks a host serves (module docs)."""

    def __init__(self) -> None:
        #: Each sink's latest definition read (dropped ones too).
        self.defined: dict[str, SinkDefinition] = {}
        #: The definition each running unit serves.
        self.serving: dict[str, SinkDefinition] = {}
        #: The definition of each unit that ended on its own (invariant 4).
        self.ended: dict[str, SinkDefinition] = {}
        self.ready = False

    def absorb_definition(self, sink: str, definition: SinkDefinition | None) -> None:
        """The latest record of `sink` on the topic: a definition, or None for a tombstone."""
        if definition is None:
            self.defined.pop(sink, None)
        else:
            self.defined[sink] = definition

    def absorb_ready(self, ready: bool) -> None:
        """Whether the host may serve now (invariant 1); getting ready again forgets which
        units ended on their own."""
        if ready and not self.ready:
            self.ended.clear()
        self.ready = ready

    def absorb_ended(self, sink: str) -> None:
        """`sink`'s unit ended without being stopped."""
        definition = self.serving.pop(sink, None)
        if definition is not None:
            self.ended[sink] = definition

    def absorb_stopped(self, sink: str) -> None:
        """`sink`'s unit, stopped by a `Stop`, has ended."""
        self.serving.pop(sink, None)

    def maybe_act(self) -> list[Command]:
        """The units to stop and start now. A stopped unit leaves `serving` once the shell
        says it ended (`absorb_stopped`): a sink is started again only after that."""
        if not self.ready:
            return [Stop(sink, NOT_READY) for sink in sorted(self.serving)]
        commands: list[Command] = []
        for sink, serving in sorted(self.serving.items()):
            latest = self.defined.get(sink)
            if latest is None:
                commands.append(Stop(sink, DELETED))
            elif latest.dropped:
                commands.append(Stop(sink, DROPPED))
            elif settings(latest) != settings(serving):
                commands.append(Stop(sink, ALTERED))
        for sink, latest in sorted(self.defined.items()):
            if latest.dropped or sink in self.serving:
                continue
            ended = self.ended.get(sink)
            if ended is not None and settings(ended) == settings(latest):
                continue
            self.ended.pop(sink, None)
            self.serving[sink] = latest
            commands.append(Start(latest))
        return commands

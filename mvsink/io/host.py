"""One service process serving many sinks: with `[service] sinks = all`, a mint, write or append
process follows the sinks topic and runs one unit (the service's body for one sink, on a thread
of its own) per defined sink, starting units for sinks created and stopping those of sinks
dropped while it runs. All decisions are `mvsink.core.hosting.HostState`'s.

```
 sinks topic ──(group `<sinks>.<service>` when exclusive)──> HostState ──Start──> unit thread:
                                                                  │          check topics, serve
                                                                  └──Stop───> unit.stopping.set
```

Each unit is exactly what a process started with that sink's `[sink] id` runs (`serve`), with
the settings of its definition (`mvsink.io.sinks.sink_of`), so every per-sink invariant holds
per unit as it does per process. What the units share is the process: its metrics endpoint
(every metric is labelled by sink), its health (`/readyz` names a sink that is not ready and
stays ready itself while Kafka and S3 answer) and its stop.

`exclusive` (mint): the replicas of the service share one consumer group on the sinks topic's
single partition, and only the replica that owns it runs units; when it dies, the group gives
the partition to a survivor within the group session, whose units take over (a mint fences
its predecessor's transactions, `services.mint`). Nothing safe rests on the session's time: a
serving replica paused past it loses the partition while its units still run, and the
survivor's units fence their transactions, so once resumed they commit nothing (each ends,
fenced) and the host stops the rest at its next poll (`test_many_sinks` pauses one). Not
exclusive (write, append): every replica
runs every sink's unit, and each sink's own consumer group spreads its partitions or append
workers over them.

A unit never takes the host down: an outage is ridden through with a backoff; a configuration
or contract error (its topics disagree with its definition) or an unexpected one is logged and
reported as that sink's (not ready, with why), and the unit tries again after the backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from mvsink.core.errors import ConfigError, DecodeError
from mvsink.core.hosting import DROPPED, HostState, Start, Stop
from mvsink.core.messages import SinkDefinition
from mvsink.io.config import Config
from mvsink.io.health import Backoff, transient
from mvsink.io.kafka import (
    Reader,
    check_sink_topics,
    consumer_config,
    decode_message,
    ensure_topics,
    ownership,
    poll_message,
    sinks_topic,
    watermarks,
)
from mvsink.io.service import UNIT_THREAD, Stopping
from mvsink.io.sinks import DROPPED as SINK_DROPPED
from mvsink.io.sinks import check_sink, sink_of, stop_when_dropped

log = logging.getLogger("mvsink.io.host")

#: A service's body for one sink.
Serve = Callable[[Config, Stopping], int]


def serve_sinks(
    config: Config, stopping: Stopping, name: str, serve: Serve, exclusive: bool
) -> int:
    """A service's body: its `[sink] id` sink (`[service] sinks = one`: checked against its
    definition, stopped when dropped), or every defined sink (`all`, a `SinkHost`)."""
    if config.serve_sinks == "one":
        check_sink(config)
        stop_when_dropped(config, stopping)
        return serve(config, stopping)
    return SinkHost(config, stopping, name, serve, exclusive).run()


@dataclass
class Unit:
    """One sink served: its thread and its run."""

    definition: SinkDefinition
    stopping: Stopping
    thread: threading.Thread = field(init=False)
    #: Set by `Stop`: the unit's end is expected.
    stopped: bool = False


class SinkHost:
    """The sinks topic around a `HostState`, and one thread per unit (module docs)."""

    def __init__(
        self, config: Config, stopping: Stopping, name: str, serve: Serve, exclusive: bool
    ) -> None:
        if not config.topics.sinks:
            raise ConfigError("[service] sinks = all needs a sinks topic ([kafka] sinks_topic)")
        self.config, self.stopping, self.name = config, stopping, name
        self.serve, self.exclusive = serve, exclusive
        self.state = HostState()
        self.units: dict[str, Unit] = {}
        self.framing = config.framing()
        #: The end of the sinks topic when it was (re)assigned: ready once read to it.
        self.catch_up_to: int | None = None
        self.position = 0

    # -- the sinks topic ----------------------------------------------------------------------

    def _consumer(self) -> Consumer | Reader:
        topic = self.config.topics.sinks
        if not self.exclusive:
            self._assigned()
            return Reader(self.config.kafka_bootstrap, topic, {0: OFFSET_BEGINNING})
        consumer = Consumer(
            consumer_config(
                self.config.kafka_bootstrap,
                group_id=f"{topic}.{self.name}",
                extra=ownership(self.config.max_poll_interval),
            )
        )

        def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            for tp in partitions:
                tp.offset = OFFSET_BEGINNING
            consumer.assign(partitions)
            if partitions:
                self._assigned()
                log.info("%s: serving the sinks defined on %s", self.name, topic)

        def on_revoke(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            if not partitions:
                return
            log.info("%s: no longer serving the sinks defined on %s", self.name, topic)
            self.catch_up_to = None
            self.state.absorb_ready(False)
            self._act(wait=True)

        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
        return consumer

    def _assigned(self) -> None:
        """The topic is (again) this host's: read it to its current end before acting."""
        self.state = _fresh(self.state)
        self.position = 0
        (_, high) = watermarks(self.config.kafka_bootstrap, self.config.topics.sinks, [0])[0]
        self.catch_up_to = high

    def _absorb(self, message: Message) -> None:
        self.position = int(message.offset() or 0) + 1
        key = (message.key() or b"").decode("utf-8", "replace")
        if message.value() is None:
            self.state.absorb_definition(key, None)
            return
        try:
            record = decode_message(message, SinkDefinition, framing=self.framing)
        except DecodeError as error:
            log.error(
                "%s: sinks topic offset %d is no definition: %s",
                self.name,
                self.position - 1,
                error,
            )
            return
        if not isinstance(record, SinkDefinition) or record.sink_id != key:
            log.error(
                "%s: sinks topic offset %d under key %r is no definition of that sink: ignored",
                self.name,
                self.position - 1,
                key,
            )
            return
        self.state.absorb_definition(key, record)

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        ensure_topics(self.config.kafka_bootstrap, [sinks_topic(self.config.topics)])
        consumer = self._consumer()
        try:
            while not self.stopping.stopped:
                message = poll_message(consumer, 0.2)
                while message is not None:
                    self._absorb(message)
                    message = poll_message(consumer, 0.0)
                if self.catch_up_to is not None and self.position >= self.catch_up_to:
                    self.state.absorb_ready(True)
                self._reap()
                self._act()
        finally:
            self.state.absorb_ready(False)
            self._act(wait=True)
            consumer.close()
        return 0

    def _act(self, wait: bool = False) -> None:
        for command in self.state.maybe_act():
            match command:
                case Start(definition=definition):
                    self._start(definition)
                case Stop(sink=sink, why=why):
                    self._stop(sink, why)
        if wait:
            for sink, unit in list(self.units.items()):
                unit.thread.join(60)
                self._reap_one(sink, unit)

    def _reap(self) -> None:
        for sink, unit in list(self.units.items()):
            if not unit.thread.is_alive():
                self._reap_one(sink, unit)

    def _reap_one(self, sink: str, unit: Unit) -> None:
        if unit.thread.is_alive():
            return
        del self.units[sink]
        self.stopping.release(unit.stopping)
        if unit.stopped:
            self.state.absorb_stopped(sink)
        else:
            log.warning(
                "%s: the unit of sink %s ended: started again when the sink is defined anew",
                self.name,
                sink,
            )
            self.state.absorb_ended(sink)

    def _start(self, definition: SinkDefinition) -> None:
        sink = definition.sink_id
        unit = Unit(definition, self.stopping.unit(sink))
        unit.thread = threading.Thread(
            target=self._serve, args=(unit,), name=f"{UNIT_THREAD}{sink}", daemon=True
        )
        self.units[sink] = unit
        log.info("%s: serving sink %s (%s)", self.name, sink, _described(definition))
        unit.thread.start()

    def _stop(self, sink: str, why: str) -> None:
        unit = self.units.get(sink)
        if unit is None or unit.stopped:
            return
        unit.stopped = True
        log.info("%s: stopping the unit of sink %s: %s", self.name, sink, why)
        unit.stopping.set(SINK_DROPPED if why == DROPPED else why)

    def _serve(self, unit: Unit) -> None:
        """A unit's thread: `serve` its sink until stopped, through outages and errors."""
        config = sink_of(self.config, unit.definition)
        stopping, sink, backoff = unit.stopping, unit.definition.sink_id, Backoff()
        while not stopping.stopped:
            started = time.monotonic()
            try:
                check_sink_topics(config)
                stopping.blocked(None)
                self.serve(config, stopping)
                return
            except Exception as error:
                if stopping.stopped:
                    return
                if transient(error):
                    if stopping.health is not None:
                        stopping.health.failed(error)
                else:
                    log.error("%s: sink %s: %s", self.name, sink, error, exc_info=True)
                    stopping.blocked(f"{type(error).__name__}: {error}")
                if time.monotonic() - started > 60:
                    backoff.reset()
                if stopping.wait(backoff.next()):
                    return


def _fresh(state: HostState) -> HostState:
    """`state` with what it read of the topic forgotten (its units are kept: they stop or
    carry on by what the topic says once read again)."""
    fresh = HostState()
    fresh.serving = dict(state.serving)
    return fresh


def _described(definition: SinkDefinition) -> str:
    return (
        f"shard {definition.shard_id}, P {definition.partitions}, A {definition.append_workers}, "
        f"as_of {definition.as_of}"
    )

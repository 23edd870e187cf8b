"""`mvsink demo`: the whole pipeline on the running stack.

1. provision a fresh demo sink (`demo-<run>`: topics, bucket, shard with the view's schema);
2. start `mint`, `write` (Spark) and `append` as processes;
3. run the view job: random order events per tick into `<sink>.orders`; a PySpark job reads
   each tick's events back and maintains per-customer order count and total, publishing the
   changes (retraction of the old row, insertion of the new) from its executors
   (`mvsink.upstream.publish.publish_dataframe`);
4. show progress while the shard converges, then the shard's contents at its upper next to
   the view computed directly by Spark over every event (they must match);
5. append junk to the shard as a foreign writer and show the sink correcting it.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from mvsink import Say
from mvsink.core.errors import MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import Config, Topics, config_env, state_dir
from mvsink.io.kafka import TopicSpec, client_config, consumer_config, ensure_topics, poll_message
from mvsink.io.service import module_process
from mvsink.shard import Appended, Shard, open_shard
from mvsink.tools.provision import provision
from mvsink.upstream.producer import DesiredProducer
from mvsink.upstream.publish import publish_dataframe

ROW_SCHEMA = "customer string not null, orders long, total double"
KEYS = ["customer"]
#: The cores each of the demo's Spark applications (its view job, the write driver) takes of a
#: cluster unless `[spark] cores_max` says otherwise: one each, so both get executors on the
#: smallest cluster of docs/operations.md §2, "On a Spark cluster" (`mvsink stack up
#: --spark-workers 2`, a core per worker).
DEMO_CORES = 1


class ViewJob:
    """Per-customer order count and total over the order events, maintained tick by tick in
    Spark and published as desired updates.

    Restartable from what Kafka holds, so a failed tick is simply retried by a new `ViewJob`
    (`run_view`): the desired producer's committed frontier `F` says which ticks were published;
    the view state is rebuilt from the events of the ticks before `F`, and every later event
    already in `<sink>.orders` (a failed attempt's) becomes input of the next tick. A tick's
    input is whatever the topic holds beyond what was folded, read to its end."""

    def __init__(self, config: Config, spark: Any, say: Say, customers: int = 40) -> None:
        self.config, self.spark, self.say = config, spark, say
        self.orders_topic = f"{config.sink_id}.orders"
        ensure_topics(config.kafka_bootstrap, [TopicSpec(self.orders_topic, 1)])
        self.events = Producer(
            client_config(config.kafka_bootstrap, **{"enable.idempotence": True})
        )
        self.desired = DesiredProducer(
            config, parse_row_schema(ROW_SCHEMA), f"view.{config.sink_id}"
        )
        self.frontier = self.desired.start().time or 0
        self.customers = [f"customer-{i:03d}" for i in range(customers)]
        self.rng = random.Random(7 + self.frontier)
        #: customer -> (orders, total in cents), over the events of ticks before `frontier`
        self.state: dict[str, tuple[int, int]] = {}
        self.reader = Consumer(consumer_config(config.kafka_bootstrap))
        self.reader.assign([TopicPartition(self.orders_topic, 0, OFFSET_BEGINNING)])
        #: Events already in the topic that no published tick folded yet.
        self.carried: list[tuple[str, int]] = []
        for tick, customer, amount in self._read_to_end(self.reader):
            if tick < self.frontier:
                self.state[customer] = _plus(self.state.get(customer), 1, amount)
            else:
                self.carried.append((customer, amount))

    def close(self) -> None:
        self.reader.close()

    def emit_orders(self, tick: int, count: int) -> None:
        """The input: `count` random order events of this tick.

        Raises:
            TimeoutError: not every event was acknowledged (Kafka unavailable).
        """
        for _ in range(count):
            customer = self.rng.choice(self.customers)
            amount = self.rng.randint(100, 10000)  # cents: sums are exact
            self.events.produce(
                self.orders_topic, f"{tick},{customer},{amount}".encode(), key=customer.encode()
            )
        timeout = self.config.kafka_call_timeout
        left = self.events.flush(timeout)
        if left:
            raise TimeoutError(f"tick {tick}: {left} order events not acknowledged in {timeout}s")

    def _read_to_end(self, consumer: Consumer) -> list[tuple[int, str, int]]:
        """`(tick, customer, amount)` of every event from the consumer's position to the end of
        the topic as it is now, within the config's `kafka_call_timeout`.

        Raises:
            TimeoutError: the end was not reached in time (Kafka unavailable).
        """
        timeout = self.config.kafka_call_timeout
        partition = TopicPartition(self.orders_topic, 0)
        _, high = consumer.get_watermark_offsets(partition, timeout=timeout)
        deadline, events = time.monotonic() + timeout, []
        [assigned] = consumer.position([partition])
        position = assigned.offset if assigned.offset >= 0 else 0
        while position < high:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.orders_topic}: read to {position} of {high} in {timeout}s"
                )
            message = poll_message(consumer, 0.2)
            if message is not None:
                tick, customer, amount = (message.value() or b"").decode().split(",")
                events.append((int(tick), customer, int(amount)))
                position = int(message.offset() or 0) + 1
        return events

    def tick(self, orders: int) -> int:
        """One tick: events in, view maintained in Spark, changes published from the executors
        (`mvsink.upstream.publish`); the new frontier. The view's state changes only once the tick is
        published.

        A tick a failed attempt left carried events for publishes exactly those events and no
        new ones: that attempt may have committed some desired partitions already, which the
        retry skips, so the retry must derive the same changes (a deterministic replay, as
        Structured Streaming asks of a retried micro-batch)."""
        tick = self.frontier
        if not self.carried:
            self.emit_orders(tick, orders)
        rows = self.carried + [(c, a) for _, c, a in self._read_to_end(self.reader)]
        from pyspark.sql import functions as F

        events = self.spark.createDataFrame(_events_table(rows))
        deltas = events.groupBy("customer").agg(F.count("*").alias("n"), F.sum("amount").alias("s"))
        old = self.spark.createDataFrame(
            pa.table(
                {
                    "customer": pa.array(list(self.state), pa.string()),
                    "old_n": pa.array([n for n, _ in self.state.values()], pa.int64()),
                    "old_s": pa.array([cents for _, cents in self.state.values()], pa.int64()),
                }
            )
        )
        joined = deltas.join(old, "customer", "left").select(
            "customer",
            "old_n",
            "old_s",
            (F.coalesce("old_n", F.lit(0)) + F.col("n")).alias("new_n"),
            (F.coalesce("old_s", F.lit(0)) + F.col("s")).alias("new_s"),
        )
        retractions = joined.where(F.col("old_n").isNotNull()).select(
            "customer",
            F.col("old_n").alias("orders"),
            (F.col("old_s") / 100).alias("total"),
            F.lit(tick).cast("long").alias("_time"),
            F.lit(-1).cast("long").alias("_diff"),
        )
        insertions = joined.select(
            "customer",
            F.col("new_n").alias("orders"),
            (F.col("new_s") / 100).alias("total"),
            F.lit(tick).cast("long").alias("_time"),
            F.lit(1).cast("long").alias("_diff"),
        )
        publish_dataframe(retractions.unionByName(insertions), self.desired, Frontier.at(tick + 1))
        state = dict(self.state)
        changed = joined.select("customer", "new_n", "new_s").collect()
        for row in changed:
            state[row["customer"]] = (row["new_n"], row["new_s"])
        self.state, self.carried, self.frontier = state, [], tick + 1
        return len(changed)

    def direct_view(self) -> dict[str, tuple[int, float]]:
        """The view computed from scratch by Spark over every event in the input topic."""
        consumer = Consumer(consumer_config(self.config.kafka_bootstrap))
        consumer.assign([TopicPartition(self.orders_topic, 0, OFFSET_BEGINNING)])
        try:
            rows = [(customer, amount) for _, customer, amount in self._read_to_end(consumer)]
        finally:
            consumer.close()
        from pyspark.sql import functions as F

        frame = self.spark.createDataFrame(_events_table(rows))
        agg = frame.groupBy("customer").agg(
            F.count("*").alias("orders"), F.sum("amount").alias("total")
        )
        return {r["customer"]: (r["orders"], r["total"] / 100) for r in agg.collect()}


def _events_table(rows: list[tuple[str, int]]) -> pa.Table:
    """Order events `(customer, amount)` as an Arrow table, which Spark takes as a local relation
    in the JVM (a Python list would be an RDD that Python tasks convert each time it is read)."""
    return pa.table(
        {
            "customer": pa.array([c for c, _ in rows], pa.string()),
            "amount": pa.array([a for _, a in rows], pa.int64()),
        }
    )


def _plus(old: tuple[int, int] | None, orders: int, cents: int) -> tuple[int, int]:
    return ((old or (0, 0))[0] + orders, (old or (0, 0))[1] + cents)


def shard_view(shard: Shard, as_of: int) -> dict[str, tuple[int, float]]:
    """The shard's contents at `as_of`, as customer -> (orders, total); a row whose diff is
    not 1 (a duplicate, or junk) is reported as such."""
    table = shard.snapshot(as_of)
    view: dict[str, tuple[int, float]] = {}
    for row in table.to_pylist():
        key = row["customer"] if row["_diff"] == 1 else f"{row['customer']} (diff {row['_diff']})"
        while key in view:  # a second row for one customer: junk or a duplicate
            key += " (again)"
        view[key] = (row["orders"], row["total"])
    return view


def service_env(config: Config) -> dict[str, str]:
    """The environment of a service process for the sink of `config`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MVSINK_S3_")}
    env.update(config_env(config))
    env.pop("MVSINK_WRITER_ID", None)  # each process names itself
    env.pop("MVSINK_METRICS_PORT", None)  # and picks a free port
    return env


SERVICES = ("mint", "write", "append")


def start_service(config: Config, name: str, logs: Path, **env: str) -> subprocess.Popen[bytes]:
    """Start `python -m services.<name>` for the sink of `config`, appending its output to
    `logs/<name>.log`; `env` adds to `service_env` (e.g. a fixed `MVSINK_METRICS_PORT`)."""
    logs.mkdir(parents=True, exist_ok=True)
    command, environment = module_process(f"services.{name}", {**service_env(config), **env})
    with (logs / f"{name}.log").open("ab") as out:
        return subprocess.Popen(command, env=environment, stdout=out, stderr=subprocess.STDOUT)


def start_services(config: Config, logs: Path) -> list[subprocess.Popen[bytes]]:
    """Start mint, write and append for the sink of `config`, logging into `logs`."""
    return [start_service(config, name, logs) for name in SERVICES]


def stop_services(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 60.0) -> None:
    """SIGTERM to every process still running, then wait; kill what outlives `timeout`."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _compare(
    say: Say, shard: dict[str, tuple[int, float]], view: dict[str, tuple[int, float]], show: int = 8
) -> int:
    """Print the two side by side; the number of customers that differ."""
    keys = sorted(set(shard) | set(view))
    differ = [k for k in keys if shard.get(k) != view.get(k)]
    say(f"  {'customer':<28} {'shard (orders, total)':>24}   {'view by Spark':>22}")
    for key in (differ + [k for k in keys if k not in differ])[:show]:
        mark = "" if shard.get(key) == view.get(key) else "   <-- differs"
        say(f"  {key:<28} {shard.get(key)!s:>24}   {view.get(key)!s:>22}{mark}")
    say(f"  ... {len(keys) - len(differ)}/{len(keys)} customers match")
    return len(differ)


def wait_upper(shard: Shard, frontier: int, say: Say, timeout: float = 240) -> None:
    deadline, last = time.monotonic() + timeout, None
    while (upper := shard.upper()) != Frontier.at(frontier):
        if upper != last:
            say(f"  shard upper {upper}, waiting for {{{frontier}}} ...")
            last = upper
        if time.monotonic() > deadline:
            raise MvsinkError(
                f"the shard did not reach {{{frontier}}} in {timeout}s (upper {upper})"
            )
        time.sleep(0.5)


def run_demo(config: Config, say: Say, ticks: int = 8, orders: int = 200) -> None:
    """See the module docs. Raises `MvsinkError` if the shard does not end up equal to the view."""
    from mvsink.io.spark import spark_session

    run = f"demo-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}"
    config = replace(
        config,
        sink_id=run,
        shard_id=run,
        row_schema=ROW_SCHEMA,
        topics=Topics.for_sink(run, config.topics.frontiers),
    )
    if not config.spark_master.startswith("local") and not config.spark_cores_max:
        # Two applications of the demo share the cluster: neither may take every core.
        config = replace(config, spark_cores_max=DEMO_CORES)
    say(
        f"sink {run}: P={config.partitions} desired partitions, A={config.append_workers} append workers"
    )
    provision(config)
    shard = open_shard(config.shard_id, None, config.s3)
    logs = state_dir() / "demo" / run
    procs = start_services(config, logs)
    say(f"started mint, write (Spark), append; logs in {logs}")
    spark = spark_session(f"mvsink-view-{run}", config=config)
    view: ViewJob | None = None
    try:
        view = ViewJob(config, spark, say)
        for _ in range(ticks):
            changed = view.tick(orders)
            say(
                f"tick {view.frontier - 1}: {orders} orders, {changed} customers changed; "
                f"desired at {{{view.frontier}}}, shard upper {shard.upper()}"
            )
        wait_upper(shard, view.frontier, say)
        say(f"shard at its upper {{{view.frontier}}} next to the view computed directly by Spark:")
        if _compare(say, shard_view(shard, view.frontier), view.direct_view()):
            raise MvsinkError("the shard does not equal the view")
        upper = view.frontier
        junk = pa.table(
            {
                "customer": ["customer-000", "mallory"],
                "orders": [999, 1],
                "total": [0.0, 1e6],
                "_time": [upper, upper],
                "_diff": [1, 1],
            }
        )
        part = shard.stage(junk, Frontier.at(upper), Frontier.at(upper + 1), "foreign-writer")
        result = shard.compare_and_append([part], Frontier.at(upper), Frontier.at(upper + 1))
        if not isinstance(result, Appended):
            raise MvsinkError(f"the foreign append lost a race: {result}")
        say(f"a foreign writer appended junk at {{{upper}}}: the shard now differs from the view:")
        _compare(say, shard_view(shard, upper + 1), view.direct_view(), show=4)
        view.frontier = upper + 1
        view.tick(orders)
        wait_upper(shard, view.frontier, say)
        say(f"after one more tick the sink has corrected the shard (upper {{{view.frontier}}}):")
        if _compare(say, shard_view(shard, view.frontier), view.direct_view(), show=4):
            raise MvsinkError("the sink did not correct the foreign write")
        say(
            f"demo OK: shard == view; shard state seqno {shard.state().seqno}, "
            f"{len(shard.state().parts())} parts"
        )
    finally:
        if view is not None:
            view.close()
        spark.stop()
        stop_services(procs, timeout=30)


def run_view(
    config: Config, say: Say, ticks: int, orders: int, interval: float, stopped: Callable[[], bool]
) -> int:
    """The view job alone, for the configured sink (services run elsewhere, e.g. compose):
    `ticks` ticks (0 = until stopped), one every `interval` seconds; the ticks run.

    An unavailable Kafka is ridden through as the services do (`mvsink.io.health`): the tick is
    retried by a new `ViewJob` after a capped, jittered backoff, with one line when the outage
    starts and one when it ends; any other error stops the job."""
    from mvsink.io.health import Backoff, transient
    from mvsink.io.spark import spark_session

    if config.row_schema and config.row_schema != ROW_SCHEMA:
        raise MvsinkError(f"the demo view publishes rows ({ROW_SCHEMA}), not ({config.row_schema})")
    spark = spark_session(f"mvsink-view-{config.sink_id}", config=config)
    done, view, backoff, outage = 0, None, Backoff(), None
    try:
        while (ticks == 0 or done < ticks) and not stopped():
            started = time.monotonic()
            try:
                view = view or ViewJob(config, spark, say)
                changed = view.tick(orders)
            except Exception as error:
                if not transient(error):
                    raise
                if outage is None:
                    outage = time.monotonic()
                    say(f"Kafka unavailable, retrying with backoff until it is back: {error!r}")
                if view is not None:
                    view.close()
                view = None  # the next one starts from what Kafka holds
                wake = time.monotonic() + backoff.next()
                while time.monotonic() < wake and not stopped():
                    time.sleep(0.2)
                continue
            if outage is not None:
                say(
                    f"Kafka is back after {time.monotonic() - outage:.1f}s: desired at "
                    f"{{{view.frontier}}}"
                )
                outage = None
                backoff.reset()
            done += 1
            say(
                f"tick {view.frontier - 1}: {orders} orders, {changed} customers changed; "
                f"desired at {{{view.frontier}}}"
            )
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    finally:
        if view is not None:
            view.close()
        spark.stop()
    return done

"""The continual task service against real MinIO and Spark: the three example tasks
(`examples/ct/`: UPSERT, audit, retention) over random append-only inputs, differentially
checked at every upper against an in-memory evaluation applied time by time; replicas racing
in one process; the service process killed with `kill -9` and restarted; rehydration that does
not read the input's history."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
import tomllib
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sinkkit import Service, clean_env

from mvsink.core.frontier import Frontier
from mvsink.core.rows import parse_row_schema
from mvsink.core.settings import Timing
from mvsink.core.updates import part_schema
from mvsink.io.config import S3Settings
from mvsink.io.ct_definition import Definition, definition_from_toml, load_definition
from mvsink.shard import Appended, Shard, open_shard
from mvsink.tools.ct_demo import (
    EVALUATIONS,
    ORDERS,
    History,
    Order,
    Row,
    append_orders,
    contents,
    evaluate,
    example_task,
    mismatches,
)
from services.ct.shell import ContinualTask

pytestmark = pytest.mark.integration
F = Frontier.at
#: The demo view's rows (an MV sink's shard).
VIEW = "customer string not null, orders long, total double"


# -- the inputs ----------------------------------------------------------------------------------


def _random_history(rng: random.Random, ticks: int) -> History:
    """Batches `(upper, {time: orders})`: some times without orders, some batches of several
    times, several orders of one customer at one time."""
    batches, now, next_id = [], 0, 1
    while now < ticks:
        upper = min(ticks, now + rng.choice([1, 1, 1, 2, 3]))
        by_time: dict[int, list[Order]] = {}
        for t in range(now, upper):
            for _ in range(rng.choice([0, 0, 1, 2, 4])):
                by_time.setdefault(t, []).append(
                    (next_id, f"c{rng.randrange(4)}", rng.randrange(100, 10000))
                )
                next_id += 1
        batches.append((upper, by_time))
        now = upper
    return batches


def _check(output: Shard, expected: dict[int, Counter[Row]]) -> None:
    assert mismatches(output, expected) == []  # at every time
    # each time whose contents changed was written once, by the one batch ending at t + 1 (it
    # also carries the upper over the times before it where no input changed)
    changed = [t for t in expected if expected[t] != expected.get(t - 1, Counter())]
    written = [b.upper for b in output.state().batches if b.parts]
    assert written == [F(t + 1) for t in changed]


# -- fixtures ------------------------------------------------------------------------------------


def _definition(example: str, orders: Shard, unique: str) -> Definition:
    loaded = definition_from_toml(tomllib.loads(example_task(example, orders.shard_id, unique)))
    return dataclasses.replace(loaded, name=f"{loaded.name}-{unique}")


@pytest.fixture
def orders(s3_settings: S3Settings, unique: str) -> Shard:
    return open_shard(f"orders-{unique}", ORDERS, s3_settings)


def _run_until(
    tasks: list[ContinualTask],
    upper: Frontier,
    rng: random.Random | None = None,
    timeout: float = 120,
) -> None:
    deadline = time.monotonic() + timeout
    while any(t.sink.output_progress != upper for t in tasks):
        for task in rng.sample(tasks, len(tasks)) if rng else tasks:
            task.step()
        assert time.monotonic() < deadline, [t.sink.output_progress for t in tasks]


# -- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", sorted(EVALUATIONS))
def test_the_example_task_equals_its_evaluation_time_by_time(
    example: str, orders: Shard, spark: Any, s3_settings: S3Settings, unique: str
) -> None:
    """Invariants 1 and 3 (`services.ct`): each time an order came at is written once, with the
    logic's diffs at it; the output equals the evaluation."""
    rng = random.Random(f"{example}-{unique}")
    history = _random_history(rng, 14)
    definition = _definition(example, orders, unique)
    task = ContinualTask(definition, s3_settings, Timing(), spark, "r1")
    task.start()
    for upper, by_time in history:  # the task follows the input as it grows
        append_orders(orders, upper, by_time)
        if rng.random() < 0.6:
            _run_until([task], F(upper))
    _run_until([task], F(history[-1][0]))
    _check(task.output, evaluate(example, history))
    written = {t for _, by_time in history for t, o in by_time.items() if o}
    assert task.times_written == len(written) - (example == "big_orders") * sum(
        1 for _, b in history for t, o in b.items() if o and all(a <= 9000 for *_, a in o)
    )


def test_racing_replicas_write_each_time_once(
    orders: Shard, spark: Any, s3_settings: S3Settings, unique: str
) -> None:
    """Invariant 4: racing replicas write each time once; the loser drops its result."""
    rng = random.Random(unique)
    history = _random_history(rng, 12)
    definition = _definition("recent_orders", orders, unique)
    replicas = [ContinualTask(definition, s3_settings, Timing(), spark, f"r{i}") for i in (1, 2)]
    for replica in replicas:
        replica.start()
    for upper, by_time in history:
        append_orders(orders, upper, by_time)
        for _ in range(rng.randrange(3)):
            for replica in rng.sample(replicas, 2):
                replica.step()
    _run_until(replicas, F(history[-1][0]), rng)
    _check(replicas[0].output, evaluate("recent_orders", history))
    assert sum(r.times_dropped for r in replicas) > 0  # they did race
    # every written time was written by one replica; the other dropped its result
    assert sum(r.times_written for r in replicas) == sum(
        1 for _, b in history for o in b.values() if o
    )


def test_the_service_killed_at_random_points_writes_each_time_once(
    orders: Shard, s3_settings: S3Settings, kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    """Invariant 5: `python -m services.ct` is killed with `kill -9` while the input grows, and
    started again: it resumes from the output's upper, and the output equals the evaluation."""
    rng = random.Random(unique)
    history = _random_history(rng, 16)
    task = _Task(orders, s3_settings, kafka_bootstrap, unique, tmp_path)
    log, output, proc, kills = task.process.log, task.output, task.process.start(), 0
    try:
        for number, (upper, by_time) in enumerate(history):
            append_orders(orders, upper, by_time)
            time.sleep(rng.uniform(0.1, 0.8))
            if number in (len(history) // 3, 2 * len(history) // 3):  # mid-stream
                _wait_for(lambda k=kills: log.read_text().count("starts at output upper") > k, 120)
                time.sleep(rng.uniform(0, 1.5))  # while it follows, runs the logic or writes
                proc.kill()
                kills += 1
                proc.start()
        output.wait_for_upper_past(F(history[-1][0] - 1), 180)
        assert proc.proc is not None and proc.proc.poll() is None, log.read_text()[-3000:]
    finally:
        assert proc.stop() == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert kills == 2 and text.count("starts at output upper") == 3, text[-3000:]
    _check(output, evaluate("latest_order", history))


class _Task:
    """Example task latest_order over `orders`, run by `python -m services.ct` (`process`)."""

    def __init__(
        self,
        orders: Shard,
        s3: S3Settings,
        kafka_bootstrap: str,
        unique: str,
        home: Path,
        **extra: str,
    ) -> None:
        task_file = home / "task.toml"
        task_file.write_text(example_task("latest_order", orders.shard_id, unique))
        env = clean_env(
            home / "state",
            MVSINK_KAFKA_BOOTSTRAP=kafka_bootstrap,
            MVSINK_S3_ENDPOINT=s3.endpoint,
            MVSINK_S3_BUCKET=s3.bucket,
            MVSINK_S3_ACCESS_KEY=s3.access_key.reveal(),
            MVSINK_S3_SECRET_KEY=s3.secret_key.reveal(),
            MVSINK_CT_TASK=str(task_file),
            MVSINK_SPARK_MASTER="local[1]",
            **extra,
        )
        self.process = Service("ct", env, home / "ct.log")
        self.definition = load_definition(task_file)
        self.output = open_shard(self.definition.output_shard, self.definition.output_schema, s3)


def test_a_read_only_replica_follows_and_writes_once_promoted(
    orders: Shard, spark: Any, s3_settings: S3Settings, unique: str
) -> None:
    rng = random.Random(unique)
    history = _random_history(rng, 12)
    half = len(history) // 2
    if not any(by_time for _, by_time in history[half:]):
        # The promoted standby must have something to write: a history whose second half has
        # no orders would fail the last assertion.
        last_id = max(
            (order[0] for _, by_time in history for day in by_time.values() for order in day),
            default=0,
        )
        upper, by_time = history[-1]
        by_time[upper - 1] = [(last_id + 1, "c0", 100)]
    definition = _definition("latest_order", orders, unique)
    writer = ContinualTask(definition, s3_settings, Timing(), spark, "writer")
    standby = ContinualTask(definition, s3_settings, Timing(), spark, "standby", read_only=True)
    writer.start()
    standby.start()
    for upper, by_time in history[:half]:
        append_orders(orders, upper, by_time)
        _run_until([writer, standby], F(upper))  # the standby follows the writer's upper
    names = definition.output_schema.names
    assert standby.times_written == 0 and sorted(
        standby.contents.select(names).to_pylist(), key=str
    ) == sorted(writer.contents.select(names).to_pylist(), key=str)
    standby.promote()  # the writer is gone: the standby takes over from the output's upper
    for upper, by_time in history[half:]:
        append_orders(orders, upper, by_time)
    _run_until([standby], F(history[-1][0]))
    _check(standby.output, evaluate("latest_order", history))
    assert {b.parts[0].writer_id for b in standby.output.state().batches if b.parts} == {
        "writer",
        "standby",
    }


def test_the_read_only_service_writes_after_mvsink_promote(
    orders: Shard,
    s3_settings: S3Settings,
    kafka_bootstrap: str,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mvsink.cli import main
    from services.ct.shell import control_id

    history = _random_history(random.Random(unique), 6)
    service = _Task(orders, s3_settings, kafka_bootstrap, unique, tmp_path, MVSINK_READ_ONLY="true")
    proc, log = service.process.start(), service.process.log
    try:
        for upper, by_time in history:
            append_orders(orders, upper, by_time)
        _wait_for(lambda: "writing nothing until `mvsink promote" in log.read_text(), 120)
        time.sleep(2)
        assert service.output.upper() == F(0)  # read-only: nothing written
        for name in [n for n in os.environ if n.startswith("MVSINK_")]:
            monkeypatch.delenv(name)  # e.g. an outer stack's MVSINK_S3_ACCESS_KEY_FILE
        for name, value in proc.env.items():
            if name.startswith("MVSINK_"):
                monkeypatch.setenv(name, value)
        assert main(["promote", control_id(service.definition)]) == 0
        service.output.wait_for_upper_past(F(history[-1][0] - 1), 120)
        text = log.read_text()
        port = text.split("metrics on http://127.0.0.1:", 1)[1].split("/", 1)[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        name = service.definition.name
        assert f'mvsink_ct_output_upper{{task="{name}"}} {float(history[-1][0])}' in metrics
        written = next(
            line
            for line in metrics.splitlines()
            if line.startswith(f'mvsink_ct_times_written_total{{task="{name}"}}')
        )
        # The counter moves just before its log line is written: the log catches up at once.
        times = float(written.split()[-1])
        _wait_for(lambda: log.read_text().count(" wrote time ") >= times, 10)
        assert times == log.read_text().count(" wrote time ")
        capsys.readouterr()
        assert main(["ct", "show", proc.env["MVSINK_CT_TASK"]]) == 0
        shown = capsys.readouterr().out
        assert f"upper {{{history[-1][0]}}} (caught up)" in shown and "rows as of" in shown
    finally:
        assert proc.stop() == 0, log.read_text()[-3000:]
    assert "promoted: writing from output upper {0}" in log.read_text()
    _check(service.output, evaluate("latest_order", history))


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_restart_does_not_read_the_inputs_history(
    orders: Shard, spark: Any, s3_settings: S3Settings, unique: str
) -> None:
    """Invariant 5: an input holding 1M historical updates: the task processes them once;
    restarted, it reads only what the input appended since, not the history (printed next to a
    full read)."""
    rng = random.Random(unique)
    per_time, times = 200_000, 5
    for t in range(times):
        first = t * per_time + 1
        table = pa.table(
            {
                "order_id": pa.array(range(first, first + per_time), pa.int64()),
                "customer": pa.array([f"c{i % 1000}" for i in range(per_time)], pa.string()),
                "amount": pa.array(
                    [rng.randrange(100, 10000) for _ in range(per_time)], pa.int64()
                ),
                "_time": pa.array([t] * per_time, pa.int64()),
                "_diff": pa.array([1] * per_time, pa.int64()),
            }
        )
        part = orders.stage(table, F(t), F(t + 1), "feeder")
        assert isinstance(orders.compare_and_append([part], F(t), F(t + 1)), Appended)
    definition = _definition("big_orders", orders, unique)
    first_run = ContinualTask(definition, s3_settings, Timing(), spark, "r1")
    first_run.start()
    _run_until([first_run], F(times), timeout=300)
    full = sum(p.bytes for p in orders.state().parts())
    append_orders(
        orders, times + 2, {times: [(10**7, "c1", 9999)], times + 1: [(10**7 + 1, "c2", 50)]}
    )
    restarted = ContinualTask(definition, s3_settings, Timing(), spark, "r2")
    restarted.start()
    _run_until([restarted], F(times + 2))
    print(
        f"input history: {per_time * times:,} updates, {full:,} bytes in its parts; "
        f"bytes read by the first run {first_run.bytes_read:,}, by the restart "
        f"{restarted.bytes_read:,}"
    )
    assert first_run.bytes_read >= full
    assert 0 < restarted.bytes_read < full / 1000
    assert contents(restarted.output, times + 1)[(10**7, "c1", 9999, times)] == 1


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        ("INSERT INTO out SELECT nope FROM src", "statement 1 ('INSERT INTO out SELECT nope"),
        ("INSERT INTO out SELECT a, a FROM src", "returns 2 columns, the output has 1: ['a']"),
        ("INSERT INTO out SELECT 'x' FROM src", "column 'a' is not int64"),
        ("INSERT INTO out SELECT CAST(NULL AS BIGINT) FROM src", "returns NULL for a, which"),
    ],
)
def test_a_failing_statement_is_named(statement: str, message: str, spark: Any) -> None:
    from services.ct.logic import LogicError, run_logic, with_diffs

    text = (
        'name = "t"\nlogic = [' + json.dumps(statement) + "]\n[inputs]\n"
        'src = "in"\n[output]\nname = "out"\nshard = "out"\nschema = "a long not null"\n'
    )
    definition = definition_from_toml(tomllib.loads(text))
    schema = definition.output_schema
    changes = with_diffs(pa.table({"a": pa.array([1, 2], pa.int64())}), schema, 3, 1)
    with pytest.raises(LogicError, match=message.replace("(", r"\(").replace("[", r"\[")):
        run_logic(spark, definition, 3, {"src": changes}, {}, part_schema(schema).empty_table())


def test_statements_see_the_diffs_before_them_and_the_time(spark: Any) -> None:
    from services.ct.logic import run_logic, with_diffs

    text = (
        'name = "t"\nlogic = ["INSERT INTO out SELECT a + :time FROM src", '
        '"DELETE FROM out WHERE a = 1", "INSERT INTO out SELECT count(*) FROM out", '
        '"INSERT INTO out SELECT a * 100 FROM src_retractions"]\n[inputs]\nsrc = "in"\n'
        '[output]\nname = "out"\nshard = "out"\nschema = "a long not null"\n'
    )
    definition = definition_from_toml(tomllib.loads(text))
    schema = definition.output_schema
    changes = with_diffs(pa.table({"a": pa.array([1, 2, 7], pa.int64())}), schema, 3, 1)
    retracted = with_diffs(pa.table({"a": pa.array([5], pa.int64())}), schema, 3, -1)
    output = with_diffs(pa.table({"a": pa.array([1, 1, 9], pa.int64())}), schema, 2, 1)
    diffs = run_logic(
        spark, definition, 3, {"src": pa.concat_tables([changes, retracted])}, {}, output
    )
    got = sorted(zip(diffs.column("a").to_pylist(), diffs.column("_diff").to_pylist(), strict=True))
    # +{4, 5, 10}; -{1, 1}; +count of {9, 4, 5, 10} = 4 (so 4 twice); +500 from the retraction
    assert got == [(1, -2), (4, 2), (5, 1), (10, 1), (500, 1)]
    assert set(diffs.column("_time").to_pylist()) == {3}


def test_a_task_over_a_view_shard_starts_at_its_since_with_the_snapshot(
    spark: Any, s3_settings: S3Settings, unique: str
) -> None:
    """Invariant 6: example task milestones over an MV sink's shard (rows retracted and
    inserted again as totals change, `since` at the upper): a new task starts at the shard's
    `since`, its first changes the view's contents there; later changes are followed from
    there."""
    view = open_shard(f"view-{unique}", parse_row_schema(VIEW), s3_settings, retain_history=0)
    totals: dict[str, float] = {}
    rng = random.Random(3)  # some customers over 1,000 at the start, some crossing later

    def tick(t: int) -> None:
        rows = []
        for customer in rng.sample(["a", "b", "c", "d"], 2):
            if customer in totals:
                rows.append((customer, totals[customer], -1))
            totals[customer] = totals.get(customer, 0.0) + rng.choice([300.0, 600.0])
            rows.append((customer, totals[customer], 1))
        table = pa.table(
            {
                "customer": [r[0] for r in rows],
                "orders": [1] * len(rows),
                "total": [r[1] for r in rows],
                "_time": [t] * len(rows),
                "_diff": [r[2] for r in rows],
            }
        )
        part = view.stage(table, F(t), F(t + 1), "append")
        assert isinstance(view.compare_and_append([part], F(t), F(t + 1)), Appended)

    for t in range(4):
        tick(t)
    assert view.state().since == F(4)  # nothing before 4 is apart by time any more
    definition = _definition("milestones", view, unique)
    crashed = ContinualTask(definition, s3_settings, Timing(), spark, "r0")
    assert crashed.start() == F(4) and crashed.snapshot_first  # and gone before it wrote
    task = ContinualTask(definition, s3_settings, Timing(), spark, "r1")
    assert task.start() == F(4) and task.snapshot_first  # so the snapshot is still to take
    first = {c for c, total in totals.items() if total >= 1000}
    for t in range(4, 9):
        tick(t)
    _run_until([task], F(9))
    rows = contents(task.output, 8)
    assert {r[0] for r in rows} == {c for c, total in totals.items() if total >= 1000}
    assert all(n == 1 for n in rows.values()) and all(r[1] >= 1000 for r in rows)
    # the snapshot's customers at its first time (4), the others when they crossed
    assert first and first <= {r[0] for r in rows if r[2] == 4}
    assert {r[0] for r in rows if r[2] > 4} and not any(r[2] < 4 for r in rows)
    # restarted, it keeps to its output's upper: no snapshot again, no history read
    restarted = ContinualTask(definition, s3_settings, Timing(), spark, "r2")
    assert restarted.start() == F(9) and not restarted.snapshot_first
    tick(9)
    _run_until([restarted], F(10))
    assert all(n == 1 for n in contents(restarted.output, 9).values())
    assert restarted.bytes_read < task.bytes_read / 2


def test_a_reference_is_read_as_of_the_time_and_never_rewrites_the_past(
    orders: Shard, spark: Any, s3_settings: S3Settings, unique: str
) -> None:
    """Orders enriched with their customer's region from a reference shard as of each order's
    time: a region changed later leaves the orders already written as they were."""
    regions = open_shard(
        f"regions-{unique}",
        parse_row_schema("customer string not null, region string not null"),
        s3_settings,
    )

    def set_region(t: int, changes: list[tuple[str, str, int]]) -> None:
        table = pa.table(
            {
                "customer": [c for c, _, _ in changes],
                "region": [r for _, r, _ in changes],
                "_time": [t] * len(changes),
                "_diff": [d for _, _, d in changes],
            }
        )
        lower = regions.upper()
        part = regions.stage(table, lower, F(t + 1), "regions")
        assert isinstance(regions.compare_and_append([part], lower, F(t + 1)), Appended)

    text = (
        f'name = "enrich-{unique}"\nlogic = ["INSERT INTO enriched SELECT o.order_id, '
        'r.region, :time FROM orders o JOIN regions r ON o.customer = r.customer"]\n'
        f'[inputs]\norders = "{orders.shard_id}"\n[references]\nregions = '
        f'"{regions.shard_id}"\n[output]\nname = "enriched"\nshard = "enriched-{unique}"\n'
        'schema = "order_id long not null, region string not null, tick long not null"\n'
    )
    task = ContinualTask(
        definition_from_toml(tomllib.loads(text)), s3_settings, Timing(), spark, "r1"
    )
    task.start()
    set_region(0, [("c1", "north", 1), ("c2", "south", 1)])
    append_orders(orders, 2, {0: [(1, "c1", 100)], 1: [(2, "c2", 200)]})
    _run_until([task], F(1))  # the reference is at {1}: time 1 waits for it
    assert contents(task.output, 0) == Counter({(1, "north", 0): 1})
    set_region(1, [("c2", "south", -1), ("c2", "east", 1)])  # c2 moved at 1
    _run_until([task], F(2))
    set_region(2, [("c1", "north", -1), ("c1", "west", 1)])  # c1 moves after its order
    append_orders(orders, 3, {2: [(3, "c1", 300)]})
    _run_until([task], F(3))
    assert contents(task.output, 2) == Counter(
        {(1, "north", 0): 1, (2, "east", 1): 1, (3, "west", 2): 1}
    )


def test_leases_are_renewed_while_the_output_stands_still(
    orders: Shard, spark: Any, s3_settings: S3Settings, unique: str
) -> None:
    """Invariant 7: no input changes for longer than the lease: the task's hold on its input
    lives on."""
    definition = _definition("latest_order", orders, unique)
    task = ContinualTask(definition, s3_settings, Timing(reader_lease=3.0), spark, "r1")
    task.start()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        task.step()
        time.sleep(0.2)
    lease = orders.state().lease(task.reader_id)
    assert lease is not None and lease.expires_at > time.time()

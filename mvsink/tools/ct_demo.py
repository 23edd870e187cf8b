"""`mvsink ct demo`: three continual tasks over an append-only shard of the demo's order events.

1. create an append-only shard `<run>-orders` (`order_id, customer, amount`; the demo's
   customers and amounts in cents), one batch per tick;
2. start one `python -m services.ct` process per example task in `examples/ct/`, its shards
   renamed for the run: `latest_order` (UPSERT: the latest order of every customer),
   `big_orders` (audit: every order above 90.00, never rewritten) and `recent_orders`
   (retention: the orders of the last 5 ticks);
3. append the ticks' orders while the tasks run, wait for every output to reach the input's
   upper, and compare each output, at every time, with the task evaluated in memory time by
   time (`EVALUATIONS`, which the tests use too).
"""

from __future__ import annotations

import random
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from mvsink import Say
from mvsink.core.errors import MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import REPO_ROOT, Config, state_dir
from mvsink.io.ct_definition import load_definition
from mvsink.shard import Appended, Shard, open_shard
from mvsink.tools.demo import start_service, stop_services, wait_upper

EXAMPLES = REPO_ROOT / "examples" / "ct"
ORDERS = parse_row_schema("order_id long not null, customer string not null, amount long not null")
Order = tuple[int, str, int]
Row = tuple[Any, ...]
History = list[tuple[int, dict[int, list[Order]]]]


def example_task(name: str, input_shard: str, suffix: str) -> str:
    """The definition text of example task `name` (one input), reading `input_shard` and
    writing its output shard with `-<suffix>` appended."""
    text = (EXAMPLES / f"{name}.toml").read_text()
    raw = tomllib.loads(text)  # the shard ids as written (before any ${VARIABLE} expansion)
    [original] = raw["inputs"].values()
    text = text.replace(f'= "{original}"', f'= "{input_shard}"')
    output = raw["output"]["shard"]
    return text.replace(f'shard = "{output}"', f'shard = "{output}-{suffix}"')


def append_orders(orders: Shard, upper: int, by_time: dict[int, list[Order]]) -> None:
    """Append the batch `[orders' upper, upper)` holding `by_time`'s orders at their times."""
    lower = orders.upper()
    rows = [(o, t) for t, batch in sorted(by_time.items()) for o in batch]
    table = pa.table(
        {
            "order_id": pa.array([o[0] for o, _ in rows], pa.int64()),
            "customer": pa.array([o[1] for o, _ in rows], pa.string()),
            "amount": pa.array([o[2] for o, _ in rows], pa.int64()),
            "_time": pa.array([t for _, t in rows], pa.int64()),
            "_diff": pa.array([1] * len(rows), pa.int64()),
        }
    )
    parts = [orders.stage(table, lower, Frontier.at(upper), "orders")] if rows else []
    result = orders.compare_and_append(parts, lower, Frontier.at(upper))
    if not isinstance(result, Appended):
        raise MvsinkError(f"{orders.shard_id}: another writer appended meanwhile ({result})")


# -- the example tasks evaluated in memory, time by time ----------------------------------------


def _latest(output: Counter[Row], time: int, orders: list[Order]) -> None:
    newest: dict[str, Order] = {}
    for order in orders:
        if order[1] not in newest or order[0] > newest[order[1]][0]:
            newest[order[1]] = order
    for row in [r for r in output if r[0] in newest]:
        del output[row]
    for customer, (order_id, _, amount) in newest.items():
        output[(customer, order_id, amount)] += 1


def _big(output: Counter[Row], time: int, orders: list[Order]) -> None:
    for order_id, customer, amount in orders:
        if amount > 9000:
            output[(order_id, customer, amount, time)] += 1


def _recent(output: Counter[Row], time: int, orders: list[Order]) -> None:
    for order_id, customer, amount in orders:
        output[(order_id, customer, amount, time)] += 1
    for row in [r for r in output if r[3] <= time - 5]:
        del output[row]


EVALUATIONS: dict[str, Callable[[Counter[Row], int, list[Order]], None]] = {
    "latest_order": _latest,
    "big_orders": _big,
    "recent_orders": _recent,
}


def evaluate(name: str, history: History) -> dict[int, Counter[Row]]:
    """Example task `name`'s output as of every time before the history's upper: its logic
    applied at every time the input changed at."""
    orders = {t: o for _, by_time in history for t, o in by_time.items()}
    output: Counter[Row] = Counter()
    contents = {}
    for t in range(history[-1][0] if history else 0):
        if orders.get(t):
            EVALUATIONS[name](output, t, orders[t])
        contents[t] = Counter(output)
    return contents


def contents(output: Shard, time: int) -> Counter[Row]:
    """The output's rows as of `time`, with their counts."""
    names = output.schema.names
    return Counter(
        {
            tuple(r[n] for n in names): r["_diff"]
            for r in output.snapshot(Frontier.at(time + 1)).to_pylist()
        }
    )


def mismatches(output: Shard, expected: dict[int, Counter[Row]]) -> list[int]:
    """The times at which the output differs from `expected`."""
    return [t for t, want in expected.items() if contents(output, t) != want]


# -- the demo -------------------------------------------------------------------------------


def run_ct_demo(config: Config, say: Say, ticks: int = 12, orders: int = 20) -> None:
    """See the module docs. Raises `MvsinkError` if an output differs from its evaluation."""
    run = f"ctdemo-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}"
    shard = open_shard(f"{run}-orders", ORDERS, config.s3)
    logs = state_dir() / "demo" / run
    logs.mkdir(parents=True, exist_ok=True)
    procs, outputs = [], {}
    try:
        for name in EVALUATIONS:
            task_file = logs / f"{name}.toml"
            task_file.write_text(example_task(name, shard.shard_id, run))
            definition = load_definition(task_file)
            outputs[name] = open_shard(definition.output_shard, definition.output_schema, config.s3)
            procs.append(
                start_service(
                    config,
                    "ct",
                    logs / name,
                    MVSINK_CT_TASK=str(task_file),
                    MVSINK_SPARK_MASTER="local[1]",
                )
            )
        say(
            f"input {shard.shard_id} (append-only orders); tasks {', '.join(EVALUATIONS)}; "
            f"logs in {logs}"
        )
        _wait_started(logs, say)
        rng, customers = random.Random(7), [f"customer-{i:03d}" for i in range(8)]
        history: History = []
        next_id = 1
        for tick in range(ticks):
            by_time = {
                tick: [
                    (next_id + i, rng.choice(customers), rng.randint(100, 10000))
                    for i in range(rng.choice([0, orders // 2, orders]))
                ]
            }
            next_id += len(by_time[tick])
            append_orders(shard, tick + 1, by_time)
            history.append((tick + 1, by_time))
            uppers = ", ".join(f"{n} {o.upper()}" for n, o in outputs.items())
            say(f"tick {tick}: {len(by_time[tick])} orders; outputs at {uppers}")
            time.sleep(1.0)
        for name, output in outputs.items():
            say(f"{name}:")
            wait_upper(output, ticks, say, timeout=180)
        failed = []
        for name, output in outputs.items():
            expected = evaluate(name, history)
            wrong = mismatches(output, expected)
            final = contents(output, ticks - 1)
            say(
                f"{name}: {sum(final.values())} rows at {{{ticks}}}, equal to its evaluation at "
                f"{len(expected) - len(wrong)}/{len(expected)} times"
            )
            for row in sorted(final, key=str)[:3]:
                say(f"  {row}")
            if wrong:
                failed.append(f"{name} at times {wrong}")
        if failed:
            raise MvsinkError(f"outputs differ from their evaluation: {'; '.join(failed)}")
        say("ct demo OK: every output equals its task evaluated time by time")
    finally:
        stop_services(procs, timeout=30)


def _wait_started(logs: Path, say: Say, timeout: float = 180) -> None:
    """Until every task logged its start (each a Spark driver of its own)."""
    deadline = time.monotonic() + timeout
    for name in EVALUATIONS:
        log = logs / name / "ct.log"
        while "starts at output upper" not in (log.read_text() if log.exists() else ""):
            if time.monotonic() > deadline:
                raise MvsinkError(f"task {name} did not start in {timeout:.0f}s: see {log}")
            time.sleep(0.5)
    say("every task started (Spark drivers up); appending ticks of orders")

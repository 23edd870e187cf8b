"""Many sinks, one deployment: mint and append processes started with `[service] sinks = all`
serve every sink defined on their sinks topic (`mvsink.io.host`), against real Kafka and MinIO.
The write stage is played by `WriteRole` (one per sink: real parts staged in MinIO, real
`StagedBatch`es), so twenty sinks cost no Spark driver."""

from __future__ import annotations

import re
import signal
import time
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Producer
from sinkkit import (
    Service,
    Sink,
    Upstream,
    WriteRole,
    cli_env,
    converged,
    host_env,
    mvsink_cli,
    probe,
    wait_until,
)

from mvsink.core.frontier import Frontier
from mvsink.core.settings import S3Settings
from mvsink.io.kafka import client_config
from mvsink.io.sinks import define, drop
from mvsink.tools.dead_letters import read_letters
from mvsink.tools.demo import SERVICES

pytestmark = pytest.mark.integration
F = Frontier.at


def _port(service: Service) -> int:
    line = next(li for li in service.text().splitlines() if "metrics on http://" in li)
    return int(line.split("metrics on http://")[1].split("/")[0].rsplit(":", 1)[1])


def _serving(service: Service) -> bool:
    """Whether the mint replica serves the sinks now (its last word on it says so)."""
    said = [li for li in service.text().splitlines() if "serving the sinks defined on" in li]
    return bool(said) and "no longer" not in said[-1]


def _owner(mints: list[Service]) -> Service:
    """The one mint replica serving the sinks, once the group settled on one."""
    wait_until(
        lambda: sum(_serving(m) for m in mints) == 1, 60, "one mint replica serving the sinks"
    )
    time.sleep(1)  # a rebalance on a replica joining late moves it once more
    wait_until(
        lambda: sum(_serving(m) for m in mints) == 1, 60, "one mint replica serving the sinks"
    )
    (owner,) = [m for m in mints if _serving(m)]
    return owner


def test_one_mint_and_one_append_serve_twenty_sinks_created_dropped_and_handed_over(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, procs: list[Service]
) -> None:
    """Two mint replicas (one serves, one stands by) and one append process serve 20 sinks
    created while they run, each fed on its own: every sink's shard reaches each upper with
    exactly its staged rows, once. A sink dropped mid-run stops there while the others go on;
    a sink whose definition disagrees with its topic (P 3 on a 2-partition topic) is named by
    `/readyz`, which stays 200; the serving mint paused (SIGSTOP) past the group session loses
    every sink to the one standing by, whose units fence it (resumed, it mints nothing and stands
    by), and killed with `kill -9`, the serving one hands every sink back."""
    tag = uuid.uuid4().hex[:6]
    sinks_topic, frontiers = f"sinks-{tag}", f"frontiers-{tag}"
    env = host_env(kafka_bootstrap, s3_settings, tmp_path / "state", sinks_topic, frontiers)
    mints = [Service("mint", env, tmp_path / f"mint{i}.log").start() for i in range(2)]
    append = Service("append", env, tmp_path / "append.log").start()
    procs.extend([*mints, append])

    sinks = [
        Sink.create(
            kafka_bootstrap,
            s3_settings,
            tmp_path / f"s{i}",
            workers=1 + i % 2,
            frontiers=frontiers,
            sinks=sinks_topic,
        )
        for i in range(20)
    ]
    roles = {s.config.sink_id: WriteRole(s) for s in sinks}
    live = list(sinks)

    def reach(t: int, what: str) -> None:
        for s in live:
            s.advance_desired(F(t))

        def pump() -> None:
            for s in live:
                roles[s.config.sink_id].pump(0.01)

        wait_until(lambda: all(s.shard.upper() == F(t) for s in live), 120, what, step=pump)

    started = time.monotonic()
    reach(2, "20 sinks at {2}")
    print(f"20 sinks created and at {{2}} in {time.monotonic() - started:.1f}s")

    serving = _owner(mints)
    dropped = live.pop(3)
    drop(dropped.config)
    wait_until(
        lambda: (
            f"stopping the unit of sink {dropped.config.sink_id}: dropped" in serving.text()
            and f"stopping the unit of sink {dropped.config.sink_id}: dropped" in append.text()
        ),
        60,
        "the dropped sink's units stopped",
    )
    reach(4, "the others at {4} after the drop")
    dropped.advance_desired(F(9))
    roles[dropped.config.sink_id].pump(1.0)
    assert dropped.shard.upper() == F(2)  # nothing mints or appends for it any more

    # A definition whose P disagrees with the sink's topic: named, the service stays ready.
    wrong = sinks[5].config
    define(replace(wrong, partitions=3))
    wait_until(
        lambda: f"{wrong.sink_id}: TopicMismatch" in probe(_port(append), "/readyz")[1],
        90,
        "/readyz naming the sink whose topic disagrees",
    )
    status, body = probe(_port(append), "/readyz")
    assert status == 200, body
    define(wrong)  # back as it was: served again
    live.remove(sinks[5])
    reach(5, "the others at {5} while one sink is refused")
    live.append(sinks[5])

    # Paused past the group session, the serving mint loses the sinks to the standby, whose
    # units fence its transactions: resumed, it mints nothing more and stands by.
    paused = _owner(mints)
    assert paused.proc is not None
    paused.proc.send_signal(signal.SIGSTOP)
    try:
        reach(6, "every sink at {6} with the serving mint paused")
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    serving = _owner(mints)
    assert serving is not paused
    reach(7, "every sink at {7} after the paused mint resumed")

    serving.kill()
    started = time.monotonic()
    reach(8, "every sink at {8} after the serving mint's kill -9")
    print(f"handed over and at {{8}} in {time.monotonic() - started:.1f}s")
    assert _serving(paused)

    for s in live:
        state = s.shard.state()
        assert set(Counter(p.key for p in state.parts()).values()) == {1}
        rows = s.shard.snapshot(8).to_pylist()
        assert all(r["_diff"] == 1 for r in rows), "a row appended twice"
        assert len(rows) == s.config.partitions * len(state.batches)
    for s in live[:3]:  # minted lowers strictly increase, through the handover too
        lowers = [d.lower.time for d in s.descs()]
        assert lowers == sorted(set(lowers)), lowers
    for role in roles.values():
        role.close()


def test_one_deployment_of_three_processes_keeps_sinks_created_while_it_runs_equal_to_desired(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, procs: list[Service]
) -> None:
    """mint, write and append, one process each with `[service] sinks = all` and one Spark
    application for every sink's steps: two sinks, then a third created while they run, each
    fed by its own upstream, each shard equal to its desired at each upper checked; a sink
    dropped mid-run stops there (its write driver releases its checkpoint holds) and the others
    go on; a sink created after every other was dropped is served too."""
    tag = uuid.uuid4().hex[:6]
    sinks_topic, frontiers = f"sinks-{tag}", f"frontiers-{tag}"
    env = host_env(kafka_bootstrap, s3_settings, tmp_path / "state", sinks_topic, frontiers)
    services = {n: Service(n, env, tmp_path / f"{n}.log").start() for n in SERVICES}
    procs.extend(services.values())

    def create(i: int) -> Sink:
        return Sink.create(
            kafka_bootstrap, s3_settings, tmp_path / f"s{i}", frontiers=frontiers, sinks=sinks_topic
        )

    sinks = [create(0), create(1)]
    upstreams = {s.config.sink_id: Upstream(s) for s in sinks}

    def ticks(n: int, live: list[Sink], what: str) -> None:
        for _ in range(n):
            for s in live:
                upstreams[s.config.sink_id].tick()
        for s in live:
            wait_until(
                lambda s=s: converged(s, upstreams[s.config.sink_id]),
                180,
                f"{what}: {s.config.sink_id}",
            )

    ticks(3, sinks, "the first two sinks")
    sinks.append(create(2))
    upstreams[sinks[2].config.sink_id] = Upstream(sinks[2])
    ticks(3, sinks, "three sinks, one created while the services run")

    dropped = sinks.pop(0)
    drop(dropped.config)
    wait_until(
        lambda: all(
            f"stopping the unit of sink {dropped.config.sink_id}: dropped" in s.text()
            for s in services.values()
        ),
        60,
        "the dropped sink's units stopped",
    )
    upper = dropped.shard.upper()
    ticks(2, sinks, "the others after the drop")
    assert dropped.shard.upper() == upper
    held = [h.holder_id for h in dropped.shard.state().holds]
    assert not any(h.startswith(f"checkpoint:{dropped.config.sink_id}:") for h in held), held
    write = services["write"].text()
    for s in sinks:  # one process, one Spark application: a driver per sink, its own writer id
        assert f"-{s.config.sink_id}, read_only=False" in write

    # Every sink dropped, then a new one: the residents went home with the last driver, so the
    # new driver's first Spark job (its warm-up) gets the task slots, and the sink converges.
    for s in sinks:
        drop(s.config)
    wait_until(
        lambda: all(
            f"stopping the unit of sink {s.config.sink_id}: dropped" in services["write"].text()
            for s in sinks
        ),
        60,
        "every sink's write unit stopped",
    )
    last = create(3)
    upstreams[last.config.sink_id] = Upstream(last)
    ticks(2, [last], "a sink created after every other was dropped")


def test_hosted_replicas_hand_every_sink_over_and_one_sinks_poison_stalls_no_other(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, procs: list[Service]
) -> None:
    """Two hosted write and two hosted append replicas serve two sinks (each sink's groups
    spread its partitions and workers over both). A record on one sink's desired topic that is
    no record is dead-lettered while both sinks keep converging; one write and one append
    replica killed with `kill -9` hand their share of every sink to the survivors, which keep
    both shards equal to their upstreams."""
    tag = uuid.uuid4().hex[:6]
    sinks_topic, frontiers = f"sinks-{tag}", f"frontiers-{tag}"
    env = host_env(kafka_bootstrap, s3_settings, tmp_path / "state", sinks_topic, frontiers)
    names = ("mint", "write", "write", "append", "append")
    services = [Service(n, env, tmp_path / f"{n}{i}.log").start() for i, n in enumerate(names)]
    procs.extend(services)
    sinks = [
        Sink.create(
            kafka_bootstrap, s3_settings, tmp_path / f"s{i}", frontiers=frontiers, sinks=sinks_topic
        )
        for i in range(2)
    ]
    upstreams = [Upstream(s) for s in sinks]

    def ticks(n: int, what: str) -> None:
        for _ in range(n):
            for upstream in upstreams:
                upstream.tick()
        for s, upstream in zip(sinks, upstreams, strict=True):
            wait_until(lambda s=s, u=upstream: converged(s, u), 180, f"{what}: {s.config.sink_id}")

    ticks(2, "both sinks on four replicas")
    cli = {
        **cli_env(kafka_bootstrap, s3_settings, tmp_path / "cli"),
        "MVSINK_SINKS_TOPIC": sinks_topic,
    }

    def listed() -> dict[str, str]:
        done = mvsink_cli(["sink", "list"], cli)
        assert done.returncode == 0, done.stderr
        return {li.split("\t")[0]: li for li in done.stdout.splitlines()}

    def write_owners(line: str) -> int:
        """How many write replicas own a share of the sink `line` lists: an owner is the client
        address Kafka saw (127.0.0.1, or a Docker bridge's) and its partitions, `[]` for none."""
        return len(re.findall(r"\S+ \[\d", line.split("\twrite ")[1].split("\t")[0]))

    # The sinks may converge on the first replica to join before the group spreads them, and
    # `sink list` reads the groups as they are: a rebalance under way lists an owner of `[]`.
    wait_until(
        lambda: all(write_owners(listed()[s.config.sink_id]) == 2 for s in sinks),
        60,
        "each sink's partitions spread over both write replicas",
    )
    for s, upstream in zip(sinks, upstreams, strict=True):  # caught up, two owners each
        line = listed()[s.config.sink_id]
        assert f"desired {{{upstream.frontier}}}\tlag 0\t" in line, line
        assert write_owners(line) == 2, line
    poisoned = sinks[0].config
    producer = Producer(client_config(kafka_bootstrap))
    producer.produce(poisoned.topics.desired, value=b"no record", partition=0)
    assert producer.flush(30) == 0
    ticks(2, "both sinks past one sink's poison")
    letters = read_letters(kafka_bootstrap, poisoned.topics.dead_letter)
    assert [letter.value for letter in letters] == [b"no record"], letters

    services[1].kill()  # a write replica
    services[3].kill()  # an append replica
    ticks(3, "both sinks after a write and an append replica's kill -9")
    wait_until(
        lambda: all(
            re.search(r"\twrite \S+ \[0, 1\]\tappend \S+ \[0, 1\]\t", line)
            for line in listed().values()
        ),
        60,
        "`sink list` naming one owner of everything",
    )
    for s in sinks:  # each survivor's last assignment of each sink is all of it
        unit = f" [{s.config.sink_id}] "
        for survivor, said, whole in (
            (services[2], "desired partitions assigned: ", "[0, 1]"),
            (services[4], "append workers assigned: ", "[0, 1]"),
        ):
            lines = [li for li in survivor.text().splitlines() if unit in li and said in li]
            assert lines and lines[-1].split(said)[1].startswith(whole), lines

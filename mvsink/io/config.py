"""One validated configuration for every mvsink process.

Sources, later ones winning:

1. built-in defaults;
2. the endpoints and credentials of the embedded stack, if `mvsink stack up` is running one
   under the state directory (so `mvsink ...` just works after `mvsink stack up`);
3. a TOML file (`--config PATH` or `MVSINK_CONFIG`) with tables `[sink]`, `[kafka]`, `[s3]`,
   `[spark]`, `[shard]`, `[service]`, `[ct]`;
4. environment variables `MVSINK_*` (see `FIELDS`).

Credentials come only from the environment or from secret files (`MVSINK_S3_ACCESS_KEY_FILE`,
`MVSINK_S3_SECRET_KEY_FILE`): a config file that holds them is refused, and they never appear in
`repr`, `str` or logs (`Secret`).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mvsink.core.errors import ConfigError, ContractError
from mvsink.core.partitioning import KNOWN as KNOWN_PARTITIONINGS
from mvsink.core.settings import CompactionPolicy, S3Settings, Secret, Timing

__all__ = ["FIELDS", "ID", "MEANINGS", "REPO_ROOT", "CompactionPolicy", "Config", "S3Settings", "Secret", "Timing", "Topics",
           "cache_dir", "config_env", "load_config", "read_toml", "settings_help", "state_dir"]  # fmt: skip

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The shard library's own defaults are the configuration's.
_TIMING, _POLICY = Timing(), CompactionPolicy()
#: A valid sink, shard or task id.
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """The project's ignored state directory (`MVSINK_STATE_DIR`, default `<repo>/.mvsink`)."""
    env = os.environ if env is None else env
    return Path(env.get("MVSINK_STATE_DIR") or REPO_ROOT / ".mvsink").resolve()


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where downloads and builds are cached (`MVSINK_CACHE_DIR`, default `<state dir>/cache`).

    Point several checkouts at one cache to build MinIO and fetch Kafka only once.
    """
    env = os.environ if env is None else env
    return Path(env.get("MVSINK_CACHE_DIR") or state_dir(env) / "cache").resolve()


@dataclass(frozen=True)
class Topics:
    """Topic names of one sink replica (docs/design.md §3.1)."""

    desired: str
    descs: str
    batches: str
    control: str
    frontiers: str
    dead_letter: str

    @classmethod
    def for_sink(cls, sink_id: str, frontiers: str = "frontiers") -> Topics:
        """The default names `<sink>.desired`, `<sink>.descs`, ...; `frontiers` is shared."""
        return cls(
            desired=f"{sink_id}.desired",
            descs=f"{sink_id}.descs",
            batches=f"{sink_id}.batches",
            control=f"{sink_id}.control",
            frontiers=frontiers,
            dead_letter=f"{sink_id}.dead-letter",
        )


@dataclass(frozen=True)
class Config:
    """Everything a mint, write or append process (or a tool) needs.

    Invariants: ids are non-empty `[A-Za-z0-9_.-]`; `partitions` (P) and `append_workers` (A)
    are >= 1; `as_of >= 0`.
    """

    sink_id: str
    shard_id: str
    partitions: int
    append_workers: int
    as_of: int
    read_only: bool
    topics: Topics
    kafka_bootstrap: str
    s3: S3Settings
    spark_master: str
    #: The sink's row schema (`"name type[ not null], ..."`); "" = take the shard's.
    row_schema: str = ""
    #: The desired partitioning function (`mvsink.core.partitioning`): producers hash with it, write
    #: tasks refuse desired records hashed otherwise.
    partitioning: int = 2
    #: Where a service serves Prometheus metrics; port 0 picks a free one (logged).
    metrics_addr: str = "127.0.0.1"
    metrics_port: int = 0
    log_level: str = "INFO"
    #: Identity of this process in part keys and logs; "" = `<service>-<host>-<pid>`.
    writer_id: str = ""
    #: Health (`mvsink.io.health`): not live when the loop is silent longer than `live_bound`; not
    #: ready when Kafka or S3 does not answer, or the frontier is behind its target and has not
    #: moved for longer than `ready_bound` (seconds).
    live_bound: float = 300.0
    ready_bound: float = 30.0
    #: The shard's deletion-safety time bounds (`mvsink.shard.Timing`), in seconds.
    shard_max_attempt_age: float = _TIMING.max_attempt_age
    shard_max_part_age: float = _TIMING.max_part_age
    shard_min_grace: float = _TIMING.min_grace
    shard_part_grace: float = _TIMING.part_grace
    shard_version_grace: float = _TIMING.version_grace
    shard_reader_lease: float = _TIMING.reader_lease
    shard_request_timeout: float = _TIMING.request_timeout
    #: How far the shard's `since` trails its upper, in times (`mvsink.shard`).
    retain_history: int = 0
    #: The desired topic's `retention.ms` set by provisioning (-1: the broker deletes nothing;
    #: the write service deletes what every checkpoint is past, `desired_trim_interval`).
    desired_retention_ms: int = -1
    #: The desired topic's `segment.ms` set by provisioning: deleted records leave the broker's
    #: disk only with their whole segment, so segments roll at least this often.
    desired_segment_ms: int = 3_600_000
    #: How often (s) the write service deletes desired records below its partitions' older
    #: kept checkpoint (0: never).
    desired_trim_interval: float = 30.0
    #: Whether the write service compacts the shard (the driver owning desired partition 0).
    compaction: bool = True
    compaction_max_batches: int = _POLICY.max_batches
    compaction_max_amplification: float = _POLICY.max_amplification
    #: Whether the write service runs its steps in resident Spark tasks (`services.write.resident`)
    #: instead of a Spark job per step; off where executors cannot connect back to the driver.
    spark_residents: bool = True
    #: The continual task service's task definition file (`mvsink.io.ct_definition`).
    ct_task: str = ""

    def shard_timing(self) -> Timing:
        """The shard library's `Timing` of this configuration."""
        return Timing(self.shard_max_attempt_age, self.shard_max_part_age, self.shard_min_grace,
                      part_grace=self.shard_part_grace, version_grace=self.shard_version_grace,
                      reader_lease=self.shard_reader_lease,
                      request_timeout=self.shard_request_timeout)  # fmt: skip

    def compaction_policy(self) -> CompactionPolicy:
        """The merge policy of this configuration."""
        return CompactionPolicy(max_amplification=self.compaction_max_amplification,
                                max_batches=self.compaction_max_batches)  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("sink_id", "shard_id"):
            value = getattr(self, name)
            if not ID.match(value):
                raise ConfigError(f"{name}={value!r}: use 1-200 of [A-Za-z0-9_.-]")
        if self.partitions < 1:
            raise ConfigError(f"partitions (P) must be >= 1, got {self.partitions}")
        if self.partitioning not in KNOWN_PARTITIONINGS:
            raise ConfigError(f"partitioning must be one of {KNOWN_PARTITIONINGS}, "
                              f"got {self.partitioning}")  # fmt: skip
        if self.append_workers < 1:
            raise ConfigError(f"append_workers (A) must be >= 1, got {self.append_workers}")
        if self.as_of < 0:
            raise ConfigError(f"as_of must be >= 0, got {self.as_of}")
        if not self.kafka_bootstrap:
            raise ConfigError("kafka bootstrap servers not set (MVSINK_KAFKA_BOOTSTRAP)")
        if not self.s3.endpoint:
            raise ConfigError("S3 endpoint not set (MVSINK_S3_ENDPOINT)")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port {self.metrics_port} is not a TCP port")
        if self.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ConfigError(f"log_level {self.log_level!r}: use DEBUG, INFO, WARNING or ERROR")
        if self.live_bound <= 0 or self.ready_bound <= 0:
            raise ConfigError(f"live_bound ({self.live_bound}) and ready_bound "
                              f"({self.ready_bound}) must be > 0 seconds")  # fmt: skip
        if self.retain_history < 0:
            raise ConfigError(f"retain_history must be >= 0, got {self.retain_history}")
        try:
            self.shard_timing()
        except ContractError as error:
            raise ConfigError(f"shard timing: {error}") from error
        try:
            self.compaction_policy()
        except ContractError as error:
            raise ConfigError(f"compaction: {error}") from error
        if self.row_schema:
            from mvsink.core.rows import parse_row_schema

            parse_row_schema(self.row_schema)  # raises ConfigError naming the bad column


# -- loading ---------------------------------------------------------------------------------------


def _bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _int(text: str) -> int:
    if isinstance(text, bool):
        raise ValueError(f"not an integer: {text!r}")
    return int(text)


@dataclass(frozen=True)
class FieldSpec:
    """Where one setting comes from: `[section] key` in the file, `env` in the environment."""

    name: str
    section: str
    key: str
    env: str
    parse: Callable[[str], Any]
    secret: bool = False


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("sink_id", "sink", "id", "MVSINK_SINK_ID", str),
    FieldSpec("shard_id", "sink", "shard_id", "MVSINK_SHARD_ID", str),
    FieldSpec("partitions", "sink", "partitions", "MVSINK_PARTITIONS", _int),
    FieldSpec("append_workers", "sink", "append_workers", "MVSINK_APPEND_WORKERS", _int),
    FieldSpec("partitioning", "sink", "partitioning", "MVSINK_PARTITIONING", _int),
    FieldSpec("as_of", "sink", "as_of", "MVSINK_AS_OF", _int),
    FieldSpec("read_only", "sink", "read_only", "MVSINK_READ_ONLY", _bool),
    FieldSpec("frontiers_topic", "kafka", "frontiers_topic", "MVSINK_FRONTIERS_TOPIC", str),
    FieldSpec("kafka_bootstrap", "kafka", "bootstrap_servers", "MVSINK_KAFKA_BOOTSTRAP", str),
    FieldSpec("s3_endpoint", "s3", "endpoint", "MVSINK_S3_ENDPOINT", str),
    FieldSpec("s3_bucket", "s3", "bucket", "MVSINK_S3_BUCKET", str),
    FieldSpec("s3_region", "s3", "region", "MVSINK_S3_REGION", str),
    FieldSpec("s3_secure", "s3", "secure", "MVSINK_S3_SECURE", _bool),
    FieldSpec("s3_access_key", "s3", "access_key", "MVSINK_S3_ACCESS_KEY", str, secret=True),
    FieldSpec("s3_secret_key", "s3", "secret_key", "MVSINK_S3_SECRET_KEY", str, secret=True),
    FieldSpec("spark_master", "spark", "master", "MVSINK_SPARK_MASTER", str),
    FieldSpec("spark_residents", "spark", "residents", "MVSINK_SPARK_RESIDENTS", _bool),
    FieldSpec("row_schema", "sink", "row_schema", "MVSINK_ROW_SCHEMA", str),
    FieldSpec("metrics_addr", "service", "metrics_addr", "MVSINK_METRICS_ADDR", str),
    FieldSpec("metrics_port", "service", "metrics_port", "MVSINK_METRICS_PORT", _int),
    FieldSpec("log_level", "service", "log_level", "MVSINK_LOG_LEVEL", str),
    FieldSpec("writer_id", "service", "writer_id", "MVSINK_WRITER_ID", str),
    FieldSpec("live_bound", "service", "live_bound", "MVSINK_LIVE_BOUND", float),
    FieldSpec("ready_bound", "service", "ready_bound", "MVSINK_READY_BOUND", float),
    FieldSpec(
        "shard_max_attempt_age", "shard", "max_attempt_age", "MVSINK_SHARD_MAX_ATTEMPT_AGE", float
    ),
    FieldSpec("shard_max_part_age", "shard", "max_part_age", "MVSINK_SHARD_MAX_PART_AGE", float),
    FieldSpec("shard_min_grace", "shard", "min_grace", "MVSINK_SHARD_MIN_GRACE", float),
    FieldSpec("shard_part_grace", "shard", "part_grace", "MVSINK_SHARD_PART_GRACE", float),
    FieldSpec("shard_version_grace", "shard", "version_grace", "MVSINK_SHARD_VERSION_GRACE", float),
    FieldSpec("shard_reader_lease", "shard", "reader_lease", "MVSINK_SHARD_READER_LEASE", float),
    FieldSpec(
        "shard_request_timeout", "shard", "request_timeout", "MVSINK_SHARD_REQUEST_TIMEOUT", float
    ),
    FieldSpec("retain_history", "sink", "retain_history", "MVSINK_RETAIN_HISTORY", _int),
    FieldSpec(
        "desired_retention_ms", "kafka", "desired_retention_ms", "MVSINK_DESIRED_RETENTION_MS", _int
    ),
    FieldSpec(
        "desired_segment_ms", "kafka", "desired_segment_ms", "MVSINK_DESIRED_SEGMENT_MS", _int
    ),
    FieldSpec(
        "desired_trim_interval", "sink", "trim_interval", "MVSINK_DESIRED_TRIM_INTERVAL", float
    ),
    FieldSpec("compaction", "shard", "compaction", "MVSINK_SHARD_COMPACTION", _bool),
    FieldSpec("compaction_max_batches", "shard", "max_batches", "MVSINK_SHARD_MAX_BATCHES", _int),
    FieldSpec(
        "compaction_max_amplification",
        "shard",
        "max_amplification",
        "MVSINK_SHARD_MAX_AMPLIFICATION",
        float,
    ),
    FieldSpec("ct_task", "ct", "task", "MVSINK_CT_TASK", str),
)

DEFAULTS: Mapping[str, Any] = {
    "sink_id": "demo",
    "shard_id": "demo",
    "partitions": 4,
    "append_workers": 2,
    "partitioning": 2,
    "as_of": 0,
    "read_only": False,
    "frontiers_topic": "frontiers",
    "kafka_bootstrap": "",
    "s3_endpoint": "",
    "s3_bucket": "mvsink",
    "s3_region": "us-east-1",
    "s3_secure": False,
    "s3_access_key": "",
    "s3_secret_key": "",
    "spark_master": "local[*]",
    "spark_residents": True,
    "row_schema": "",
    "metrics_addr": "127.0.0.1",
    "metrics_port": 0,
    "log_level": "INFO",
    "writer_id": "",
    "live_bound": 300.0,
    "ready_bound": 30.0,
    "retain_history": 0,
    "desired_retention_ms": -1,
    "desired_segment_ms": 3_600_000,
    "desired_trim_interval": 30.0,
    "compaction": True,
    **{f"shard_{name}": getattr(_TIMING, name) for name in
       ("max_attempt_age", "max_part_age", "min_grace", "part_grace", "version_grace", "reader_lease",
        "request_timeout")},
    "compaction_max_batches": _POLICY.max_batches,
    "compaction_max_amplification": _POLICY.max_amplification,
    "ct_task": "",
}  # fmt: skip


#: What each setting means, one line (`settings_help`, the services' `--help`).
MEANINGS: Mapping[str, str] = {
    "sink_id": "the sink replica's id: its topics are <id>.desired, .descs, .batches, .control",
    "shard_id": "the shard (S3 prefix shards/<id>/) the sink keeps equal to desired",
    "partitions": "P, desired partitions (the <sink>.desired topic's partition count)",
    "append_workers": "A, append workers (the <sink>.batches topic's partition count)",
    "partitioning": "the desired partitioning function: 2 (columnar hash), or 1 for desired "
    "topics written before it (schemas/README.md)",
    "as_of": "the first time the sink writes",
    "read_only": "start read-only: fold and hold a lease, write nothing until promoted",
    "frontiers_topic": "the compacted topic of desired progress and shard uppers",
    "kafka_bootstrap": "Kafka bootstrap servers (host:port,...)",
    "s3_endpoint": "S3 endpoint host:port",
    "s3_bucket": "S3 bucket of shards and checkpoints",
    "s3_region": "S3 region",
    "s3_secure": "use TLS to reach S3",
    "s3_access_key": "S3 access key (environment or <VAR>_FILE only)",
    "s3_secret_key": "S3 secret key (environment or <VAR>_FILE only)",
    "spark_master": "the write service's Spark master URL",
    "spark_residents": "whether write runs its steps in long-lived Spark tasks that connect back to the driver",
    "row_schema": 'the row schema, "name type[ not null], ..."; empty: the shard\'s',
    "metrics_addr": "address of the Prometheus endpoint",
    "metrics_port": "port of the Prometheus endpoint; 0 picks a free one (logged)",
    "log_level": "DEBUG, INFO, WARNING or ERROR (DEBUG traces every frontier)",
    "writer_id": "this process's id in part keys and logs; empty: <service>-<host>-<pid>",
    "live_bound": "s, /healthz fails when the service loop was silent this long",
    "ready_bound": "s, /readyz fails when the frontier lags its target unmoved this long",
    "shard_max_attempt_age": "s, a compare-and-set writes version n+1 at most this long after reading n",
    "shard_max_part_age": "s, parts staged longer ago than this are refused by appends",
    "shard_min_grace": "s, the sweeper deletes never-referenced parts only older than this",
    "shard_part_grace": "s, parts a merge replaced are deleted this long after the merge",
    "shard_version_grace": "s, superseded state versions are pruned this long after",
    "shard_reader_lease": "s, a reader lease not renewed for this long expires",
    "shard_request_timeout": "s, the read timeout of a conditional create on S3",
    "retain_history": "times of history the shard keeps: since trails the upper by this (or a lease)",
    "desired_retention_ms": "retention.ms provisioning sets on <sink>.desired (-1: the broker deletes nothing; the write service trims it)",
    "desired_segment_ms": "segment.ms provisioning sets on <sink>.desired: trimmed records leave the disk with their segment",
    "desired_trim_interval": "s, how often the write service deletes desired records every kept checkpoint is past (0: never)",
    "compaction": "whether the write service compacts the shard",
    "compaction_max_batches": "never keep more live batches than this",
    "compaction_max_amplification": "merge the batches since has passed once the newer of them hold this many times the oldest one's updates",
    "ct_task": "the continual task's definition file (python -m services.ct)",
}


def settings_help() -> str:
    """Every setting: its TOML key, its environment variable, its default and meaning; with
    the sources and their order (a service's `--help`)."""
    rows = []
    for spec in FIELDS:
        default = DEFAULTS[spec.name]
        shown = "(none)" if default == "" else str(default).lower() if isinstance(default, bool) \
            else str(default)  # fmt: skip
        env = f"{spec.env}[_FILE]" if spec.secret else spec.env
        rows.append((f"[{spec.section}] {spec.key}", env, shown, MEANINGS[spec.name]))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        "settings (later sources win: defaults; the endpoints and credentials of the embedded",
        "stack when `mvsink stack up` runs one under MVSINK_STATE_DIR; the TOML file of --config",
        "or MVSINK_CONFIG; the MVSINK_* environment). Credentials are refused in files.",
        "",
        f"  {'TOML key':<{widths[0]}}  {'environment':<{widths[1]}}  {'default':<{widths[2]}}  meaning",
    ]
    lines += [f"  {key:<{widths[0]}}  {env:<{widths[1]}}  {default:<{widths[2]}}  {meaning}"
              for key, env, default, meaning in rows]  # fmt: skip
    lines += [
        "",
        "  MVSINK_CONFIG     the TOML file (as --config)",
        "  MVSINK_STATE_DIR  the state directory where the embedded stack is looked for "
        "(default <repo>/.mvsink)",
    ]
    return "\n".join(lines)


def config_env(config: Config) -> dict[str, str]:
    """Every setting of `config` as the `MVSINK_*` environment that loads it back (credentials
    included: for a child process's environment, never for a log)."""
    flat = {
        **{spec.name: getattr(config, spec.name, None) for spec in FIELDS},
        "frontiers_topic": config.topics.frontiers,
        "s3_endpoint": config.s3.endpoint, "s3_bucket": config.s3.bucket,
        "s3_region": config.s3.region, "s3_secure": config.s3.secure,
        "s3_access_key": config.s3.access_key.reveal(), "s3_secret_key": config.s3.secret_key.reveal(),
    }  # fmt: skip
    return {spec.env: str(flat[spec.name]).lower() if isinstance(flat[spec.name], bool)
            else str(flat[spec.name]) for spec in FIELDS}  # fmt: skip


def read_toml(path: Path, what: str = "config file") -> dict[str, Any]:
    """The TOML document at `path`; a `ConfigError` naming `what` and the path if it is missing,
    unreadable or not TOML."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as error:
        raise ConfigError(f"{what} {path} does not exist") from error
    except OSError as error:
        raise ConfigError(f"{what} {path}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{what} {path} is not valid TOML: {error}") from error


def _from_file(path: Path) -> dict[str, Any]:
    document = read_toml(path)
    known = {(f.section, f.key): f for f in FIELDS}
    values: dict[str, Any] = {}
    for section, table in document.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: top-level key {section!r} must be a table")
        for key, raw in table.items():
            spec = known.get((section, key))
            if spec is None:
                raise ConfigError(f"{path}: unknown setting [{section}] {key}")
            if spec.secret:
                raise ConfigError(
                    f"{path}: [{section}] {key} is a credential; set {spec.env} or "
                    f"{spec.env}_FILE instead of writing it into a config file"
                )
            values[spec.name] = _parse(spec, raw, f"{path} [{section}] {key}")
    return values


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for spec in FIELDS:
        if spec.secret and env.get(f"{spec.env}_FILE"):
            secret_path = Path(env[f"{spec.env}_FILE"])
            try:
                values[spec.name] = secret_path.read_text().strip()
            except OSError as error:
                raise ConfigError(f"{spec.env}_FILE={secret_path}: {error.strerror}") from error
        elif env.get(spec.env) is not None and env.get(spec.env) != "":
            values[spec.name] = _parse(spec, env[spec.env], spec.env)
    return values


def _parse(spec: FieldSpec, raw: Any, where: str) -> Any:
    try:
        return spec.parse(raw)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where}: {error}") from error


def _from_stack(env: Mapping[str, str]) -> dict[str, Any]:
    # Imported here: the stack module is only needed when no endpoints are configured.
    from mvsink.stack.state import running_endpoints

    return dict(running_endpoints(state_dir(env)))


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load and validate the configuration (see module docs for the sources and their order).

    Raises:
        ConfigError: naming the offending setting and where it came from.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = dict(DEFAULTS)
    values.update(_from_stack(env))
    file_path = path or env.get("MVSINK_CONFIG")
    if file_path:
        values.update(_from_file(Path(file_path)))
    values.update(_from_env(env))
    return _build(values)


def _build(values: Mapping[str, Any]) -> Config:
    sink_id = values["sink_id"]
    return Config(
        sink_id=sink_id,
        shard_id=values["shard_id"],
        partitions=values["partitions"],
        append_workers=values["append_workers"],
        partitioning=values["partitioning"],
        as_of=values["as_of"],
        read_only=values["read_only"],
        topics=Topics.for_sink(sink_id, values["frontiers_topic"]),
        kafka_bootstrap=values["kafka_bootstrap"],
        s3=S3Settings(
            endpoint=values["s3_endpoint"],
            bucket=values["s3_bucket"],
            region=values["s3_region"],
            access_key=Secret(values["s3_access_key"]),
            secret_key=Secret(values["s3_secret_key"]),
            secure=values["s3_secure"],
        ),
        spark_master=values["spark_master"],
        spark_residents=values["spark_residents"],
        row_schema=values["row_schema"],
        metrics_addr=values["metrics_addr"],
        metrics_port=values["metrics_port"],
        log_level=values["log_level"],
        writer_id=values["writer_id"],
        live_bound=values["live_bound"],
        ready_bound=values["ready_bound"],
        shard_max_attempt_age=values["shard_max_attempt_age"],
        shard_max_part_age=values["shard_max_part_age"],
        shard_min_grace=values["shard_min_grace"],
        shard_part_grace=values["shard_part_grace"],
        shard_version_grace=values["shard_version_grace"],
        shard_reader_lease=values["shard_reader_lease"],
        shard_request_timeout=values["shard_request_timeout"],
        retain_history=values["retain_history"],
        desired_retention_ms=values["desired_retention_ms"],
        desired_segment_ms=values["desired_segment_ms"],
        desired_trim_interval=values["desired_trim_interval"],
        compaction=values["compaction"],
        compaction_max_batches=values["compaction_max_batches"],
        compaction_max_amplification=values["compaction_max_amplification"],
        ct_task=values["ct_task"],
    )

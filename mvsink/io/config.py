"""One validated configuration for every mvsink process.

Sources, later ones winning:

1. built-in defaults;
2. endpoints the caller passes in (`load_config(endpoints=...)`): the `mvsink` command, the tools
   and the services' entry points pass the embedded stack's when `mvsink stack up` runs one under
   the state directory (`mvsink.stack.state.stack_config`), so `mvsink ...` just works after
   `mvsink stack up`; this loader discovers nothing itself;
3. a TOML file (`--config PATH` or `MVSINK_CONFIG`) with tables `[sink]`, `[kafka]`, `[s3]`,
   `[spark]`, `[shard]`, `[service]`, `[ct]`;
4. environment variables `MVSINK_*`.

Each setting is declared once, as one row: its `Config` field (`_row`: `[section] key`,
environment variable, default, parser, meaning, check), or for the settings `Config` groups, its
row of `GROUPED`. `SETTINGS` collects the rows; loading, `Config`'s checks, the shard's `Timing`
and `CompactionPolicy` of a configuration, `config_env`, the services' `--help`
(`settings_help`) and the settings tables of docs/operations.md (`settings_table`, the shard's
time bounds apart as advanced settings; `python -m mvsink.io.config --write` rewrites them) are
derived from them: adding a setting is adding its row. The variables that locate things
(`LOCATIONS`: the config file, the state and cache directories) are declared beside them.

Credentials come only from the environment or from secret files (`MVSINK_S3_ACCESS_KEY_FILE`,
`MVSINK_S3_SECRET_KEY_FILE`): a config file that holds them is refused, and they never appear in
`repr`, `str` or logs (`Secret`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mvsink.core.errors import ConfigError, ContractError
from mvsink.core.partitioning import KNOWN as KNOWN_PARTITIONINGS
from mvsink.core.settings import CompactionPolicy, S3Settings, Secret, Timing
from mvsink.core.updates import MAX_RECORD_BYTES
from mvsink.io import registry

__all__ = [
    "DEFAULTS",
    "FIELDS",
    "ID",
    "MEANINGS",
    "REPO_ROOT",
    "SETTINGS",
    "CompactionPolicy",
    "Config",
    "S3Settings",
    "Secret",
    "Setting",
    "Timing",
    "Topics",
    "cache_dir",
    "config_env",
    "load_config",
    "read_toml",
    "settings_help",
    "settings_table",
    "state_dir",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The shard library's own defaults are the configuration's.
_TIMING, _POLICY = Timing(), CompactionPolicy()
#: The fields of the shard's `Timing` and `CompactionPolicy`: the `[shard]` settings with these
#: keys build them (`Config.shard_timing`, `Config.compaction_policy`).
TIMING_KEYS = frozenset(field.name for field in dataclasses.fields(Timing))
POLICY_KEYS = frozenset(field.name for field in dataclasses.fields(CompactionPolicy))
#: A valid sink, shard or task id.
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


#: The variables that say where things are rather than what the sink is: the loader's and the
#: tools' own, beside the settings (`settings_help`, `settings_table`).
CONFIG_ENV, STATE_DIR_ENV, CACHE_DIR_ENV = "MVSINK_CONFIG", "MVSINK_STATE_DIR", "MVSINK_CACHE_DIR"
LOCATIONS: tuple[tuple[str, str], ...] = (
    (CONFIG_ENV, "the TOML file (as `--config`)"),
    (
        STATE_DIR_ENV,
        "the state directory: the embedded stack, logs, the venv (default `<repo>/.mvsink`)",
    ),
    (CACHE_DIR_ENV, "downloads and builds (default `<state dir>/cache`)"),
)


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """The project's ignored state directory (`MVSINK_STATE_DIR`, default `<repo>/.mvsink`)."""
    env = os.environ if env is None else env
    return Path(env.get(STATE_DIR_ENV) or REPO_ROOT / ".mvsink").resolve()


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where downloads and builds are cached (`MVSINK_CACHE_DIR`, default `<state dir>/cache`).

    Point several checkouts at one cache to build MinIO and fetch Kafka only once.
    """
    env = os.environ if env is None else env
    return Path(env.get(CACHE_DIR_ENV) or state_dir(env) / "cache").resolve()


@dataclass(frozen=True)
class Topics:
    """Topic names of one sink replica (docs/design.md §3.1)."""

    desired: str
    descs: str
    batches: str
    control: str
    frontiers: str
    dead_letter: str
    #: The sinks' definitions (`SinkDefinition`), one topic for all sinks of a deployment.
    sinks: str = "sinks"

    @classmethod
    def for_sink(cls, sink_id: str, frontiers: str = "frontiers", sinks: str = "sinks") -> Topics:
        """The default names `<sink>.desired`, `<sink>.descs`, ...; `frontiers` and `sinks` are
        shared."""
        return cls(
            desired=f"{sink_id}.desired",
            descs=f"{sink_id}.descs",
            batches=f"{sink_id}.batches",
            control=f"{sink_id}.control",
            frontiers=frontiers,
            dead_letter=f"{sink_id}.dead-letter",
            sinks=sinks,
        )


# -- the declarations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One setting, declared once: everything else about it is derived from this.

    Attributes:
        name: its name in the loaded values (and in `load_config`'s `endpoints`).
        section: its TOML table; `key`: its key in that table.
        env: its environment variable; a `secret` one also reads `<env>_FILE` and is refused in
            files.
        default: the value when no source sets it.
        parse: turns a TOML value or environment text into the value; raises `ValueError` or
            `TypeError` on a bad one.
        meaning: one line for `--help` and the docs; backticks mark code in the docs.
        check: the problem with a value (`ConfigError`'s message), or None; run by `Config`.
        attr: where `Config` holds it, `"s3.endpoint"` for a field of `Config.s3`; "" = `name`.
    """

    name: str
    section: str
    key: str
    env: str
    default: Any
    parse: Callable[[Any], Any]
    meaning: str
    check: Callable[[Setting, Any], str | None] | None = None
    attr: str = ""
    secret: bool = False

    @property
    def path(self) -> str:
        """The attribute path of its value in a `Config`."""
        return self.attr or self.name

    @property
    def advanced(self) -> bool:
        """A time bound of the shard (`Timing`): safety does not rest on it (fences do), and the
        docs list it apart, as an advanced setting."""
        return self.section == "shard" and self.key in TIMING_KEYS

    @property
    def summary(self) -> str:
        """`meaning` as plain text (`--help`)."""
        return self.meaning.replace("`", "")


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


def _valid_id(setting: Setting, value: str) -> str | None:
    return None if ID.match(value) else f"{setting.name}={value!r}: use 1-200 of [A-Za-z0-9_.-]"


def _at_least(bound: int, alias: str = "") -> Callable[[Setting, int], str | None]:
    def check(setting: Setting, value: int) -> str | None:
        if value >= bound:
            return None
        return f"{setting.name}{alias} must be >= {bound}, got {value}"

    return check


def _required(what: str) -> Callable[[Setting, str], str | None]:
    return lambda setting, value: None if value else f"{what} not set ({setting.env})"


def _partitioning(setting: Setting, value: int) -> str | None:
    if value in KNOWN_PARTITIONINGS:
        return None
    return f"{setting.name} must be one of {KNOWN_PARTITIONINGS}, got {value}"


#: What `[service] sinks` may say: serve the `[sink] id` sink, or every defined sink.
SERVE_SINKS = ("one", "all")


def _serve_sinks(setting: Setting, value: str) -> str | None:
    return None if value in SERVE_SINKS else f"{setting.name} {value!r}: use `one` or `all`"


def _port(setting: Setting, value: int) -> str | None:
    return None if 0 <= value <= 65535 else f"{setting.name} {value} is not a TCP port"


#: Seconds a write or append replica's group session lasts without a heartbeat
#: (`mvsink.io.kafka.ownership`), the least its poll bound may be.
GROUP_SESSION = 10.0
#: librdkafka's largest `max.poll.interval.ms`, in seconds.
MOST_POLL_INTERVAL = 86_400.0


def _poll_interval(setting: Setting, value: float) -> str | None:
    if GROUP_SESSION <= value <= MOST_POLL_INTERVAL:
        return None
    return (
        f"{setting.name} must be between the group session ({GROUP_SESSION:g} s) and "
        f"librdkafka's most ({MOST_POLL_INTERVAL:g} s), got {value:g}"
    )


def _positive(setting: Setting, value: float) -> str | None:
    return None if value > 0 else f"{setting.name} must be > 0, got {value}"


def _log_level(setting: Setting, value: str) -> str | None:
    if value.upper() in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        return None
    return f"{setting.name} {value!r}: use DEBUG, INFO, WARNING or ERROR"


def _row_schema(setting: Setting, value: str) -> str | None:
    if value:
        from mvsink.core.rows import parse_row_schema

        parse_row_schema(value)  # raises ConfigError naming the bad column
    return None


def _row(
    section: str,
    key: str,
    env: str,
    default: Any,
    parse: Callable[[Any], Any],
    meaning: str,
    check: Callable[[Setting, Any], str | None] | None = None,
) -> Any:
    """A `Config` field's default and its setting's declaration (`Setting`, named by the field)."""
    setting = Setting("", section, key, env, default, parse, meaning, check)
    return dataclasses.field(default=default, metadata={"setting": setting})


@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything a mint, write or append process (or a tool) needs: one field per setting, each
    declared once, as its row (`_row`: `[section] key`, environment, default, parser, meaning,
    check); `SETTINGS` and everything else about the settings are derived from these rows.

    `topics` and `s3` group the Kafka topic names and the S3 settings (their settings' rows in
    `GROUPED`). Checked on construction: each setting's `check`, then the bounds that tie
    settings together (the shard's `Timing` and `CompactionPolicy`, built from the rows whose
    `[shard]` keys name their fields).
    """

    topics: Topics
    s3: S3Settings
    # One setting per row, the meaning on its second line.
    # fmt: off
    # field: type                                  section    key                    environment                     default, parser
    sink_id: str                            = _row("sink",    "id",                  "MVSINK_SINK_ID",               "demo", str,
            "the sink replica's id: its topics are `<id>.desired`, `.descs`, `.batches`, `.control`, "
            "`.dead-letter`; 1-200 of `[A-Za-z0-9_.-]`", _valid_id)
    shard_id: str                           = _row("sink",    "shard_id",            "MVSINK_SHARD_ID",              "demo", str,
            "the shard (`shards/<id>/` in the bucket) the sink keeps equal to desired; same id rules",
            _valid_id)
    partitions: int                         = _row("sink",    "partitions",          "MVSINK_PARTITIONS",            4, _int,
            "P, desired partitions (of the `<sink>.desired` topic); >= 1", _at_least(1, " (P)"))
    append_workers: int                     = _row("sink",    "append_workers",      "MVSINK_APPEND_WORKERS",        2, _int,
            "A, append workers (partitions of the `<sink>.batches` topic); >= 1", _at_least(1, " (A)"))
    partitioning: int                       = _row("sink",    "partitioning",        "MVSINK_PARTITIONING",          2, _int,
            "the desired partitioning function (`mvsink.core.partitioning`, schemas/README.md): 2, the "
            "columnar hash; 1, BLAKE2b of the Avro row, for desired topics written before 2 existed. "
            "Producers and write services of a sink must agree; write tasks quarantine records hashed "
            "otherwise", _partitioning)
    as_of: int                              = _row("sink",    "as_of",               "MVSINK_AS_OF",                 0, _int,
            "the first time the sink writes: mint's and write's initial persist frontier; desired updates before it are advanced to it, and append moves a shard upper before it there first; >= 0", _at_least(0))
    read_only: bool                         = _row("sink",    "read_only",           "MVSINK_READ_ONLY",             False, _bool,
            "start read-only: fold and hold a lease, write nothing until promoted "
            "(docs/operations.md §3)")
    row_schema: str                         = _row("sink",    "row_schema",          "MVSINK_ROW_SCHEMA",            "", str,
            'the row schema, `"name type[ not null], ..."`; provisioning creates the shard with it; '
            "empty: the shard's", _row_schema)
    retain_history: int                     = _row("sink",    "retain_history",      "MVSINK_RETAIN_HISTORY",        0, _int,
            "times (not seconds) of history the shard keeps: `since` trails the upper by this (or a "
            "reader lease); >= 0", _at_least(0))
    max_record_bytes: int                   = _row("sink",    "max_record_bytes",    "MVSINK_MAX_RECORD_BYTES",      MAX_RECORD_BYTES, _int,
            "the most bytes one desired record may decode to; a larger one is dead-lettered with "
            "its size, checked before it is decompressed (Arrow IPC); >= 1", _at_least(1))
    desired_trim_interval: float            = _row("sink",   "trim_interval",       "MVSINK_DESIRED_TRIM_INTERVAL", 30.0, float,
            "s, how often the write service deletes the desired records below its partitions' older "
            "kept checkpoint (0: never)")
    kafka_bootstrap: str                    = _row("kafka",   "bootstrap_servers",   "MVSINK_KAFKA_BOOTSTRAP",       "", str,
            "Kafka bootstrap servers, `host:port,...`; required (the embedded stack's when it runs)",
            _required("kafka bootstrap servers"))
    schema_registry_url: str                = _row("kafka",   "schema_registry_url", "MVSINK_SCHEMA_REGISTRY_URL",   "", str,
            "a Confluent-compatible Schema Registry (`http://host:port[/path]`): every record mvsink "
            "writes then uses its wire format, schemas registered at provisioning (empty: mvsink's "
            "own framing; both are read)")
    desired_retention_ms: int               = _row("kafka",   "desired_retention_ms", "MVSINK_DESIRED_RETENTION_MS", -1, _int,
            "`retention.ms` provisioning sets on `<sink>.desired`, also on an existing topic (-1: the "
            "broker deletes nothing; the write service trims it)")
    desired_segment_ms: int                 = _row("kafka",   "desired_segment_ms",  "MVSINK_DESIRED_SEGMENT_MS",    3_600_000, _int,
            "`segment.ms` provisioning sets on `<sink>.desired`: trimmed records leave the broker's "
            "disk only with their whole segment")
    topic_check_interval: float             = _row("kafka",   "topic_check_interval", "MVSINK_TOPIC_CHECK_INTERVAL", 30.0, float,
            "s, how often the write service checks `<sink>.desired`'s configuration (a compacted "
            "topic is refused: nothing folded or staged while it is), and every service whether "
            "its sink was dropped (it stops then); > 0", _positive)
    max_poll_interval: float                = _row("kafka",   "max_poll_interval",   "MVSINK_KAFKA_MAX_POLL_INTERVAL", MOST_POLL_INTERVAL, float,
            "s, how long a write or append replica may go without polling its group (a write step "
            "runs between two polls: a hydration, a repair) before Kafka moves its partitions to the "
            "other replicas (librdkafka's `max.poll.interval.ms`); between 10 and 86400",
            _poll_interval)
    kafka_call_timeout: float               = _row("kafka",   "call_timeout",        "MVSINK_KAFKA_CALL_TIMEOUT",    60.0, float,
            "s, how long an upstream producer (`DesiredProducer`, `publish_dataframe`'s tasks, "
            "`mvsink view`) waits on one Kafka call (a transaction's start or commit, a flush, a read "
            "to the end) before the attempt fails; > 0", _positive)
    spark_master: str                       = _row("spark",   "master",              "MVSINK_SPARK_MASTER",          "local[*]", str,
            "the write service's Spark master URL (docs/operations.md §2)")
    spark_driver_host: str                  = _row("spark",   "driver_host",         "MVSINK_SPARK_DRIVER_HOST",     "127.0.0.1", str,
            "where executors reach this driver (`spark.driver.host`) and the write service's resident "
            "tasks connect back to: an address of this host the executors reach; `auto`: the "
            "hostname (docs/operations.md §2)")
    spark_residents: bool                   = _row("spark",   "residents",           "MVSINK_SPARK_RESIDENTS",       True, _bool,
            "whether write runs its steps in long-lived Spark tasks that connect back to the "
            "driver's host on a random TCP port; `false` where executors cannot (a Spark job per "
            "step)")
    spark_cores_max: int                    = _row("spark",   "cores_max",           "MVSINK_SPARK_CORES_MAX",       0, _int,
            "the most cores each mvsink Spark application takes of a standalone cluster "
            "(`spark.cores.max`); 0: the master's `spark.deploy.defaultCores` (docs/operations.md "
            "§2); >= 0", _at_least(0))
    spark_pack_env: bool                    = _row("spark",   "pack_env",            "MVSINK_SPARK_PACK_ENV",        False, _bool,
            "on a cluster, ship the libraries of this virtualenv to the executors, packed with "
            "venv-pack (`spark.archives`), so the workers' Python needs none of them "
            "(docs/operations.md §2)")
    spark_driver_java_options: str          = _row("spark",   "driver_java_options", "MVSINK_SPARK_DRIVER_JAVA_OPTIONS", "", str,
            "extra JVM options of each mvsink Spark driver (`spark.driver.extraJavaOptions`), e.g. "
            "`-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m` for drivers that live minutes "
            "(C1 only: about half the JVM's CPU in its first minute, slower hot loops after; C1 alone "
            "reserves a 48 MiB code cache, full in a large job); Spark's class archive is mapped "
            "either way (`mvsink.io.spark_classes`)")
    serve_sinks: str                        = _row("service", "sinks",               "MVSINK_SERVICE_SINKS",         "one", str,
            "`one`: serve the `[sink] id` sink; `all`: serve every sink defined "
            "on the sinks topic, picking sinks up and letting them go while running "
            "(docs/operations.md, \"Many sinks in one deployment\")", _serve_sinks)
    metrics_addr: str                       = _row("service", "metrics_addr",        "MVSINK_METRICS_ADDR",          "127.0.0.1", str,
            "address of the Prometheus endpoint")
    metrics_port: int                       = _row("service", "metrics_port",        "MVSINK_METRICS_PORT",          0, _int,
            "port of the Prometheus endpoint; 0 picks a free one (logged)", _port)
    log_level: str                          = _row("service", "log_level",           "MVSINK_LOG_LEVEL",             "INFO", str,
            "`DEBUG` (traces every frontier), `INFO`, `WARNING` or `ERROR`", _log_level)
    writer_id: str                          = _row("service", "writer_id",           "MVSINK_WRITER_ID",             "", str,
            "this process's id in part keys, reader leases and logs, without `/`; empty: "
            "`<service>-<host>-<pid>`; only the write service reads it")
    live_bound: float                       = _row("service", "live_bound",          "MVSINK_LIVE_BOUND",            300.0, float,
            "s, `/healthz` fails when the service loop has been silent this long; > 0", _positive)
    ready_bound: float                      = _row("service", "ready_bound",         "MVSINK_READY_BOUND",           30.0, float,
            "s, `/readyz` fails when the frontier is behind its target and unmoved this long; > 0",
            _positive)
    shard_max_attempt_age: float            = _row("shard",  "max_attempt_age",     "MVSINK_SHARD_MAX_ATTEMPT_AGE", _TIMING.max_attempt_age, float,
            "s, a compare-and-set writes version n+1 at most this long after reading n")
    shard_max_part_age: float               = _row("shard",   "max_part_age",        "MVSINK_SHARD_MAX_PART_AGE",    _TIMING.max_part_age, float,
            "s, appends and merges refuse parts staged longer ago than this (`PartTooOld`)")
    shard_min_grace: float                  = _row("shard",   "min_grace",           "MVSINK_SHARD_MIN_GRACE",       _TIMING.min_grace, float,
            "s, the sweeper deletes never-referenced parts only older than this, and sweeps this "
            "often; > max_part_age + max_attempt_age")
    shard_part_grace: float                 = _row("shard",   "part_grace",          "MVSINK_SHARD_PART_GRACE",      _TIMING.part_grace, float,
            "s, parts a merge replaced are deleted this long after the merge; <= version_grace")
    shard_version_grace: float              = _row("shard",   "version_grace",       "MVSINK_SHARD_VERSION_GRACE",   _TIMING.version_grace, float,
            "s, superseded state versions are pruned this long after; > max_attempt_age + "
            "request_timeout")
    shard_reader_lease: float               = _row("shard",   "reader_lease",        "MVSINK_SHARD_READER_LEASE",    _TIMING.reader_lease, float,
            "s, a reader lease not renewed for this long expires")
    shard_request_timeout: float            = _row("shard",  "request_timeout",     "MVSINK_SHARD_REQUEST_TIMEOUT", _TIMING.request_timeout, float,
            "s, the read timeout of a conditional create on S3")
    compaction: bool                        = _row("shard",   "compaction",          "MVSINK_SHARD_COMPACTION",      True, _bool,
            "whether the write service merges the shard's batches (its garbage is collected "
            "either way, by read-only replicas too)")
    compaction_max_batches: int             = _row("shard", "max_batches",         "MVSINK_SHARD_MAX_BATCHES",     _POLICY.max_batches, _int,
            "merge when the shard has more live batches than this; >= 2")
    compaction_max_amplification: float     = _row("shard", "max_amplification", "MVSINK_SHARD_MAX_AMPLIFICATION", _POLICY.max_amplification, float,
            "merge the batches `since` has passed once the newer of them hold this many times the "
            "oldest one's updates; > 0")
    ct_task: str                            = _row("ct",      "task",                "MVSINK_CT_TASK",               "", str,
            "the continual task's definition file (`python -m services.ct`, "
            "`mvsink.io.ct_definition`)")
    # fmt: on

    def shard_timing(self) -> Timing:
        """The shard library's `Timing` of this configuration (the `[shard]` settings whose keys
        are its fields)."""
        return Timing(**_part_of(self, TIMING_KEYS))

    def compaction_policy(self) -> CompactionPolicy:
        """The merge policy of this configuration (the `[shard]` settings whose keys are its
        fields)."""
        return CompactionPolicy(**_part_of(self, POLICY_KEYS))

    def framing(self) -> registry.Framing:
        """How a process of this configuration frames records and looks schema ids up
        (`mvsink.io.registry.framing`: a new registry client each call, so call it once)."""
        return registry.framing(self.schema_registry_url)

    def __post_init__(self) -> None:
        for setting in SETTINGS:
            problem = setting.check and setting.check(setting, _value(self, setting))
            if problem:
                raise ConfigError(problem)
        try:
            self.shard_timing()
        except ContractError as error:
            raise ConfigError(f"shard timing: {error}") from error
        try:
            self.compaction_policy()
        except ContractError as error:
            raise ConfigError(f"compaction: {error}") from error


# The rows of the settings `Config` holds in `topics` and `s3`.
# fmt: off
GROUPED: tuple[Setting, ...] = (
    Setting("frontiers_topic",      "kafka",   "frontiers_topic",     "MVSINK_FRONTIERS_TOPIC",       "frontiers", str,
            "the compacted topic of desired progress and shard uppers (one for all sinks)",
            attr="topics.frontiers"),
    Setting("sinks_topic",          "kafka",   "sinks_topic",         "MVSINK_SINKS_TOPIC",           "sinks", str,
            "the compacted topic of sink definitions (one for all sinks; `mvsink sink list`)",
            attr="topics.sinks"),
    Setting("s3_endpoint",          "s3",      "endpoint",            "MVSINK_S3_ENDPOINT",           "", str,
            "S3 endpoint, `host:port`; required (the embedded stack's when it runs)",
            _required("S3 endpoint"), attr="s3.endpoint"),
    Setting("s3_bucket",            "s3",      "bucket",              "MVSINK_S3_BUCKET",             "mvsink", str,
            "S3 bucket of shards and write checkpoints", attr="s3.bucket"),
    Setting("s3_region",            "s3",      "region",              "MVSINK_S3_REGION",             "us-east-1", str,
            "S3 region", attr="s3.region"),
    Setting("s3_secure",            "s3",      "secure",              "MVSINK_S3_SECURE",             False, _bool,
            "use TLS to reach S3", attr="s3.secure"),
    Setting("s3_access_key",        "s3",      "access_key",          "MVSINK_S3_ACCESS_KEY",         "", str,
            "S3 access key: environment or `<VAR>_FILE` only, refused in files (the embedded "
            "stack's when it runs)", attr="s3.access_key", secret=True),
    Setting("s3_secret_key",        "s3",      "secret_key",          "MVSINK_S3_SECRET_KEY",         "", str,
            "S3 secret key: environment or `<VAR>_FILE` only, refused in files (the embedded "
            "stack's when it runs)", attr="s3.secret_key", secret=True),
)
# fmt: on

#: The sections in the order the docs and `--help` list them.
SECTIONS = ("sink", "kafka", "s3", "spark", "service", "shard", "ct")
#: Every setting: `Config`'s rows, then `GROUPED`, by section.
SETTINGS: tuple[Setting, ...] = tuple(
    sorted(
        (
            *(
                dataclasses.replace(field.metadata["setting"], name=field.name)
                for field in dataclasses.fields(Config)
                if "setting" in field.metadata
            ),
            *GROUPED,
        ),
        key=lambda setting: SECTIONS.index(setting.section),
    )
)
_BY_NAME = {setting.name: setting for setting in SETTINGS}
#: Views of `SETTINGS` by setting name, for callers that look one thing up.
FIELDS = SETTINGS
DEFAULTS: Mapping[str, Any] = {setting.name: setting.default for setting in SETTINGS}
MEANINGS: Mapping[str, str] = {setting.name: setting.summary for setting in SETTINGS}


def _part_of(config: Config, keys: frozenset[str]) -> dict[str, Any]:
    """The values of `config`'s `[shard]` settings whose keys are in `keys`, by key."""
    return {
        setting.key: _value(config, setting)
        for setting in SETTINGS
        if setting.section == "shard" and setting.key in keys
    }


def _value(config: Config, setting: Setting) -> Any:
    """The value of `setting` in `config` (a `Secret` for a credential)."""
    value: Any = config
    for attr in setting.path.split("."):
        value = getattr(value, attr)
    return value


def _build(values: Mapping[str, Any]) -> Config:
    """The `Config` of loaded values (one per setting name), each put where `Setting.path` says."""
    fields: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {"topics": {}, "s3": {}}
    for setting in SETTINGS:
        value = Secret(values[setting.name]) if setting.secret else values[setting.name]
        group, _, attr = setting.path.rpartition(".")
        (groups[group] if group else fields)[attr] = value
    topics = Topics.for_sink(values["sink_id"], **groups["topics"])
    return Config(**fields, topics=topics, s3=S3Settings(**groups["s3"]))


# -- rendering -------------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_help() -> str:
    """Every setting: its TOML key, its environment variable, its default and meaning; with
    the sources and their order (a service's `--help`)."""
    rows = [
        (
            f"[{setting.section}] {setting.key}",
            f"{setting.env}[_FILE]" if setting.secret else setting.env,
            "(none)" if setting.default == "" else _shown(setting.default),
            setting.summary,
        )
        for setting in SETTINGS
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    header = ("TOML key", "environment", "default", "meaning")
    lines = [
        "settings (later sources win: defaults; the endpoints and credentials of the embedded",
        "stack when `mvsink stack up` runs one under MVSINK_STATE_DIR; the TOML file of --config",
        "or MVSINK_CONFIG; the MVSINK_* environment). Credentials are refused in files.",
        "",
    ]
    lines += [
        f"  {key:<{widths[0]}}  {env:<{widths[1]}}  {default:<{widths[2]}}  {meaning}"
        for key, env, default, meaning in (header, *rows)
    ]
    lines += ["", *(f"  {env:<17} {meaning.replace('`', '')}" for env, meaning in LOCATIONS)]
    return "\n".join(lines)


def settings_table() -> str:
    """Every setting as markdown tables of `[section] key`, environment, default, meaning: the
    settings, then the advanced ones (`Setting.advanced`, the shard's time bounds) apart (the
    tables of docs/operations.md §1, `SETTINGS_DOCS`)."""
    header = ["| setting | environment | default | meaning |", "| --- | --- | --- | --- |"]
    tables: dict[bool, list[str]] = {False: list(header), True: list(header)}
    for setting in SETTINGS:
        env = f"`{setting.env}`, `{setting.env}_FILE`" if setting.secret else f"`{setting.env}`"
        default = "empty" if setting.default == "" else f"`{_shown(setting.default)}`"
        meaning = setting.meaning.replace("|", "\\|")
        tables[setting.advanced].append(
            f"| `[{setting.section}] {setting.key}` | {env} | {default} | {meaning} |"
        )
    locations = [f"* `{env}`: {meaning}" for env, meaning in LOCATIONS]
    return "\n".join(
        [*tables[False], "", *locations, "", ADVANCED_INTRO, "", *tables[True]]
        if len(tables[True]) > 2
        else tables[False]
    )


#: The paragraph before the advanced settings' table.
ADVANCED_INTRO = (
    "Advanced: the shard's time bounds (`mvsink.core.settings.Timing`), when something is worth "
    "deleting: safety rests on the fences in the shard's state, not on these (docs/design.md "
    '§4.4 "Fences").'
)


#: The documents that hold `settings_table()`, between `SETTINGS_MARKERS`.
SETTINGS_DOCS = ("docs/operations.md",)
SETTINGS_MARKERS = ("<!-- settings:begin -->", "<!-- settings:end -->")


def with_settings_table(text: str) -> str:
    """`text` with the lines between `SETTINGS_MARKERS` replaced by `settings_table()`.

    Raises:
        ConfigError: `text` does not hold the markers, begin before end.
    """
    begin, end = SETTINGS_MARKERS
    head, found_begin, rest = text.partition(f"{begin}\n")
    _, found_end, tail = rest.partition(end)
    if not (found_begin and found_end):
        raise ConfigError(f"no {begin} ... {end} region")
    return f"{head}{begin}\n{settings_table()}\n{end}{tail}"


def config_env(config: Config) -> dict[str, str]:
    """Every setting of `config` as the `MVSINK_*` environment that loads it back (credentials
    included: for a child process's environment, never for a log)."""
    env = {}
    for setting in SETTINGS:
        value = _value(config, setting)
        env[setting.env] = _shown(value.reveal() if isinstance(value, Secret) else value)
    return env


# -- loading ---------------------------------------------------------------------------------------


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
    known = {(setting.section, setting.key): setting for setting in SETTINGS}
    values: dict[str, Any] = {}
    for section, table in document.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: top-level key {section!r} must be a table")
        for key, raw in table.items():
            setting = known.get((section, key))
            if setting is None:
                raise ConfigError(f"{path}: unknown setting [{section}] {key}")
            if setting.secret:
                raise ConfigError(
                    f"{path}: [{section}] {key} is a credential; set {setting.env} or "
                    f"{setting.env}_FILE instead of writing it into a config file"
                )
            values[setting.name] = _parse(setting, raw, f"{path} [{section}] {key}")
    return values


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        if setting.secret and env.get(f"{setting.env}_FILE"):
            secret_path = Path(env[f"{setting.env}_FILE"])
            try:
                values[setting.name] = secret_path.read_text().strip()
            except OSError as error:
                raise ConfigError(f"{setting.env}_FILE={secret_path}: {error.strerror}") from error
        elif env.get(setting.env) is not None and env.get(setting.env) != "":
            values[setting.name] = _parse(setting, env[setting.env], setting.env)
    return values


def spelled(name: str) -> str:
    """How an error names setting `name`: its TOML key and its environment variable."""
    setting = _BY_NAME[name]
    return f"[{setting.section}] {setting.key} ({setting.env})"


def env_setting(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The value that setting `name`'s environment variable gives (`os.environ` unless `env`),
    parsed and checked as `load_config` does, else its default: for code that reads one setting
    where no `Config` is passed in.

    Raises:
        ConfigError: the variable's value does not parse.
    """
    setting = _BY_NAME[name]
    raw = (os.environ if env is None else env).get(setting.env, "")
    return _parse(setting, raw, setting.env) if raw else setting.default


def _parse(setting: Setting, raw: Any, where: str) -> Any:
    try:
        return setting.parse(raw)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where}: {error}") from error


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    endpoints: Mapping[str, Any] | None = None,
) -> Config:
    """Load and validate the configuration (see module docs for the sources and their order).

    Args:
        path: the TOML file (else `MVSINK_CONFIG`, else none).
        env: the environment (`os.environ` unless given).
        endpoints: values by setting name above the defaults and below the file (the embedded
            stack's endpoints and credentials, `mvsink.stack.state.stack_config`).

    Raises:
        ConfigError: naming the offending setting and where it came from.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = dict(DEFAULTS)
    unknown = set(endpoints or {}) - set(_BY_NAME)
    if unknown:
        raise ConfigError(f"unknown endpoint settings {sorted(unknown)}")
    values.update(endpoints or {})
    file_path = path or env.get(CONFIG_ENV)
    if file_path:
        values.update(_from_file(Path(file_path)))
    values.update(_from_env(env))
    return _build(values)


def main(argv: list[str]) -> int:
    """`python -m mvsink.io.config`: print `settings_table()`; with `--write`, rewrite it into
    `SETTINGS_DOCS` instead."""
    if argv not in ([], ["--write"]):
        print("usage: python -m mvsink.io.config [--write]", file=sys.stderr)
        return 2
    if not argv:
        print(settings_table())
        return 0
    for name in SETTINGS_DOCS:
        doc = REPO_ROOT / name
        text = doc.read_text()
        if with_settings_table(text) != text:
            doc.write_text(with_settings_table(text))
            print(f"rewrote the settings table of {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The `mvsink` command line.

    mvsink stack up|down|status|env   the embedded Kafka + MinIO on loopback
    mvsink provision                  create the configured sink's topics and bucket
    mvsink demo                       stack up, provision, smoke demo of every topic and of
                                      the conditional writes

Every command reads the configuration of `mvsink.config` (`--config FILE`, `MVSINK_*`, and the
running embedded stack). Errors are printed as one clear line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

from mvsink.config import Config, cache_dir, load_config, state_dir
from mvsink.errors import MvsinkError
from mvsink.stack.manager import Stack
from mvsink.stack.state import stack_home


def say(message: str) -> None:
    """Progress output: stderr, flushed, timestamped."""
    # One write per line, so lines from parallel steps (builds) never interleave.
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def _stack() -> Stack:
    return Stack(stack_home(state_dir()), cache_dir(), say)


def cmd_stack_up(args: argparse.Namespace) -> int:
    endpoints = _stack().up(timeout=args.timeout)
    if not args.no_provision:
        _provision(load_config(args.config))
    cmd_stack_status(args)
    print(
        f"\nkafka bootstrap: {endpoints.kafka_bootstrap}\ns3 endpoint:     http://{endpoints.s3_endpoint}"
    )
    return 0


def cmd_stack_down(args: argparse.Namespace) -> int:
    stopped = _stack().down()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_stack_status(args: argparse.Namespace) -> int:
    print(f"{'component':<10} {'state':<14} {'address':<22} {'pid':>8}  log")
    for row in _stack().status():
        pid = str(row.pid) if row.pid else "-"
        print(f"{row.name:<10} {row.state:<14} {row.address:<22} {pid:>8}  {row.log}")
    print(f"{'spark':<10} {'in-process':<14} {'local[*] (default)':<22} {'-':>8}  -")
    return 0


def cmd_stack_env(args: argparse.Namespace) -> int:
    home = stack_home(state_dir())
    rows = {row.name: row for row in _stack().status()}
    if any(rows[n].state != "running" for n in ("kafka", "minio")):
        raise MvsinkError("the embedded stack is not running: run `mvsink stack up` first")
    print(f"export MVSINK_KAFKA_BOOTSTRAP={rows['kafka'].address}")
    print(f"export MVSINK_S3_ENDPOINT={rows['minio'].address}")
    print(f"export MVSINK_S3_ACCESS_KEY_FILE={home / 'credentials' / 's3-access-key'}")
    print(f"export MVSINK_S3_SECRET_KEY_FILE={home / 'credentials' / 's3-secret-key'}")
    return 0


def _provision(config: Config) -> None:
    from mvsink.provision import provision

    result = provision(config)
    created = ", ".join(result.topics_created) or "none (all existed)"
    say(f"sink {config.sink_id}: topics created: {created}; "
        f"bucket {config.s3.bucket}: {'created' if result.bucket_created else 'exists'}")  # fmt: skip


def cmd_provision(args: argparse.Namespace) -> int:
    _provision(load_config(args.config))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from mvsink.smoke import run_smoke

    _stack().up(timeout=args.timeout)
    config = load_config(args.config)
    _provision(config)
    run_smoke(config, say)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used by tests to check compose commands are real)."""
    parser = argparse.ArgumentParser(prog="mvsink", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML config file (default: $MVSINK_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    stack = commands.add_parser("stack", help="embedded Kafka + MinIO on loopback")
    stack_commands = stack.add_subparsers(dest="stack_command", required=True, metavar="ACTION")
    up = stack_commands.add_parser("up", help="build what is missing, start, provision")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait per component")
    up.add_argument("--no-provision", action="store_true", help="do not create sink topics")
    up.set_defaults(func=cmd_stack_up)
    stack_commands.add_parser("down", help="stop what `up` started").set_defaults(
        func=cmd_stack_down
    )
    stack_commands.add_parser("status", help="components, addresses, pids").set_defaults(
        func=cmd_stack_status
    )
    stack_commands.add_parser("env", help="print MVSINK_* exports for the stack").set_defaults(
        func=cmd_stack_env
    )

    commands.add_parser("provision", help="create the sink's topics and bucket").set_defaults(
        func=cmd_provision
    )
    demo = commands.add_parser("demo", help="stack up + smoke demo of every topic and of CAS")
    demo.add_argument("--timeout", type=float, default=180.0)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mvsink` console script."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except MvsinkError as error:
        print(f"mvsink: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

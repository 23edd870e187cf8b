"""What the command groups share: progress output, the embedded stack, the demos' arguments.

The group modules import this, never the package's `__init__` (which imports them).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

from mvsink.io.config import cache_dir, state_dir
from mvsink.io.service import say
from mvsink.stack.manager import Stack
from mvsink.stack.state import stack_config, stack_home

if TYPE_CHECKING:
    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
    """The `mvsink` parser's subcommands, which each group module adds to."""


def embedded_stack() -> Stack:
    """The embedded Kafka + MinIO (+ Spark) of this user's state directory."""
    return Stack(stack_home(state_dir()), cache_dir(), say)


def demo_arguments(
    parser: argparse.ArgumentParser,
    func: Callable[[argparse.Namespace], int],
    ticks: int,
    orders: int,
    orders_help: str,
) -> None:
    """The arguments of a demo command (`demo`, `ct demo`), which `demo_on_stack` reads."""
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--ticks", type=int, default=ticks, help="ticks of order events")
    parser.add_argument("--orders", type=int, default=orders, help=orders_help)
    parser.add_argument("--no-stack", action="store_true", help="use configured endpoints")
    parser.set_defaults(func=func)


def demo_on_stack(args: argparse.Namespace, run: Callable[..., None]) -> int:
    """Bring the stack up unless `--no-stack`, then run a demo with `--ticks` and `--orders`."""
    if not args.no_stack:
        embedded_stack().up(timeout=args.timeout)
    run(stack_config(args.config), say, ticks=args.ticks, orders=args.orders)
    return 0

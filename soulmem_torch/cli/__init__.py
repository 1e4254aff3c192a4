"""``soulmem``: the command line of soulmem_torch.

Commands (``soulmem COMMAND --help`` for every flag)::

    soulmem demo   [--days N] [--top N] [--window N] [--show N] [--device D]
    soulmem query  STORE [TEXT ...] [--file Q] [--config C] [--top N] [--all] [--json]
                   [--device D]
    soulmem add    STORE (--semantic T | --situation N | --action T | --notes FILE|-) [...]
                   [--names NAMES]
    soulmem import FILE [STORE | --store STORE] [--format auto|serde|graph] [--replace]
                   [--names NAMES]
    soulmem export STORE FILE [--format serde|graph] [--names NAMES]
    soulmem eval   SUITE.json [--graph PATH] [--config C] [--cases] [--json] [--ablation]
                   [--device D]
    soulmem forget STORE (--now TIME | --days N) (--llm MOD:FUNC | --fake | --mask-only)
                   [--concurrency N] [--timeout S] [--dry-run | --write] [--show N] [--json]
    soulmem consolidate STORE (--llm MOD:FUNC | --fake) [--summary TEXT|@FILE] [--top-k N]
                   [--link-with-llm] [--timeout S] [--json]
    soulmem versions STORE [--json]
    soulmem restore  STORE VERSION
    soulmem serve  BANK_DIR [--host H] [--port P] [--device D] [--config C]
                   [--idle-after S] [--idle-interval S]

STORE is a store directory (:class:`~soulmem_torch.store.MemoryStore`); ``query`` and ``export``
also accept a notes file (serde JSON / JSON Lines, or an evaluation graph) in its place.

Exit status: 0 success; 1 a runtime error (missing or corrupt file, invalid config, failing
LLM, …); 2 a malformed command line; 130 interrupted. Every error is one line on stderr,
``soulmem COMMAND: error: …``; ``--debug`` re-raises it with its traceback instead.

Layout: one module per command (``demo.py``, ``query.py``, ``import_.py``, …), each with
``cmd_<name>(args) -> int`` and ``add_parser(sub)``; shared helpers live in the ``_*.py``
modules (``_errors``: :class:`CLIError` and exit statuses, ``_args``: argument types and the
``common_parent()`` / ``device_parent()`` / ``config_parent()`` option groups, ``_output``:
terminal output, ``_memory``: devices, configs, notes files and stores, ``_forgetting``: the
forgetting report, ``_llm``: ``--llm MODULE:FUNCTION``).

Adding a command: write ``soulmem_torch/cli/<name>.py`` with

.. code-block:: python

    def cmd_hello(args: argparse.Namespace) -> int:
        ...  # raise CLIError("one line", EXIT_USAGE or EXIT_RUNTIME) on bad input
        return EXIT_OK

    def add_parser(sub) -> None:
        p = sub.add_parser("hello", parents=[common_parent()], help="...", description="...")
        p.add_argument(...)
        p.set_defaults(func=cmd_hello)

and add the module to :data:`COMMANDS` below (one line; the order is the ``--help`` order).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from soulmem_torch.cli import (
    add,
    consolidate,
    demo,
    export,
    forget,
    import_,
    import_chat,
    query,
    restore,
    schema,
    versions,
)
from soulmem_torch.cli import eval as eval_
from soulmem_torch.cli import serve as serve_
from soulmem_torch.cli._errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    PROG,
    CLIError,
    _describe_exception,
    _one_line,
    _Parser,
    _UsageError,
)
from soulmem_torch.cli.add import cmd_add
from soulmem_torch.cli.demo import cmd_demo
from soulmem_torch.cli.eval import cmd_eval
from soulmem_torch.cli.export import cmd_export
from soulmem_torch.cli.forget import cmd_forget
from soulmem_torch.cli.import_ import cmd_import
from soulmem_torch.cli.query import cmd_query
from soulmem_torch.cli.schema import cmd_schema

__all__ = [
    "COMMANDS",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "CLIError",
    "build_parser",
    "cmd_add",
    "cmd_demo",
    "cmd_eval",
    "cmd_export",
    "cmd_forget",
    "cmd_import",
    "cmd_query",
    "cmd_schema",
    "main",
]

#: The command modules, in ``--help`` order; each has ``add_parser(sub)``.
COMMANDS = [
    demo, query, add, import_, import_chat, export, schema, eval_, forget, consolidate,
    versions, restore, serve_,
]  # fmt: skip

_EPILOG = """\
exit status: 0 ok, 1 runtime error (missing/corrupt file, bad config, failing LLM, ...),
2 malformed command line, 130 interrupted. Errors are one line on stderr; --debug shows
the traceback instead.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``soulmem`` argument parser (errors raise instead of exiting)."""
    from soulmem_torch import __version__

    parser = _Parser(
        prog=PROG,
        description="SoulMem agent memory on PyTorch: import notes, ask questions, evaluate "
        "retrieval suites and run forgetting.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="re-raise errors with tracebacks")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


# -------------------------------------------------------------------------------------------
# entry point
# -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _utf8_stdio() -> Iterator[None]:
    """Chinese text must not crash on a non-UTF-8 console: replace what cannot be encoded."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="replace")  # type: ignore[union-attr]
    yield


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns the exit status (never raises, except with ``--debug``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with _utf8_stdio():
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except _UsageError as exc:
            print(
                f"{exc.prog}: error: {_one_line(str(exc))} (see '{exc.prog} --help')",
                file=sys.stderr,
            )
            return EXIT_USAGE
        except SystemExit as exc:  # --help / --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        prog = f"{PROG} {args.command}"
        try:
            return int(args.func(args) or EXIT_OK)
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:  # e.g. `soulmem export STORE - | head`
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK
        except Exception as exc:
            if getattr(args, "debug", False):
                raise
            message, code = _describe_exception(exc)
            print(f"{prog}: error: {_one_line(message)}", file=sys.stderr)
            return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

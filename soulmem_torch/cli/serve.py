"""``soulmem serve``: the HTTP JSON API of a memory bank (many agents)."""

from __future__ import annotations

import argparse
from typing import Any

from soulmem_torch.cli._args import common_parent, config_parent, device_parent
from soulmem_torch.cli._errors import EXIT_OK, CLIError
from soulmem_torch.cli._store import embedder_parent


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, found {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535], found {value}")
    return value


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, found {text!r}") from None
        if value < (1 if kind is int else 0):
            raise argparse.ArgumentTypeError(f"expected a value >= {1 if kind is int else 0}")
        return value

    return parse


def cmd_serve(args: argparse.Namespace) -> int:
    """Serves BANK_DIR over HTTP until interrupted."""
    from soulmem_torch.cli._memory import _load_pipeline_config

    try:
        from soulmem_torch.bank.serve import run_server
    except ImportError as exc:  # pragma: no cover
        raise CLIError(f"cannot import the server ({exc})") from None
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise CLIError(
            "soulmem serve needs the 'serve' extra: pip install 'soulmem_torch[serve]'"
        ) from None
    config = _load_pipeline_config(args.config)
    idle_llm = None
    if args.idle_llm == "fake":
        from soulmem_torch.forget import FakeLLM

        idle_llm = FakeLLM()
    elif args.idle_llm is not None:
        from soulmem_torch.cli._llm import _load_llm

        idle_llm = _load_llm(args.idle_llm)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from soulmem_torch.bank.serve import ServerLimits
    from soulmem_torch.errors import SoulMemError

    try:
        limits = ServerLimits(
            max_body_bytes=args.max_body_bytes, max_text_chars=args.max_text_chars,
            max_batch=args.max_notes, max_agents=args.max_agents,
            idle_timeout_s=args.idle_timeout, max_connections=args.max_connections,
        )  # fmt: skip
    except SoulMemError as exc:
        raise CLIError(str(exc)) from None
    embedder = _bank_embedder(args)

    def announce(host: str, port: int) -> None:
        if not getattr(args, "quiet", False):
            print(f"soulmem serve: {args.bank_dir} on http://{host}:{port}", flush=True)

    try:
        run_server(
            args.bank_dir,
            host=args.host,
            port=args.port,
            device=args.device,
            config=config,
            max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms,
            max_queue=args.max_queue,
            log_level=args.log_level,
            embedder=embedder,
            on_embedder_mismatch=args.on_embedder_mismatch,
            limits=limits,
            idle_after=args.idle_after,
            idle_interval=args.idle_interval,
            idle_llm=idle_llm,
            announce=announce,
        )
    except SoulMemError as exc:
        raise CLIError(str(exc)) from None
    return EXIT_OK


def _bank_embedder(args: argparse.Namespace) -> Any:
    """``--embedder``, else the one the bank recorded (a safe spec), else hashing."""
    from pathlib import Path

    from soulmem_torch.embedding.identity import embedder_from_spec, stored_spec_is_safe

    spec = args.embedder
    if spec is None:
        from soulmem_torch.bank import MemoryBank

        recorded = MemoryBank.recorded_embedder_spec(Path(args.bank_dir))
        if recorded is not None and not stored_spec_is_safe(recorded):
            raise CLIError(
                f"bank {args.bank_dir} was embedded with --embedder {recorded}; pass --embedder "
                f"{recorded} to use it again (a bank never imports code by itself), or name "
                "another embedder to re-embed the notes"
            )
        spec = recorded
    return embedder_from_spec(spec or "hashing")


def add_parser(sub: Any) -> None:
    """Registers ``soulmem serve``."""
    p = sub.add_parser(
        "serve",
        parents=[common_parent(), device_parent(), config_parent(), embedder_parent()],
        help="serve a memory bank (many agents) over HTTP",
        description="An HTTP JSON API over a MemoryBank directory: POST /ask, POST /query, "
        "GET /agents, GET /agents/{id}, POST /agents/{id}/notes (plain {text} notes or serde "
        "notes, validated, then persisted as one SQLite transaction before the reply), GET / DELETE /agents/{id}/notes/{note}, POST "
        "/agents/{id}/turns, POST /agents/{id}/forget, GET /health; errors are JSON. "
        "Concurrent requests are answered in micro-batches (one bank call each). One server "
        "per bank directory. Needs the 'serve' extra.",
    )
    p.add_argument(
        "bank_dir",
        metavar="BANK_DIR",
        help="bank directory (MemoryBank.save); a new or empty one is created on the first "
        "write; anything else (a store, a file) is refused",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (127.0.0.1)")
    p.add_argument(
        "--port", type=_port, default=8000, help="TCP port (8000; 0: any free port, printed)"
    )
    p.add_argument("--max-batch", type=_positive(int), default=256, help="requests per batch")
    p.add_argument(
        "--max-wait-ms", type=_positive(float), default=2.0, help="batch gathering window (ms)"
    )
    p.add_argument("--max-queue", type=_positive(int), default=4096, help="queue bound")
    p.add_argument(
        "--max-body-bytes",
        type=_positive(int),
        default=8 * 1024 * 1024,
        help="largest request body (8 MiB; 413 beyond)",
    )
    p.add_argument(
        "--max-text-chars",
        type=_positive(int),
        default=20_000,
        help="longest question or note JSON (20000 characters; 413 beyond)",
    )
    p.add_argument(
        "--max-notes", type=_positive(int), default=1_000, help="notes per write (1000; 413 beyond)"
    )
    p.add_argument(
        "--max-agents",
        type=_positive(int),
        default=100_000,
        help="agents in the bank (100000; a write creating one more is 503)",
    )
    p.add_argument(
        "--idle-timeout",
        type=_positive(float),
        default=15.0,
        help="seconds before a silent connection is closed (15)",
    )
    p.add_argument(
        "--max-connections",
        type=_positive(int),
        default=512,
        help="open connections / requests in flight (512; 503 beyond)",
    )
    p.add_argument(
        "--threads",
        type=_positive(int),
        default=None,
        help="torch CPU threads for the bank calls (default: torch's choice; on a machine "
        "shared with other busy processes, 1 avoids OpenMP contention)",
    )
    p.add_argument(
        "--idle-after", type=_positive(float), default=0.0, metavar="S",
        help="seconds without a request after which the bank is idle and learns from use: "
        "the plasticity update, and with --idle-llm the consolidation of window summaries, "
        "persisted to BANK_DIR (0, the default: off)",
    )  # fmt: skip
    p.add_argument(
        "--idle-interval", type=_positive(float), default=0.0, metavar="S",
        help="seconds between idle checks (0, the default: off; both flags must be > 0)",
    )  # fmt: skip
    p.add_argument(
        "--idle-llm", default=None, metavar="MODULE:FUNCTION",
        help="the consolidation LLM of the idle trigger ('fake': the built-in FakeLLM); "
        "without it only the plasticity update runs",
    )  # fmt: skip
    p.add_argument(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (warning)",
    )
    p.set_defaults(func=cmd_serve)

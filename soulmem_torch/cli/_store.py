"""Store helpers of the command line: ``--embedder`` / ``--on-embedder-mismatch``, choosing the
embedder a store was made with, and opening a store with it."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

from soulmem_torch.cli._errors import CLIError, _Parser
from soulmem_torch.cli._output import _info, _show_progress

__all__ = ["choose_embedder", "embedder_parent", "load_store_memory", "new_store_memory"]


def _embedder_spec_arg(text: str) -> str:
    from soulmem_torch.embedding.identity import parse_embedder_spec
    from soulmem_torch.errors import ValidationError

    try:
        return parse_embedder_spec(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("embedder spec: ")) from None


def embedder_parent() -> argparse.ArgumentParser:
    """``--embedder SPEC`` and ``--on-embedder-mismatch``, for the commands that embed notes."""
    parent = _Parser(add_help=False)
    parent.add_argument(
        "--embedder",
        type=_embedder_spec_arg,
        metavar="SPEC",
        default=None,
        help="the embedder: hashing (the offline built-in), st:MODEL_NAME (sentence-"
        "transformers, the 'st' extra) or MODULE:FUNCTION / file.py:FUNCTION returning an "
        "Embedder. Default: the one recorded in the store, else hashing. It is recorded in the "
        "store, so later commands reuse it",
    )
    parent.add_argument(
        "--on-embedder-mismatch",
        choices=["reembed", "refuse"],
        default="reembed",
        help="when the store's vectors come from another embedder than --embedder: re-embed "
        "every note (default; a status line says so) or refuse with an error",
    )
    return parent


def choose_embedder(args: argparse.Namespace, store: str | Path | None) -> Any:
    """The embedder for a command: ``--embedder``, else the store's recorded one, else hashing.

    A recorded ``MODULE:FUNCTION`` is not imported on the store's word (loading a store never
    runs code): the user is asked to name it again with ``--embedder``.
    """
    from soulmem_torch.embedding.identity import embedder_from_spec, stored_spec_is_safe

    spec = getattr(args, "embedder", None)
    if spec is None and store is not None:
        recorded = _recorded_spec(Path(store))
        if recorded is not None and not stored_spec_is_safe(recorded):
            raise CLIError(
                f"store {store} was embedded with --embedder {recorded}; pass --embedder "
                f"{recorded} to use it again (a store never imports code by itself), or name "
                "another embedder to re-embed the notes"
            )
        spec = recorded
    return embedder_from_spec(spec or "hashing")


def _recorded_spec(store: Path) -> str | None:
    from soulmem_torch.errors import StoreError
    from soulmem_torch.store import MemoryStore

    if not store.is_dir():
        return None
    try:
        manifest = MemoryStore(store).manifest()
    except StoreError:
        return None  # the load that follows reports the damage with its recovery path
    identity = manifest.get("embedder")
    spec = identity.get("spec") if isinstance(identity, dict) else None
    return spec if isinstance(spec, str) else None


def new_store_memory(args: argparse.Namespace, store: str | Path | None, **kwargs: Any) -> Any:
    """An empty ``SoulMem`` with the chosen embedder."""
    from soulmem_torch.api import SoulMem

    return SoulMem(embedder=choose_embedder(args, store), **kwargs)


def load_store_memory(args: argparse.Namespace, store: str | Path, **kwargs: Any) -> Any:
    """``SoulMem.load`` with the chosen embedder and ``--on-embedder-mismatch``; a status line
    says when the notes were re-embedded."""
    from soulmem_torch.api import SoulMem
    from soulmem_torch.embedding.identity import EmbedderMismatchWarning

    embedder = choose_embedder(args, store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbedderMismatchWarning)
        mem = SoulMem.load(
            store,
            embedder=embedder,
            on_embedder_mismatch=getattr(args, "on_embedder_mismatch", "reembed"),
            progress=_show_progress(args),
            **kwargs,
        )
    if mem.reembedded:
        _info(args, f"note: {mem.reembedded}; re-embedded all {len(mem)} notes")
    return mem


def save_new_notes(mem: Any, store: str | Path, fresh: list[Any]) -> dict[str, Any]:
    """Writes ``fresh`` (just added to ``mem``) into ``store``: ``SoulMem.save``, which writes
    only their rows (and their records) in one transaction when ``mem`` was loaded from
    ``store`` with its own vectors, and the whole memory otherwise (a new store, or notes
    re-embedded on load). Nothing new for the store it came from: its manifest, no version."""
    from soulmem_torch.store import MemoryStore

    origin = getattr(mem, "loaded_from", None)
    if not fresh and origin is not None and origin == Path(store).resolve():
        return MemoryStore(store).manifest()
    return mem.save(store)

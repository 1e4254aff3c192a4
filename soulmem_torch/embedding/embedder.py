"""The ``Embedder`` protocol, output validation, batching and long-text chunking (docs/spec.md §3).

An embedder is any callable mapping a batch of strings to a float tensor ``(n, D)`` and exposing
its width as ``dim``. It may also provide ``embed_query(texts)`` for the query side (retrieval
models such as BGE prepend an instruction to queries only); without it queries use ``__call__``.

Outputs are validated where they enter the package (:func:`run_embedder`): a wrong shape, a
non-float or a NaN / inf row is a :class:`~soulmem_torch.errors.ValidationError` naming the
text (and, through ``describe``, the note field) it came from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from soulmem_torch.errors import SoulMemError, ValidationError

__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "Embedder",
    "EmbedderUnavailableError",
    "chunk_text",
    "embedder_dim",
    "run_embedder",
]

DEFAULT_CHUNK_CHARS = 200
"""The original splits long text into chunks of at most 200 characters and mean-pools them."""


class EmbedderUnavailableError(SoulMemError, ImportError):
    """An optional embedding backend (e.g. ``sentence-transformers``) is not installed."""


@runtime_checkable
class Embedder(Protocol):
    """A batch of strings → float tensor ``(n, D)``; ``dim`` is ``D``.

    Optional: ``embed_query(texts) -> (n, D)`` for query-side strings. A plain function without
    ``dim`` is accepted as well; its width is taken from its first output.
    """

    dim: int

    def __call__(self, texts: Sequence[str]) -> Tensor: ...


def embedder_dim(embedder: Any, *, probe: bool = True) -> int | None:
    """The embedder's output width ``D``.

    Read from ``embedder.dim`` (an int, or a method returning one). A plain function without
    ``dim`` is accepted too (docs/spec.md §3 injects "any callable"): with ``probe`` its width is read
    from embedding ``[""]``; without, ``None`` is returned.

    Raises:
        ValidationError: ``dim`` is present but not an int > 0, or the probe output is not 2-D.
    """
    dim = getattr(embedder, "dim", None)
    if callable(dim):
        dim = dim()
    if dim is None:
        if not probe:
            return None
        out = _as_tensor(embedder([""]), "embedder output for the width probe ['']")
        if out.dim() != 2 or out.shape[0] != 1 or out.shape[1] <= 0:
            raise ValidationError(
                f"embedder output for the width probe ['']: expected shape (1, D), found "
                f"{tuple(out.shape)}"
            )
        return int(out.shape[1])
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise ValidationError(
            f"embedder.dim: expected an int > 0 (the output width D), found {dim!r}"
        )
    return dim


def _as_tensor(out: Any, what: str) -> Tensor:
    if isinstance(out, Tensor):
        return out
    try:
        return torch.as_tensor(out)
    except (TypeError, ValueError, RuntimeError):
        raise ValidationError(
            f"{what}: expected a float tensor (n, D), found {type(out).__name__}"
        ) from None


def _all_finite(out: Tensor) -> bool:
    """Whether every value is finite (numpy on the CPU: several times faster than torch)."""
    if out.device.type == "cpu" and out.dtype in (torch.float16, torch.float32, torch.float64):
        return bool(np.isfinite(out.detach().numpy()).all())
    return bool(torch.isfinite(out).all())


def run_embedder(
    embedder: Any,
    texts: Sequence[str],
    *,
    query: bool = False,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    describe: Callable[[int], str] | None = None,
) -> Tensor:
    """Embeds ``texts`` in batches and validates every output.

    Args:
        embedder: an :class:`Embedder`.
        texts: the strings (already deduplicated by the callers in this package).
        query: use ``embedder.embed_query`` when the embedder has one.
        batch_size: > 0. Strings per embedder call.
        device: where the result goes; ``None`` → CPU.
        describe: ``describe(i)`` names where ``texts[i]`` came from, for error messages.

    Returns:
        shape ``(len(texts), D)``, float32.

    Raises:
        ValidationError: the output is not ``(n, D)`` float, or a row holds NaN / inf — the
            message names the text (and its origin through ``describe``).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValidationError(f"batch_size: expected an int > 0, found {batch_size!r}")
    dim = embedder_dim(embedder, probe=not texts)
    target = torch.device("cpu") if device is None else torch.device(device)
    if not texts:
        return torch.zeros(0, dim or 0, dtype=torch.float32, device=target)
    fn = getattr(embedder, "embed_query", None) if query else None
    if not callable(fn):
        fn = embedder
    side = "query" if fn is not embedder else "document"
    parts: list[Tensor] = []
    for start in range(0, len(texts), batch_size):
        batch = list(texts[start : start + batch_size])
        what = f"embedder output ({side} side) for texts[{start}:{start + len(batch)}]"
        out = _as_tensor(fn(batch), what)
        if dim is None and out.dim() == 2:
            dim = int(out.shape[1])  # a plain function: the first batch fixes the width
        if out.dim() != 2 or out.shape[0] != len(batch) or out.shape[1] != dim:
            raise ValidationError(
                f"{what}: expected shape ({len(batch)}, {dim}) (n, embedder.dim), found "
                f"{tuple(out.shape)}"
            )
        if not out.is_floating_point():
            raise ValidationError(f"{what}: expected a float tensor, found {out.dtype}")
        if not _all_finite(out):
            bad = ~torch.isfinite(out).all(dim=1)
            row = int(bad.nonzero()[0, 0])
            where = describe(start + row) if describe is not None else f"text {start + row}"
            text = batch[row]
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise ValidationError(
                f"embedder output for {where} ({shown!r}): expected finite values, found NaN or inf"
            )
        parts.append(out.detach().to(target, torch.float32))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


# -------------------------------------------------------------------------------------------
# chunking
# -------------------------------------------------------------------------------------------
# Each level cuts right after its separators: after "\n\n" (a paragraph), "\n" (a line), a
# sentence end (。！？!?；;… or a "." before whitespace), a clause mark (，,、：:), whitespace
# (a word). Paragraphs and words are zero-width splits; lines, sentences and clauses are read
# as the pieces themselves (a run of other characters ending with its separator: the same
# pieces, found several times faster).
_PARAGRAPH = re.compile(r"(?<=\n\n)").split
_LINE = re.compile(r"[^\n]*\n?").findall
_SENTENCE = re.compile(r"[^。！？!?；;….]*(?:\.(?!\s)[^。！？!?；;….]*)*[。！？!?；;….]?").findall
_CLAUSE = re.compile(r"[^，,、：:]*[，,、：:]?").findall
_WORD = re.compile(r"(?<=\s)").split
_LEVELS = (_PARAGRAPH, _LINE, _SENTENCE, _CLAUSE, _WORD)
_MARKS = ("\n\n", "\n", None, None, None)
"""A separator a level needs (text without it is one piece there: the level is skipped)."""


def _split(text: str, limit: int, level: int) -> list[str]:
    """Pieces of ``text`` (no longer than ``limit``), cut at the coarsest boundary that fits.

    Every split is zero-width (after the separator), so the pieces concatenate to ``text``.
    """
    if len(text) <= limit:
        return [text]
    if level >= len(_LEVELS):
        return [text[i : i + limit] for i in range(0, len(text), limit)]
    mark = _MARKS[level]
    if mark is not None and mark not in text:
        return _split(text, limit, level + 1)
    pieces = list(filter(None, _LEVELS[level](text)))
    if len(pieces) <= 1:
        return _split(text, limit, level + 1)
    out: list[str] = []
    for piece in pieces:
        out.extend(_split(piece, limit, level + 1) if len(piece) > limit else [piece])
    return out


def chunk_text(text: str, max_chars: int = DEFAULT_CHUNK_CHARS) -> list[str]:
    """Splits long text into chunks of at most ``max_chars`` characters.

    Like the original's character splitter: the coarsest semantic boundary that fits wins
    (paragraph, line, sentence, clause, word, then a hard cut), adjacent pieces are merged
    greedily up to the limit, and chunks are stripped of surrounding whitespace. Empty or
    whitespace-only text gives no chunk (its embedding is the zero vector).

    Example:
        >>> chunk_text("短文本")
        ['短文本']
        >>> [len(c) for c in chunk_text("一二三四五。" * 50, 60)]
        [60, 60, 60, 60, 60]
    """
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars <= 0:
        raise ValidationError(f"max_chars: expected an int > 0, found {max_chars!r}")
    stripped = text.strip()
    if not stripped:
        return []
    if len(stripped) <= max_chars:
        return [stripped]
    chunks: list[str] = []
    current = ""
    for piece in _split(stripped, max_chars, 0):
        if len(current) + len(piece) <= max_chars:
            current += piece
            continue
        if current.strip():
            chunks.append(current.strip())
        current = piece
    if current.strip():
        chunks.append(current.strip())
    return chunks

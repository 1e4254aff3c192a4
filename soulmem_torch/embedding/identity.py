"""Embedder identity: which embedder produced a store's vectors, and rebuilding one from a spec.

A store saved with one embedder and opened with another must never mix their vectors: cosines
between two embedders' outputs mean nothing, and queries would silently return nothing. So
every store records an :class:`EmbedderIdentity` in its manifest, and opening it compares that
with the identity of the embedder at hand:

* **name** — a readable label (``"hashing"``, ``"st:BAAI/bge-small-zh-v1.5"``, ``"pkg.Class"``);
* **dim** — the output width D;
* **probe** — the embedder's outputs on a fixed set of probe texts (:data:`PROBE_TEXTS`,
  Chinese and English), each row L2-normalized and projected onto
  :data:`PROBE_PROJECTIONS` fixed random directions (seeded, so every process draws the same);
  stored rounded to 6 decimals — small (6 × 16 numbers) whatever D is;
* **fingerprint** — a short sha256 of the probe rounded to 3 decimals: a label for messages;
* **spec** — how the command line rebuilds the embedder (``"hashing"``, ``"st:NAME"``,
  ``"module:function"``), or ``None`` for an object built in Python.

Two identities **match** when their widths are equal and every probe value agrees within
:data:`PROBE_TOLERANCE` (1e-3): the same model on another device or batch size matches, a
different model, hash key, IDF fit or width does not. Names are not compared — two spellings of
one embedder match, and a renamed different model does not.

Example:
    >>> from soulmem_torch.embedding import HashingEmbedder
    >>> a = embedder_identity(HashingEmbedder(64))
    >>> a.name, a.dim, a.matches(embedder_identity(HashingEmbedder(64)))
    ('hashing(dim=64)', 64, True)
    >>> a.matches(embedder_identity(HashingEmbedder(64, baseline=0.0)))
    False
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from soulmem_torch.embedding.embedder import run_embedder
from soulmem_torch.errors import SoulMemError, ValidationError

__all__ = [
    "EMBEDDER_SPEC_HELP",
    "PROBE_PROJECTIONS",
    "PROBE_TEXTS",
    "PROBE_TOLERANCE",
    "EmbedderIdentity",
    "EmbedderMismatchError",
    "EmbedderMismatchWarning",
    "describe_mismatch",
    "embedder_from_spec",
    "embedder_identity",
    "parse_embedder_spec",
    "same_embedder",
    "stored_spec_is_safe",
]

PROBE_TEXTS: tuple[str, ...] = (
    "拿铁咖啡 latte",
    "雨天的下午，林在柜台旁打翻了一杯咖啡。",
    "A rainy Monday morning at the café; Lin spilled a latte.",
    "Hand over a towel",
    "谁教我做桂花糕？",
    "Rust 语言 memory safety 2026",
)
"""The fixed probe: every identity embeds exactly these texts (changing them changes every
fingerprint, so they are part of the store format)."""

PROBE_PROJECTIONS = 16
"""Random directions each normalized probe row is projected onto."""

PROBE_TOLERANCE = 1e-3
"""Largest difference of one projected probe value between two matching identities."""

_PROJECTION_SEED = 20261130

EMBEDDER_SPEC_HELP = (
    "hashing (the built-in offline embedder, default), st:MODEL_NAME (a sentence-transformers "
    "model, needs the 'st' extra) or MODULE:FUNCTION / path/to/file.py:FUNCTION (a function "
    "that returns an Embedder)"
)


class EmbedderMismatchError(SoulMemError, ValueError):
    """A store's vectors come from another embedder than the one given, and re-embedding was
    refused (``on_embedder_mismatch="refuse"``)."""


class EmbedderMismatchWarning(UserWarning):
    """A store's vectors come from another embedder; they were recomputed with the given one."""


@dataclass(frozen=True)
class EmbedderIdentity:
    """Who produced a set of vectors (see the module docstring).

    Attributes:
        name: a readable label.
        dim: > 0. The output width D.
        fingerprint: 16 hex digits; a label for messages (matching uses ``probe``).
        probe: ``len(PROBE_TEXTS) * PROBE_PROJECTIONS`` projected probe values.
        spec: how the command line rebuilds the embedder, or ``None``.
    """

    name: str
    dim: int
    fingerprint: str
    probe: tuple[float, ...]
    spec: str | None = None

    def matches(self, other: EmbedderIdentity) -> bool:
        """Same width and every probe value within :data:`PROBE_TOLERANCE`."""
        if self.dim != other.dim or len(self.probe) != len(other.probe):
            return False
        return all(abs(a - b) <= PROBE_TOLERANCE for a, b in zip(self.probe, other.probe))

    def describe(self) -> str:
        """``name (dim D, fingerprint F)`` for messages."""
        return f"{self.name} (dim {self.dim}, fingerprint {self.fingerprint})"

    def to_json(self) -> dict[str, Any]:
        """The manifest form (plain JSON types)."""
        return {
            "name": self.name,
            "dim": self.dim,
            "fingerprint": self.fingerprint,
            "probe": list(self.probe),
            "spec": self.spec,
        }

    @classmethod
    def from_json(cls, data: Any, *, where: str = "embedder") -> EmbedderIdentity:
        """Parses :meth:`to_json`'s form.

        Raises:
            ValidationError: naming ``where`` and the bad key.
        """
        if not isinstance(data, Mapping):
            raise ValidationError(f"{where}: expected an object, found {type(data).__name__}")
        name, dim, fingerprint = data.get("name"), data.get("dim"), data.get("fingerprint")
        probe, spec = data.get("probe"), data.get("spec")
        if not isinstance(name, str) or not name:
            raise ValidationError(f"{where}.name: expected a non-empty string, found {name!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValidationError(f"{where}.dim: expected an int > 0, found {dim!r}")
        if not isinstance(fingerprint, str):
            raise ValidationError(f"{where}.fingerprint: expected a string, found {fingerprint!r}")
        if (
            not isinstance(probe, list)
            or len(probe) != len(PROBE_TEXTS) * PROBE_PROJECTIONS
            or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in probe
            )
        ):
            raise ValidationError(
                f"{where}.probe: expected {len(PROBE_TEXTS) * PROBE_PROJECTIONS} finite numbers, "
                f"found {probe if not isinstance(probe, list) else f'{len(probe)} values'!r}"
            )
        if spec is not None and not isinstance(spec, str):
            raise ValidationError(f"{where}.spec: expected a string or null, found {spec!r}")
        return cls(name, dim, fingerprint, tuple(float(v) for v in probe), spec)


def _projection(dim: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(_PROJECTION_SEED + dim)
    return torch.randn(dim, PROBE_PROJECTIONS, generator=gen, dtype=torch.float64)


def _default_name(embedder: Any) -> str:
    from soulmem_torch.embedding.hashing import HashingEmbedder

    if isinstance(embedder, HashingEmbedder):
        params = [f"dim={embedder.dim}"] if embedder.dim != 1024 else []
        if embedder.link_weight != 0.5:
            params.append(f"link_weight={embedder.link_weight}")
        if embedder.baseline != 0.3:
            params.append(f"baseline={embedder.baseline}")
        if embedder.idf:
            params.append(f"idf={len(embedder.idf)} features")
        return "hashing" + (f"({', '.join(params)})" if params else "")
    kind = type(embedder)
    if kind.__name__ == "SentenceTransformerEmbedder":
        model = getattr(embedder, "model", None)
        card = getattr(getattr(model, "model_card_data", None), "base_model", None)
        return f"st:{card}" if isinstance(card, str) and card else "st:<model>"
    if callable(embedder) and hasattr(embedder, "__qualname__"):  # a plain function
        return f"{getattr(embedder, '__module__', '?')}.{embedder.__qualname__}"
    return f"{kind.__module__}.{kind.__qualname__}"


def embedder_identity(
    embedder: Any, *, name: str | None = None, spec: str | None = None
) -> EmbedderIdentity:
    """The identity of ``embedder``: embeds :data:`PROBE_TEXTS` once (document side).

    Args:
        embedder: an :class:`~soulmem_torch.embedding.Embedder`.
        name: the label; default: ``embedder.soulmem_spec`` when set (the command line sets it),
            else ``"hashing(...)"`` / ``"st:MODEL"`` / the class or function path.
        spec: how the command line rebuilds it; default ``embedder.soulmem_spec`` (or ``None``).

    Raises:
        ValidationError: the embedder's output on the probe is not a finite ``(n, D)`` tensor.
    """
    if spec is None:
        spec = getattr(embedder, "soulmem_spec", None)
        spec = spec if isinstance(spec, str) else None
    if name is None:
        name = spec if spec is not None else _default_name(embedder)
    out = run_embedder(embedder, list(PROBE_TEXTS)).to(torch.float64)
    dim = int(out.shape[1])
    rows = out / out.norm(dim=1, keepdim=True).clamp_min(1e-12)
    projected = (rows @ _projection(dim)).flatten()
    probe = tuple(round(float(v), 6) for v in projected.tolist())
    digest = hashlib.sha256(
        (str(dim) + ":" + ",".join(f"{v:.3f}" for v in probe)).encode("ascii")
    ).hexdigest()[:16]
    return EmbedderIdentity(name=name, dim=dim, fingerprint=digest, probe=probe, spec=spec)


# -------------------------------------------------------------------------------------------
# specs: how the command line names an embedder
# -------------------------------------------------------------------------------------------
def parse_embedder_spec(text: str) -> str:
    """Checks the syntax of an embedder spec (``hashing``, ``st:NAME``, ``MODULE:FUNCTION``).

    ``st:`` always means sentence-transformers (a module named ``st`` cannot be used).

    Raises:
        ValidationError: naming what was expected and what was found.
    """
    if not isinstance(text, str):
        raise ValidationError(f"embedder spec: expected a string, found {type(text).__name__}")
    spec = text.strip()
    if spec == "hashing":
        return spec
    if spec.startswith("st:"):
        if not spec[3:].strip():
            raise ValidationError(
                f"embedder spec {text!r}: st: needs a model name, e.g. st:BAAI/bge-small-zh-v1.5"
            )
        return spec
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise ValidationError(f"embedder spec: expected {EMBEDDER_SPEC_HELP}; found {text!r}")
    return spec


def _import_function(spec: str) -> Any:
    from soulmem_torch._imports import import_object

    return import_object(spec, what="embedder")


def embedder_from_spec(spec: str, **st_options: Any) -> Any:
    """Builds the embedder a spec names and tags it with ``soulmem_spec = spec``.

    * ``hashing`` → :class:`~soulmem_torch.embedding.HashingEmbedder` (defaults);
    * ``st:NAME`` → :class:`~soulmem_torch.embedding.SentenceTransformerEmbedder` (BGE v1.5
      Chinese models get the original's query instruction);
    * ``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION`` → ``FUNCTION()``, which must return
      an embedder (a callable batch of strings → ``(n, D)`` tensor).

    Raises:
        ValidationError: a bad spec, an import that fails, or a function that does not return
            a callable.
        EmbedderUnavailableError: ``st:`` without sentence-transformers installed.
    """
    spec = parse_embedder_spec(spec)
    if spec == "hashing":
        from soulmem_torch.embedding.hashing import HashingEmbedder

        embedder: Any = HashingEmbedder()
    elif spec.startswith("st:"):
        from soulmem_torch.embedding.sentence_transformers import (
            BGE_ZH_QUERY_INSTRUCTION,
            SentenceTransformerEmbedder,
        )

        model = spec[3:].strip()
        lowered = model.lower()
        if "bge" in lowered and "zh" in lowered:
            st_options.setdefault("query_prefix", BGE_ZH_QUERY_INSTRUCTION)
        embedder = SentenceTransformerEmbedder(model, **st_options)
    else:
        factory = _import_function(spec)
        if not callable(factory):
            raise ValidationError(
                f"embedder {spec}: expected a function returning an Embedder, found "
                f"{type(factory).__name__}"
            )
        try:
            embedder = factory()
        except Exception as exc:
            raise ValidationError(
                f"embedder {spec}: calling it raised {type(exc).__name__}: {exc}"
            ) from None
        if not callable(embedder):
            raise ValidationError(
                f"embedder {spec}: expected the function to return an Embedder (a callable "
                f"batch of strings → (n, D) tensor), found {type(embedder).__name__}"
            )
    try:
        embedder.soulmem_spec = spec
    except (AttributeError, TypeError):  # a frozen object: the identity still works
        pass
    return embedder


def stored_spec_is_safe(spec: str | None) -> bool:
    """Whether a spec read from a store may be rebuilt without the user naming it again.

    ``hashing`` and ``st:NAME`` only build known classes; a ``MODULE:FUNCTION`` spec would run
    code named by the store's files, which loading never does.
    """
    return spec == "hashing" or (isinstance(spec, str) and spec.startswith("st:"))


def describe_mismatch(stored: EmbedderIdentity | str | None, given: EmbedderIdentity) -> str:
    """A one-line description of a mismatch between a store and the embedder at hand."""
    if isinstance(stored, EmbedderIdentity):
        was = stored.describe()
    else:
        was = f"{stored or 'an unknown embedder'} (a legacy store without an identity)"
    return f"the store's vectors come from {was}; the embedder given is {given.describe()}"


def same_embedder(
    stored: EmbedderIdentity | None,
    legacy_name: str | None,
    stored_dim: int | None,
    embedder: Any,
    given: EmbedderIdentity,
) -> bool:
    """Whether a store's vectors may be reused with ``embedder`` (identity ``given``).

    With a recorded identity: :meth:`EmbedderIdentity.matches`. A **legacy** store (written
    before identities were recorded) is trusted when its recorded class name equals the
    embedder's class name and the widths agree — what older versions assumed.
    """
    if stored is not None:
        return stored.matches(given)
    return (
        legacy_name is not None
        and legacy_name == type(embedder).__name__
        and (stored_dim is None or stored_dim == given.dim)
    )

"""Deterministic token masking of a memory text (docs/spec.md §8 ``mask_text``).

A text is cut into tokens (jieba accurate mode, HMM on; whitespace and punctuation are tokens
of their own, so the tokens join back to the text), ``n = min(round_half_away(md · total),
total)`` of them are chosen and each is replaced by :data:`MASK_WORD`.

Which tokens are masked depends only on ``(text, missing_degree)``, never on Python's hash
randomization, the process or the platform:

* **seed** (the original's recipe) — ``h`` = polynomial hash of the UTF-8 bytes
  (``h = h·31 + byte``, wrapping at 2**64, from 0), XOR ``(bits · 114514) mod 2**64`` where
  ``bits`` is the IEEE-754 float32 bit pattern of ``missing_degree`` (as an unsigned integer);
* **generator** — SplitMix64 (Steele, Lea & Flood 2014; state += 0x9E3779B97F4A7C15, then
  the mix ``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
  z ^= z >> 31``, all mod 2**64), seeded with the seed as its state;
* **bounded draw** ``below(m)`` — draw ``x`` until ``x >= 2**64 mod m`` (rejection, so the
  result is unbiased), return ``x mod m``;
* **shuffle** — forward Fisher–Yates over ``[0, 1, …, total-1]``: for ``i = 0, 1, …``, swap
  position ``i`` with ``i + below(total - i)``. The first ``n`` positions are the masked token
  indices; only ``n`` steps are run since later steps cannot change them.

The output is not bit-identical to the Rust original (which uses ``rand::StdRng``); docs/spec.md
does not require that.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from soulmem_torch.errors import ValidationError

__all__ = [
    "MASK_WORD",
    "MaskResult",
    "SplitMix64",
    "Tokenizer",
    "choose_masked_indices",
    "jieba_tokenizer",
    "mask_count",
    "mask_text",
    "resolve_tokenizer",
    "text_seed",
]

MASK_WORD: str = " [masked] "
"""Replaces each masked token (with its surrounding spaces, as in the original)."""

_U64 = (1 << 64) - 1
_SEED_MULTIPLIER = 114514

Tokenizer = Callable[[str], Sequence[str]]
"""Any callable that cuts a text into tokens (which should join back to the text)."""


@dataclass(frozen=True)
class MaskResult:
    """Outcome of :func:`mask_text`.

    Attributes:
        masked_text: the text with ``masked_count`` tokens replaced by :data:`MASK_WORD`.
        masked_count: number of masked tokens (``n``).
        total_count: number of tokens of the text.
        missing_degree: the degree the mask was drawn for (as given).
        masked_indices: sorted indices of the masked tokens.
    """

    masked_text: str
    masked_count: int
    total_count: int
    missing_degree: float
    masked_indices: tuple[int, ...] = ()


# -------------------------------------------------------------------------------------------
# tokenizer
# -------------------------------------------------------------------------------------------
_JIEBA_LOCK = threading.Lock()
_JIEBA_DEFAULT: Tokenizer | None = None


def _jieba_cut(tokenizer: Any) -> Tokenizer:
    def cut(text: str) -> list[str]:
        return tokenizer.lcut(text, cut_all=False, HMM=True)

    return cut


def jieba_tokenizer() -> Tokenizer:
    """The shared default tokenizer: a dedicated ``jieba.Tokenizer`` in accurate mode, HMM on.

    jieba is imported and its dictionary loaded on the first call only; later calls return the
    same tokenizer. It is separate from ``jieba.dt``, so words added to jieba's global tokenizer
    elsewhere do not change which tokens a mask hides.
    """
    global _JIEBA_DEFAULT
    if _JIEBA_DEFAULT is None:
        with _JIEBA_LOCK:
            if _JIEBA_DEFAULT is None:
                import jieba  # lazy: loading the dictionary takes about half a second

                tok = jieba.Tokenizer()
                tok.initialize()
                _JIEBA_DEFAULT = _jieba_cut(tok)
    return _JIEBA_DEFAULT


def resolve_tokenizer(tokenizer: Any = None) -> Tokenizer:
    """A tokenizer callable from ``None`` (the shared jieba one), a ``jieba.Tokenizer`` (or
    anything with jieba's ``lcut``) or a callable ``str -> Sequence[str]``.

    Resolve once and pass the result around to avoid repeating the lookup per text.

    Raises:
        ValidationError: ``tokenizer`` is none of the above.
    """
    if tokenizer is None:
        return jieba_tokenizer()
    lcut = getattr(tokenizer, "lcut", None)
    if callable(lcut):
        return _jieba_cut(tokenizer)
    if callable(tokenizer):
        return tokenizer
    raise ValidationError(
        "tokenizer: expected None, a jieba.Tokenizer or a callable str -> list[str], "
        f"found {type(tokenizer).__name__}"
    )


# -------------------------------------------------------------------------------------------
# seed and generator
# -------------------------------------------------------------------------------------------
def _float32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def text_seed(text: str, missing_degree: float) -> int:
    """The mask seed: polynomial UTF-8 hash of ``text`` XOR ``float32_bits(md) · 114514``.

    Example:
        >>> text_seed("", 0.0)
        0
        >>> text_seed("a", 0.0)
        97
    """
    h = 0
    for byte in text.encode("utf-8"):
        h = (h * 31 + byte) & _U64
    return h ^ ((_float32_bits(missing_degree) * _SEED_MULTIPLIER) & _U64)


class SplitMix64:
    """SplitMix64 generator: 64-bit state, one 64-bit output per step (see the module docs).

    Example:
        >>> SplitMix64(0).next_u64()
        16294208416658607535
    """

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        self.state = int(seed) & _U64

    def next_u64(self) -> int:
        """The next 64-bit output."""
        self.state = (self.state + 0x9E3779B97F4A7C15) & _U64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
        return z ^ (z >> 31)

    def below(self, bound: int) -> int:
        """Uniform integer in ``[0, bound)`` by rejection (unbiased). ``bound`` >= 1."""
        if bound < 1:
            raise ValidationError(f"bound: expected an int >= 1, found {bound!r}")
        threshold = (1 << 64) % bound
        while True:
            x = self.next_u64()
            if x >= threshold:
                return x % bound


def choose_masked_indices(total: int, n: int, seed: int) -> list[int]:
    """The first ``n`` positions of a forward Fisher–Yates shuffle of ``range(total)``.

    Args:
        total: >= 0. Number of tokens.
        n: 0 … total. Number of tokens to mask.
        seed: the SplitMix64 seed (see :func:`text_seed`).

    Returns:
        ``n`` distinct token indices, in draw order.
    """
    rng = SplitMix64(seed)
    perm = list(range(total))
    for i in range(n):
        j = i + rng.below(total - i)
        perm[i], perm[j] = perm[j], perm[i]
    return perm[:n]


def mask_count(missing_degree: float, total: int) -> int:
    """``n = min(round_half_away_from_zero(md · total), total)``, the product taken in float32
    as in the original; 0 when ``md <= 0`` or ``total == 0``."""
    if total <= 0 or missing_degree <= 0:
        return 0
    md32 = struct.unpack("<f", struct.pack("<f", missing_degree))[0]
    # float32 product of two float32 values: the exact product fits a double; round once.
    prod = struct.unpack("<f", struct.pack("<f", md32 * float(total)))[0]
    return min(math.floor(prod + 0.5), total)


def _check_degree(missing_degree: float) -> float:
    if isinstance(missing_degree, bool) or not isinstance(missing_degree, (int, float)):
        raise ValidationError(
            f"missing_degree: expected a finite number, found {type(missing_degree).__name__}"
        )
    md = float(missing_degree)
    if not math.isfinite(md) or abs(md) > 3.4028234663852886e38:
        raise ValidationError(f"missing_degree: expected a finite float32 number, found {md!r}")
    return md


# -------------------------------------------------------------------------------------------
# mask_text
# -------------------------------------------------------------------------------------------
def mask_text(text: str, missing_degree: float, tokenizer: Any = None) -> MaskResult:
    """Masks ``round(md · tokens)`` tokens of ``text``, chosen deterministically.

    Args:
        text: the text to mask.
        missing_degree: typically in [0, 1]; treated as float32. ``<= 0`` masks nothing.
        tokenizer: ``None`` (the shared jieba tokenizer), a ``jieba.Tokenizer`` or a callable
            ``str -> Sequence[str]`` (see :func:`resolve_tokenizer`).

    Returns:
        The :class:`MaskResult`. With no tokens, ``md <= 0`` or ``n == 0`` the text is returned
        unchanged.

    Raises:
        ValidationError: ``text`` is not a string or ``missing_degree`` is not finite.

    Example:
        >>> r = mask_text("hello world", 1.0, tokenizer=str.split)
        >>> r.masked_text, r.masked_count, r.total_count
        (' [masked]  [masked] ', 2, 2)
    """
    if not isinstance(text, str):
        raise ValidationError(f"text: expected str, found {type(text).__name__}")
    md = _check_degree(missing_degree)
    cut = resolve_tokenizer(tokenizer)
    tokens = list(cut(text))
    total = len(tokens)
    n = mask_count(md, total)
    if n == 0:
        return MaskResult(text, 0, total, missing_degree)
    chosen = choose_masked_indices(total, n, text_seed(text, md))
    for i in chosen:
        tokens[i] = MASK_WORD
    return MaskResult("".join(tokens), n, total, missing_degree, tuple(sorted(chosen)))

"""Lazy forgetting of one note (docs/spec.md §8 ``lazy_forget``): mask, then let the LLM fill the gaps.

Only a ``SpecificSituation`` (its ``narrative``) and a ``Semantic`` note (its ``content``) are
forgotten. With the missing degree ``md`` of the note (``1 - R``, see :mod:`.decay`):

* ``md < MASK_THRESHOLD`` (0.05) → :class:`NoAction`;
* ``md < REVISE_THRESHOLD`` (0.15) → the masked text is written → :class:`MaskOnly`;
* otherwise the injected LLM reconstructs the masked text; its reply is written →
  :class:`Revised`. **DECISION:** an LLM that raises, times out, answers something that is not
  a string, or answers only whitespace is a failure: the masked text is written instead →
  :class:`MaskOnly` with ``llm_error`` set (the original would write an empty reply over the
  memory).

Bounds (the original has none):

* **Timeout.** Every LLM call is limited to :data:`DEFAULT_LLM_TIMEOUT_S` (60 s) unless the
  caller passes another ``timeout`` (``None`` = no limit, explicitly). A plain synchronous
  callable runs in a daemon worker thread, so the timeout holds even when it blocks (the thread
  is abandoned, never joined; an ``async`` callable is cancelled).
* **Reply size and echo.** A reconstruction longer than :func:`max_reply_chars` of the original
  text (``REPLY_LENGTH_FACTOR`` × its length + ``REPLY_LENGTH_SLACK`` characters), or one that
  echoes the prompt (contains the system message, starts with ``"Masked text:"`` or repeats
  the masked text unchanged) is rejected: the masked text is kept (:class:`MaskOnly` with
  ``llm_error``) and a :class:`LLMReplyWarning` names the note.
* **Cancellation.** A ``CancelledError`` raised *by the LLM* (not a cancellation of the
  caller) is an LLM failure like any other; cancelling the caller propagates.

Every action carries the text as it was before (``old_summary``), so nothing is lost without a
trace. Thresholds are compared in float32, as the original compares its f32 values.

The LLM is any callable ``(system, user) -> Awaitable[str]`` (a plain ``str`` return value is
accepted too); soulmem_torch never builds a client itself.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import threading
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

from soulmem_torch.errors import LLMError, ValidationError
from soulmem_torch.forget.decay import (
    DEFAULT_ACTIVE_FACTOR,
    DEFAULT_BASE_HALF_LIFE_HOURS,
    DEFAULT_MAX_ACTIVATION_CAP,
    compute_missing_degree,
)
from soulmem_torch.forget.mask import MASK_WORD, mask_text
from soulmem_torch.model import SemMemory, SpecificSituation
from soulmem_torch.model.serde import to_float32

__all__ = [
    "DEFAULT_LLM_TIMEOUT_S",
    "MASK_THRESHOLD",
    "REPLY_LENGTH_FACTOR",
    "REPLY_LENGTH_SLACK",
    "RECONSTRUCT_SYSTEM_PROMPT",
    "REVISE_THRESHOLD",
    "ForgetAction",
    "LLMCallable",
    "LLMReplyWarning",
    "MaskOnly",
    "NoAction",
    "Revised",
    "build_reconstruct_prompt",
    "call_llm",
    "check_reply",
    "get_summary",
    "lazy_forget",
    "max_reply_chars",
    "set_summary",
]

MASK_THRESHOLD: float = 0.05
"""Below this missing degree nothing is forgotten (compared as float32)."""
REVISE_THRESHOLD: float = 0.15
"""From this missing degree on, the LLM reconstructs the masked text (compared as float32)."""

DEFAULT_LLM_TIMEOUT_S: float = 60.0
"""Seconds one LLM call may take unless the caller says otherwise (``None`` = no limit)."""
REPLY_LENGTH_FACTOR: int = 4
"""A reconstruction may be at most this many times as long as the original text (plus
:data:`REPLY_LENGTH_SLACK`); a longer one is rejected and the masked text kept."""
REPLY_LENGTH_SLACK: int = 32
"""Characters allowed on top of ``REPLY_LENGTH_FACTOR`` × the original's length (short notes)."""


class LLMReplyWarning(UserWarning):
    """An LLM reply was rejected (too long, or an echo of the prompt); the message names the
    note and the reason. The masked text was kept."""


LLMCallable: TypeAlias = Callable[[str, str], Awaitable[str]]
"""An injected LLM: ``async (system, user) -> reply``."""

RECONSTRUCT_SYSTEM_PROMPT: str = (
    "You are a memory reconstruction assistant. A memory text has been partially masked: "
    "some of its words were replaced by [masked] placeholders. Using the remaining words as "
    "context, infer the missing words and fill in every [masked] part so that the text reads "
    "naturally, in the same language and style as the rest of the text. Output only the "
    "completed text, with no explanation, quotes or labels."
)
"""Default system message of the reconstruction call; the user message is
``"Masked text: " + masked_text``."""


# -------------------------------------------------------------------------------------------
# actions
# -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NoAction:
    """Nothing was forgotten: the kind is not forgettable or ``md < MASK_THRESHOLD``.

    Attributes:
        old_summary: the note's text (unchanged); ``None`` for a kind without one.
        missing_degree: the note's missing degree.
    """

    old_summary: str | None = None
    missing_degree: float = 0.0


@dataclass(frozen=True)
class MaskOnly:
    """The masked text was written over the note's text (no LLM, or the LLM failed).

    Attributes:
        missing_degree: the note's missing degree.
        masked_count: number of masked tokens.
        masked_text: the text now stored in the note.
        old_summary: the text before forgetting.
        llm_error: why the LLM's reconstruction was not used; ``None`` when the LLM was not
            called (``md < REVISE_THRESHOLD``).
    """

    missing_degree: float
    masked_count: int
    masked_text: str
    old_summary: str
    llm_error: str | None = None


@dataclass(frozen=True)
class Revised:
    """The LLM's reconstruction of the masked text was written over the note's text.

    Attributes:
        old_summary: the text before forgetting.
        new_summary: the text now stored in the note (the LLM's reply, stripped).
        masked_text: what the LLM was shown.
        missing_degree: the note's missing degree.
        masked_count: number of masked tokens.
    """

    old_summary: str
    new_summary: str
    masked_text: str
    missing_degree: float
    masked_count: int


ForgetAction: TypeAlias = NoAction | MaskOnly | Revised
"""The outcome of :func:`lazy_forget`."""


# -------------------------------------------------------------------------------------------
# note text
# -------------------------------------------------------------------------------------------
def _as_note(item: Any) -> Any:
    return getattr(item, "note", item)


def get_summary(note: Any) -> str | None:
    """The forgettable text: a SpecificSituation's ``narrative``, a Semantic note's ``content``,
    else ``None``."""
    mem_type = _as_note(note).mem_type
    if isinstance(mem_type, SpecificSituation):
        return mem_type.narrative
    if isinstance(mem_type, SemMemory):
        return mem_type.content
    return None


def set_summary(note: Any, text: str) -> None:
    """Writes ``text`` as the narrative / content.

    Raises:
        ValidationError: the note is neither a SpecificSituation nor a Semantic note.
    """
    note = _as_note(note)
    mem_type = note.mem_type
    if isinstance(mem_type, SpecificSituation):
        mem_type.narrative = text
    elif isinstance(mem_type, SemMemory):
        mem_type.content = text
    else:
        raise ValidationError(
            f"note: expected a SpecificSituation or Semantic note, found {type(mem_type).__name__}"
        )


# -------------------------------------------------------------------------------------------
# LLM call
# -------------------------------------------------------------------------------------------
def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < math.inf
    ):
        raise ValidationError(
            f"timeout: expected None or a finite number of seconds > 0, found {timeout!r}"
        )
    return float(timeout)


_HAS_TIMEOUT_CM = hasattr(asyncio, "timeout")


def _is_async_callable(llm: Any) -> bool:
    return inspect.iscoroutinefunction(llm) or inspect.iscoroutinefunction(
        getattr(llm, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


async def _in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Runs a blocking ``fn(*args)`` in a new daemon thread and awaits its result.

    Not ``asyncio.to_thread``: the default executor's threads are joined when ``asyncio.run``
    ends, so a callable that never returns would hang the program after its timeout. A daemon
    thread that outlives its timeout is abandoned (its result is dropped).
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if future.done():  # cancelled or timed out meanwhile
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            outcome = (True, context.run(fn, *args))
        except BaseException as exc:  # handed to the awaiting task, which decides
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    threading.Thread(target=target, name="soulmem-llm", daemon=True).start()
    return await future


async def _invoke(llm: Callable[[str, str], Any], system: str, user: str) -> Any:
    if _is_async_callable(llm):
        result = llm(system, user)
    else:  # a plain callable may block: keep the event loop (and the timeout) alive
        result = await _in_daemon_thread(llm, system, user)
    if inspect.isawaitable(result):
        result = await result
    return result


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (vs. a CancelledError from inside)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python >= 3.11
    if cancelling is None:
        return task is not None and task.cancelled()
    return bool(cancelling())


async def call_llm(
    llm: Callable[[str, str], Any],
    system: str,
    user: str,
    *,
    timeout: float | None = DEFAULT_LLM_TIMEOUT_S,
    require_text: bool = True,
    max_chars: int | None = None,
) -> str:
    """Calls the injected LLM once, turning every failure into :class:`LLMError`.

    A plain (synchronous) callable runs in a daemon worker thread, so ``timeout`` holds even
    when it blocks; an async callable is awaited on the running loop.

    Args:
        llm: ``(system, user) -> Awaitable[str]`` (or ``-> str``).
        system: the system message.
        user: the user message.
        timeout: seconds (> 0) before the call is abandoned (default
            :data:`DEFAULT_LLM_TIMEOUT_S`); ``None`` = no limit.
        require_text: an answer of only whitespace is a failure too.
        max_chars: >= 0. A longer reply is a failure; ``None`` = any length.

    Returns:
        The reply.

    Raises:
        LLMError: the LLM raised (any ``Exception``, or a ``CancelledError`` of its own), timed
            out, returned a non-string, a reply over ``max_chars`` or (with ``require_text``)
            only whitespace. Cancellation of the caller, ``KeyboardInterrupt`` and
            ``SystemExit`` propagate.
    """
    timeout = _check_timeout(timeout)
    if llm is None or not callable(llm):
        raise LLMError(f"llm: expected an async callable (system, user) -> str, found {llm!r}")
    try:
        if timeout is None:
            reply = await _invoke(llm, system, user)
        elif _HAS_TIMEOUT_CM:  # no extra task per call (Python >= 3.11)
            async with asyncio.timeout(timeout):
                reply = await _invoke(llm, system, user)
        else:  # pragma: no cover - Python 3.10
            reply = await asyncio.wait_for(_invoke(llm, system, user), timeout)
    except asyncio.TimeoutError:
        raise LLMError(f"llm: no reply within the timeout of {timeout:g} s") from None
    except asyncio.CancelledError:
        if _cancelling():
            raise
        raise LLMError("llm: the call raised CancelledError") from None
    except Exception as exc:
        raise LLMError(f"llm: the call raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(reply, str):
        raise LLMError(f"llm: expected a str reply, found {type(reply).__name__}")
    if require_text and not reply.strip():
        raise LLMError(f"llm: expected a non-empty reply, found {reply!r}")
    if max_chars is not None and len(reply) > max_chars:
        raise LLMError(
            f"llm: expected a reply of at most {max_chars} characters, found {len(reply)}"
        )
    return reply


def max_reply_chars(original: str) -> int:
    """The longest reconstruction accepted for ``original``:
    ``REPLY_LENGTH_FACTOR * len(original) + REPLY_LENGTH_SLACK`` characters."""
    return REPLY_LENGTH_FACTOR * len(original) + REPLY_LENGTH_SLACK


def _squash(text: str) -> str:
    return " ".join(text.split())


def check_reply(reply: str, *, original: str, system: str, user: str) -> str | None:
    """Why a reconstruction reply must not be stored, or ``None`` when it may.

    Rejected: longer than :func:`max_reply_chars` of ``original`` (after stripping); or an echo
    of the prompt — it contains the system message, starts with the user message's
    ``"Masked text:"`` label, or repeats the masked text unchanged (whitespace-insensitive).
    """
    text = reply.strip()
    limit = max_reply_chars(original)
    flat = _squash(text[: 4 * (limit + len(system) + len(user))])  # echo checks on a bounded head
    label = user.split(":", 1)[0] + ":" if ":" in user else None
    masked = _squash(user[len(label) :]) if label else None
    sys_flat = _squash(system)
    if sys_flat and sys_flat in flat:
        return "llm: the reply echoes the system prompt"
    if label and flat.startswith(label):
        return f"llm: the reply echoes the prompt (starts with {label!r})"
    if masked and _squash(MASK_WORD) in masked and flat == masked:
        return "llm: the reply repeats the masked text unchanged"
    if len(text) > limit:
        return (
            f"llm: reply of {len(text)} characters is longer than {limit} "
            f"({REPLY_LENGTH_FACTOR} x the original's {len(original)} + {REPLY_LENGTH_SLACK})"
        )
    return None


def build_reconstruct_prompt(masked_text: str, system_prompt: str | None = None) -> tuple[str, str]:
    """``(system, user)`` of the reconstruction call: ``user = "Masked text: " + masked_text``."""
    system = RECONSTRUCT_SYSTEM_PROMPT if system_prompt is None else system_prompt
    return system, "Masked text: " + masked_text


# -------------------------------------------------------------------------------------------
# lazy_forget
# -------------------------------------------------------------------------------------------


def _check_md(missing_degree: Any) -> float:
    number = isinstance(missing_degree, (int, float)) and not isinstance(missing_degree, bool)
    if not (number and math.isfinite(missing_degree)):
        raise ValidationError(f"missing_degree: expected a finite number, found {missing_degree!r}")
    return float(missing_degree)


def _resolve_md(
    note: Any,
    now: datetime | int | None,
    missing_degree: Any,
    base_half_life_hours: float,
    active_factor: float,
    max_activation_cap: int,
) -> float:
    """The given ``missing_degree`` (validated), else the note's own from the forgetting curve."""
    if missing_degree is not None:
        return _check_md(missing_degree)
    return compute_missing_degree(
        note.create_time,
        note.retrieval_count,
        now,
        base_half_life_hours,
        active_factor,
        max_activation_cap,
    )


async def lazy_forget(
    note: Any,
    now: datetime | int | None = None,
    tokenizer: Any = None,
    llm: Callable[[str, str], Any] | None = None,
    *,
    system_prompt: str | None = None,
    timeout: float | None = DEFAULT_LLM_TIMEOUT_S,
    missing_degree: float | None = None,
    base_half_life_hours: float = DEFAULT_BASE_HALF_LIFE_HOURS,
    active_factor: float = DEFAULT_ACTIVE_FACTOR,
    max_activation_cap: int = DEFAULT_MAX_ACTIVATION_CAP,
) -> ForgetAction:
    """Forgets part of a note's text according to its missing degree (mutates ``note``).

    Args:
        note: a ``MemoryNote`` (or an ``EmbeddedMemoryNote``; its ``.note`` is used).
        now: aware datetime (or int ns); ``None`` = the current time.
        tokenizer: ``None`` (shared jieba tokenizer), a ``jieba.Tokenizer`` or a callable
            ``str -> Sequence[str]``; see :func:`~soulmem_torch.forget.mask.resolve_tokenizer`.
        llm: ``async (system, user) -> str``. ``None``: notes that need the LLM are only masked
            (``MaskOnly`` with ``llm_error``).
        system_prompt: replaces :data:`RECONSTRUCT_SYSTEM_PROMPT`.
        timeout: seconds (> 0) the LLM may take (default :data:`DEFAULT_LLM_TIMEOUT_S`);
            ``None`` = no limit.
        missing_degree: use this degree instead of computing it (e.g. from
            :func:`~soulmem_torch.forget.decay.missing_degree_batch`).
        base_half_life_hours, active_factor, max_activation_cap: decay parameters, see
            :func:`~soulmem_torch.forget.decay.ebbinghaus_decay`.

    Returns:
        :class:`NoAction`, :class:`MaskOnly` or :class:`Revised`; never raises for an LLM
        failure. A reply rejected by :func:`check_reply` (too long, an echo of the prompt)
        gives :class:`MaskOnly` and a :class:`LLMReplyWarning` naming the note. The note is
        written once, after the LLM answered: cancelling the call leaves it untouched.

    Raises:
        ValidationError: bad ``now``, ``timeout``, ``missing_degree`` or tokenizer.
    """
    note = _as_note(note)
    timeout = _check_timeout(timeout)
    md = _resolve_md(
        note, now, missing_degree, base_half_life_hours, active_factor, max_activation_cap
    )
    old = get_summary(note)
    if old is None or to_float32(md) < to_float32(MASK_THRESHOLD):
        return NoAction(old, md)

    mask = mask_text(old, md, tokenizer)
    if to_float32(md) < to_float32(REVISE_THRESHOLD):
        set_summary(note, mask.masked_text)
        return MaskOnly(md, mask.masked_count, mask.masked_text, old)

    if llm is None:
        error = "llm: none given, the masked text was kept"
    else:
        system, user = build_reconstruct_prompt(mask.masked_text, system_prompt)
        try:
            reply = await call_llm(llm, system, user, timeout=timeout)
        except LLMError as exc:
            error = str(exc)
        else:
            rejected = check_reply(reply, original=old, system=system, user=user)
            if rejected is None:
                new = reply.strip()
                set_summary(note, new)
                return Revised(old, new, mask.masked_text, md, mask.masked_count)
            error = rejected
            warnings.warn(
                f"note {note.id}: {rejected}; the masked text was kept",
                LLMReplyWarning,
                stacklevel=2,
            )
    set_summary(note, mask.masked_text)
    return MaskOnly(md, mask.masked_count, mask.masked_text, old, error)

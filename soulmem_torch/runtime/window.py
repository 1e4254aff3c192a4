"""Short-term memory: the ``SlidingWindow`` of conversation messages and its summary (docs/spec.md §2).

Messages (``User`` / ``Assistant``) are pushed into a window of ``capacity`` messages. A tag
counter starting at ``capacity`` is incremented on every push; when it reaches ``capacity`` the
message is tagged and the counter reset, so the first message and then every ``capacity``-th one
are tagged. Beyond ``capacity`` the oldest message is evicted; evicting a tagged message first
rewrites the cumulative summary through the injected LLM.

The LLM is any callable ``(system, user) -> str`` (async or not). The user message is one line
``"[role]: text\\n"`` per message: first ``[assistant]: <old summary>``, then every message of the
window, oldest first (the one about to be evicted included). The reply (stripped) is the new
summary.

**Failures never lose anything.** If the LLM raises, exceeds ``timeout`` or answers blank (or
not a string), the summary and every message are kept — the window is then over capacity (the
capacity is a soft bound, as in the original) — and the failure is reported: in the returned
:class:`PushResult`, in :attr:`SlidingWindow.last_error`, and raised as ``LLMError`` with
``raise_on_error=True``. The eviction is retried on the next push. Each push makes at most one
LLM call (untagged overflow is evicted freely), which bounds its latency. Without an LLM
(``llm=None``) the window is a plain ring buffer and the summary never changes.

Example:
    >>> import asyncio
    >>> async def llm(system, user):
    ...     return "they greeted each other"
    >>> window = SlidingWindow(capacity=2, llm=llm)
    >>> async def talk():
    ...     for text in ["hi", "hello", "how are you?"]:
    ...         await window.push(User(text))
    >>> asyncio.run(talk())
    >>> [m.text for m in window.messages()], window.summary
    (['hello', 'how are you?'], 'they greeted each other')
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import ClassVar, TypeAlias

from soulmem_torch.errors import LLMError, ValidationError

__all__ = [
    "SUMMARY_SYSTEM_PROMPT",
    "Assistant",
    "Information",
    "LLMCallable",
    "PushResult",
    "SlidingWindow",
    "User",
    "make_information",
]

LLMCallable: TypeAlias = Callable[[str, str], "Awaitable[str] | str"]
"""``(system, user) -> str`` (a coroutine function or a plain function)."""

SUMMARY_SYSTEM_PROMPT = (
    "You maintain the running summary of a conversation between a user and an assistant. "
    "The first line below is the summary so far (it may be empty); the following lines are the "
    "messages since then, oldest first, each as '[role]: text'. Write a new cumulative summary "
    "of the whole conversation so far, keeping the facts, names, preferences, decisions and open "
    "questions that may matter later. Output only the summary text, with no preamble, "
    "headings or other text."
)


@dataclass
class User:
    """A message from the user. ``tag``: marked for summarization on eviction."""

    text: str
    tag: bool = False
    role: ClassVar[str] = "user"


@dataclass
class Assistant:
    """A message from the assistant. ``tag``: marked for summarization on eviction."""

    text: str
    tag: bool = False
    role: ClassVar[str] = "assistant"


Information: TypeAlias = User | Assistant
"""``User{text, tag} | Assistant{text, tag}``."""


def make_information(text: str, role: str = "user") -> Information:
    """``"assistant"`` -> :class:`Assistant`; anything else -> :class:`User` (as the original)."""
    return Assistant(text) if role == "assistant" else User(text)


@dataclass(frozen=True)
class PushResult:
    """What one :meth:`SlidingWindow.push` / :meth:`SlidingWindow.pop` did.

    Attributes:
        evicted: messages removed from the window, oldest first.
        summary_updated: the LLM wrote a new summary.
        error: the summary failure, if any (then nothing was lost: see the module doc).
    """

    evicted: tuple[Information, ...] = ()
    summary_updated: bool = False
    error: LLMError | None = None

    @property
    def ok(self) -> bool:
        """No summary failure."""
        return self.error is None


def _check_info(info: object) -> Information:
    if not isinstance(info, (User, Assistant)):
        raise ValidationError(
            f"info: expected a User or Assistant message, found {type(info).__name__}"
        )
    if not isinstance(info.text, str):
        raise ValidationError(f"info.text: expected a str, found {type(info.text).__name__}")
    return info


def _check_capacity(capacity: object) -> int:
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise ValidationError(f"capacity: expected an int >= 1, found {capacity!r}")
    return capacity


class SlidingWindow:
    """The window of recent messages plus a cumulative summary (see the module doc).

    Args:
        capacity: >= 1. Messages kept (a soft bound: a failed summary keeps its message).
        llm: ``(system, user) -> str`` (async or not), or ``None`` for no summaries.
        timeout: > 0 seconds, or ``None``. Limit for one async LLM call; exceeding it is a
            failure (a plain function cannot be interrupted).
        system_prompt: the system message of the summary call.
        tag_counter_start: initial value of the tag counter; ``None`` -> ``capacity`` (docs/spec.md
            §2: the first message is tagged). ``0`` gives the newer original's rule (the
            ``capacity``-th message is the first tagged).
    """

    def __init__(
        self,
        capacity: int = 20,
        llm: LLMCallable | None = None,
        *,
        timeout: float | None = None,
        system_prompt: str = SUMMARY_SYSTEM_PROMPT,
        tag_counter_start: int | None = None,
    ) -> None:
        self._capacity = _check_capacity(capacity)
        if llm is not None and not callable(llm):
            raise ValidationError(f"llm: expected a callable or None, found {type(llm).__name__}")
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValidationError(f"timeout: expected seconds > 0 or None, found {timeout!r}")
        if tag_counter_start is not None and (
            not isinstance(tag_counter_start, int) or tag_counter_start < 0
        ):
            raise ValidationError(
                f"tag_counter_start: expected an int >= 0 or None, found {tag_counter_start!r}"
            )
        self.llm = llm
        self.timeout = timeout
        self.system_prompt = system_prompt
        self._counter_start = tag_counter_start
        self._tag_count = self._capacity if tag_counter_start is None else tag_counter_start
        self._messages: deque[Information] = deque()
        self._summary = ""
        self.last_error: LLMError | None = None
        """The failure of the latest summary attempt (``None`` after a success)."""
        self._gate: asyncio.Lock | None = None

    # -- read access ----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Messages kept (soft bound). Settable; takes effect on the next push."""
        return self._capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        self._capacity = _check_capacity(value)

    @property
    def summary(self) -> str:
        """The cumulative summary of evicted history (``""`` before the first one)."""
        return self._summary

    def messages(self) -> list[Information]:
        """The window's messages, oldest first (a new list)."""
        return list(self._messages)

    def get(self, index: int) -> Information | None:
        """Message ``index`` (0 = oldest), or ``None`` out of range."""
        if 0 <= index < len(self._messages):
            return self._messages[index]
        return None

    def __getitem__(self, index: int) -> Information:
        return self._messages[index]

    def __len__(self) -> int:
        return len(self._messages)

    def __iter__(self) -> Iterator[Information]:
        return iter(list(self._messages))

    def is_empty(self) -> bool:
        return not self._messages

    def __repr__(self) -> str:
        return (
            f"SlidingWindow(capacity={self._capacity}, messages={len(self._messages)}, "
            f"summary={len(self._summary)} chars)"
        )

    def build_summary_prompt(self) -> tuple[str, str]:
        """``(system, user)`` of the summary call for the current state."""
        lines = [f"[assistant]: {self._summary}\n"]
        lines.extend(f"[{m.role}]: {m.text}\n" for m in self._messages)
        return self.system_prompt, "".join(lines)

    # -- mutation -------------------------------------------------------------------------
    async def push(self, info: Information, *, raise_on_error: bool = False) -> PushResult:
        """Appends a message (tagged by the counter rule), then evicts beyond capacity.

        A tag already set on ``info`` is kept. The stored message is a copy of ``info``.

        Args:
            info: a :class:`User` or :class:`Assistant` message.
            raise_on_error: raise the summary failure as ``LLMError`` (after keeping every
                message and the old summary) instead of only reporting it.
        """
        info = _check_info(info)
        tagged = self._auto_tag()
        self._messages.append(replace(info, tag=info.tag or tagged))
        result = await self._evict(force=False)
        if raise_on_error and result.error is not None:
            raise result.error
        return result

    async def push_text(
        self, text: str, role: str = "user", *, raise_on_error: bool = False
    ) -> PushResult:
        """``push(make_information(text, role))``."""
        return await self.push(make_information(text, role), raise_on_error=raise_on_error)

    async def pop(self, *, raise_on_error: bool = False) -> PushResult:
        """Evicts the oldest message regardless of capacity (summarizing first if tagged).

        An empty window is a no-op. A failed summary keeps the message (see :meth:`push`).
        """
        result = await self._evict(force=True)
        if raise_on_error and result.error is not None:
            raise result.error
        return result

    def clear(self) -> None:
        """Drops every message and restarts the tag counter; the summary is kept."""
        self._messages.clear()
        self._tag_count = self._capacity if self._counter_start is None else self._counter_start

    def set_summary(self, text: str) -> None:
        """Sets the summary (e.g. restored from a store, or a chat log to consolidate)."""
        if not isinstance(text, str):
            raise ValidationError(f"text: expected a str, found {type(text).__name__}")
        self._summary = text

    def clear_summary(self) -> None:
        """Empties the summary (e.g. after consolidating it into long-term memory)."""
        self._summary = ""

    def tag_information(self, index: int) -> None:
        """Tags message ``index``; out of range is a no-op."""
        if 0 <= index < len(self._messages):
            self._messages[index].tag = True

    def untag_information(self, index: int) -> None:
        """Untags message ``index``; out of range is a no-op."""
        if 0 <= index < len(self._messages):
            self._messages[index].tag = False

    # -- internals ------------------------------------------------------------------------
    def _auto_tag(self) -> bool:
        self._tag_count += 1
        if self._tag_count >= self._capacity:
            self._tag_count = 0
            return True
        return False

    async def _evict(self, *, force: bool) -> PushResult:
        if self._gate is None:
            self._gate = asyncio.Lock()
        evicted: list[Information] = []
        updated = False
        async with self._gate:  # the read-summary / call / write-summary step is serialized
            while self._messages and (force or len(self._messages) > self._capacity):
                front = self._messages[0]
                if front.tag and self.llm is not None:
                    if updated:
                        break  # at most one LLM call per push; the rest waits for the next
                    error = await self._summarize()
                    if error is not None:
                        self.last_error = error
                        return PushResult(tuple(evicted), False, error)
                    self.last_error = None
                    updated = True
                if self._messages and self._messages[0] is front:
                    self._messages.popleft()
                    evicted.append(front)
                if force:
                    break
        return PushResult(tuple(evicted), updated, None)

    async def _summarize(self) -> LLMError | None:
        """Calls the LLM; on success writes the summary, else returns the failure."""
        system, user = self.build_summary_prompt()
        assert self.llm is not None
        waiting = False
        try:
            reply = self.llm(system, user)
            if inspect.isawaitable(reply):
                if self.timeout is not None:
                    waiting = True
                    reply = await asyncio.wait_for(reply, self.timeout)
                    waiting = False
                else:
                    reply = await reply
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if waiting and isinstance(exc, asyncio.TimeoutError):
                return LLMError(
                    f"llm: the summary call timed out after {self.timeout} s; "
                    "the old summary and every message are kept"
                )
            error = LLMError(
                f"llm: the summary call failed ({type(exc).__name__}: {exc}); "
                "the old summary and every message are kept"
            )
            error.__cause__ = exc
            return error
        if not isinstance(reply, str):
            return LLMError(
                f"llm: expected the summary text (str), found {type(reply).__name__}; "
                "the old summary and every message are kept"
            )
        text = reply.strip()
        if not text:
            return LLMError("llm: the summary is blank; the old summary and every message are kept")
        self._summary = text
        return None

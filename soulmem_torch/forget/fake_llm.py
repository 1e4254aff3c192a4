"""A deterministic offline LLM for demos, tests and benchmarks (no network, no model).

:class:`FakeLLM` is an ``async (system, user) -> str`` callable that understands the prompts of
this package by the shape of their user message:

* ``"Masked text: …"`` (reconstruction, :func:`~.lazy.lazy_forget`): every ``[masked]`` slot is
  filled with a placeholder word — Chinese next to CJK text, English otherwise — picked by
  SplitMix64 seeded with a polynomial hash of the masked text (slot k takes the k-th draw), so
  the same input always gives the same output on every platform;
* ``"Content: …"`` (alignment, :func:`~.align.align_sem_fields`): the three-line answer that
  keeps the current aliases, description and concept type;
* anything else (e.g. a conversation to summarize): the last non-empty lines of the message,
  stripped of ``[role]:`` prefixes and cut to ``max_summary_chars``.

It records how often it was called (``calls``) and can simulate latency (``delay``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence

from soulmem_torch.forget.mask import SplitMix64

__all__ = ["FakeLLM"]

_MASK_SLOT = re.compile(r" ?\[masked\] ?")
_CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")
_ROLE = re.compile(r"^\[[^\]]*\]:\s*")
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s*|\n+")
_U64 = (1 << 64) - 1

_ZH_WORDS: tuple[str, ...] = ("某处", "某人", "一些", "当时", "那里", "东西", "一起", "似乎")
_EN_WORDS: tuple[str, ...] = ("something", "someone", "somewhere", "then", "there", "it", "some")


def _poly_hash(text: str) -> int:
    h = 0
    for byte in text.encode("utf-8"):
        h = (h * 31 + byte) & _U64
    return h


class FakeLLM:
    """Deterministic stand-in for an LLM client.

    Args:
        delay: seconds to ``await asyncio.sleep`` per call (simulated latency); 0 = none.
        zh_words: placeholder words used next to CJK text.
        en_words: placeholder words used elsewhere.
        max_summary_chars: cut of the fallback (summary) answer.

    Example:
        >>> import asyncio
        >>> asyncio.run(FakeLLM()("sys", "Masked text: 鲁迅 [masked] 周树人"))
        '鲁迅当时周树人'
    """

    def __init__(
        self,
        *,
        delay: float = 0.0,
        zh_words: Sequence[str] = _ZH_WORDS,
        en_words: Sequence[str] = _EN_WORDS,
        max_summary_chars: int = 400,
    ) -> None:
        if not zh_words or not en_words:
            raise ValueError(
                "zh_words / en_words: expected non-empty word lists, found an empty one"
            )
        self.delay = float(delay)
        self.zh_words = tuple(zh_words)
        self.en_words = tuple(en_words)
        self.max_summary_chars = int(max_summary_chars)
        self.calls = 0

    async def __call__(self, system: str, user: str) -> str:
        self.calls += 1
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        return self.respond(system, user)

    # -- synchronous core ---------------------------------------------------------------
    def respond(self, system: str, user: str) -> str:
        """The answer to ``(system, user)`` without the async wrapper."""
        if user.startswith("Masked text: "):
            return self.fill_masks(user[len("Masked text: ") :])
        if user.startswith("Content: "):
            return self.align_reply(user)
        if user.startswith("Summary:\n"):
            return self.split_reply(user)
        if user.startswith("Notes:\n"):
            return self.link_reply(user)
        return self.summarize(user)

    def split_reply(self, user: str) -> str:
        """A consolidation split (``soulmem_torch.consolidate``): one episode per sentence of
        the summary (at most 8), as a JSON array."""
        summary = user[len("Summary:\n") :].split("\n\nHot memories:", 1)[0]
        parts = [p.strip() for p in _SENTENCE.split(summary) if p.strip()][:8]
        return json.dumps([{"type": "situation", "content": p} for p in parts], ensure_ascii=False)

    def link_reply(self, user: str) -> str:
        """A consolidation linking answer: each new note ``n*`` to the first active note."""
        names = [line.split(":", 1)[0].strip() for line in user.split("\n")[1:] if ":" in line]
        new = [n for n in names if n.startswith("n")]
        target = next((n for n in names if n.startswith("a")), None)
        if target is None:
            return "[]"
        return json.dumps([{"from": n, "to": target, "verb": "related"} for n in new])

    def fill_masks(self, masked_text: str) -> str:
        """Fills every ``[masked]`` slot (with its surrounding spaces) deterministically."""
        has_cjk = bool(_CJK.search(masked_text))
        picks = SplitMix64(_poly_hash(masked_text))  # slot k takes the k-th draw
        # segments: (text, is_english_word)
        segments: list[tuple[str, bool]] = []
        pos = 0
        for m in _MASK_SLOT.finditer(masked_text):
            segments.append((masked_text[pos : m.start()], False))
            before = masked_text[: m.start()].rstrip()[-1:]
            after = _MASK_SLOT.sub("", masked_text[m.end() :]).lstrip()[:1]
            near = before + after
            pick = picks.next_u64()
            if _CJK.search(near) or (not near and has_cjk):
                segments.append((self.zh_words[pick % len(self.zh_words)], False))
            else:
                segments.append((self.en_words[pick % len(self.en_words)], True))
            pos = m.end()
        segments.append((masked_text[pos:], False))
        out: list[str] = []
        for i, (text, english) in enumerate(segments):
            if english:
                prev = out[-1][-1:] if out and out[-1] else ""
                nxt_text, nxt_english = next(
                    ((t, e) for t, e in segments[i + 1 :] if t), ("", False)
                )
                if prev and not prev.isspace() and prev not in "([{\"'“‘":
                    text = " " + text
                if nxt_english or (nxt_text[:1].isalnum() and not _CJK.match(nxt_text[:1])):
                    text += " "
            out.append(text)
        return "".join(out).strip()

    def align_reply(self, user: str) -> str:
        """The three-line alignment answer that keeps the current values."""
        fields: dict[str, str] = {}
        for line in user.split("\n"):
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        try:
            aliases = json.loads(fields.get("Current aliases", "[]"))
            if not isinstance(aliases, list):
                aliases = []
        except ValueError:
            aliases = []
        alias_line = ", ".join(str(a) for a in aliases) if aliases else "none"
        description = fields.get("Current description", "") or "none"
        concept = fields.get("Current concept type", "Entity") or "Entity"
        return f"Aliases: {alias_line}\nDescription: {description}\nConceptType: {concept}"

    def summarize(self, user: str) -> str:
        """The fallback answer: the message's last lines without ``[role]:`` prefixes."""
        lines = [_ROLE.sub("", line).strip() for line in user.split("\n")]
        text = " ".join(line for line in lines if line)
        return text[-self.max_summary_chars :] if text else "(nothing to summarize)"

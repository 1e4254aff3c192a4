"""The load path's fast parsers of times and ids give what the general ones give."""

from __future__ import annotations

import random
import threading

import pytest

from soulmem_torch.model import MemoryId
from soulmem_torch.model import ids as ids_module
from soulmem_torch.model.ids import bulk_parsing, parsed_ids
from soulmem_torch.model.timestamp import _parse_general, _parse_rfc3339, parse_rfc3339


def _outcome(parse, text: str) -> tuple:  # type: ignore[no-untyped-def]
    try:
        ts = parse(text)
    except ValueError as exc:
        return ("error", str(exc))
    return ("ok", type(ts), ts.ns_since_epoch, ts.tzinfo, ts.to_rfc3339())


def test_canonical_times_parse_as_the_general_parser_does() -> None:
    rng = random.Random(7)
    cases = [
        "2026-12-02T01:32:27Z", "2026-02-30T01:32:27Z", "2026-12-02T01:32:60Z",
        "2026-12-02T01:32:27.Z", "2026-12-02T01:32:27,5Z", "0001-01-01T00:00:00Z",
        "0000-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z", "2026-12-02t01:32:27.5z",
        " 2026-12-02T01:32:27Z", "2026-12-02T01:32:27.1234567891Z", "٢٠٢٦-12-02T01:32:27Z",
        "2024-02-29T12:00:00.5Z", "2023-02-29T12:00:00.5Z", "2026-12-02T01:32:27+02:00", "",
    ]  # fmt: skip
    cases += ["2026-12-02T01:32:27." + "123456789"[:k] + "Z" for k in range(1, 10)]
    for _ in range(500):
        frac = str(rng.randint(0, 10**9 - 1)).zfill(9)[: rng.randint(1, 9)]
        cases.append(
            f"{rng.randint(1, 9999):04d}-{rng.randint(0, 13):02d}-{rng.randint(0, 32):02d}T"
            f"{rng.randint(0, 24):02d}:{rng.randint(0, 60):02d}:{rng.randint(0, 60):02d}"
            + ("." + frac if rng.random() < 0.8 else "")
            + "Z"
        )
    for text in cases:
        assert _outcome(_parse_rfc3339, text) == _outcome(_parse_general, text), text
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_rfc3339("")  # not the cache's empty slot


def test_bulk_parsing_keeps_every_id_then_drops_the_oversized_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ids_module, "_SEEN_MAX", 8)
    cap = ids_module._BULK[1]
    ids_module._BULK[1] = 8  # the parsers hold this very list
    try:
        _check_bulk_parsing()
    finally:
        ids_module._BULK[1] = cap


def _check_bulk_parsing() -> None:
    texts = [f"00000000-0000-4000-8000-{i:012d}" for i in range(40)]
    from soulmem_torch.model import MemoryNote

    def parse(text: str) -> MemoryId:
        return MemoryNote.model_validate_json(
            '{"id":"' + text + '","tags":[],"retrieval_count":0,'
            '"create_time":"2026-01-01T00:00:00Z","last_accessed_time":"2026-01-01T00:00:00Z",'
            '"mem_type":{"Semantic":{"content":"c","aliases":[],"concept_type":"Entity",'
            '"description":""}},"mem_links":[]}'
        ).id

    with bulk_parsing():
        with bulk_parsing():  # nests
            first = [parse(t) for t in texts]
        assert all(parsed_ids(MemoryId).get(t) is m for t, m in zip(texts, first))
        assert [parse(t) for t in texts] == first
        assert all(a is b for a, b in zip(first, (parse(t) for t in texts)))
    assert len(parsed_ids(MemoryId)) <= 8  # dropped once the last bulk parse ended
    assert [parse(t) for t in texts] == first  # still parses, just not kept
    assert all(str(m) == t for m, t in zip(first, texts))

    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with bulk_parsing():
                assert [parse(t) for t in texts] == first
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and ids_module._BULK[0] == 0 and ids_module._BULK[1] == 8

"""Retrieval is recorded by default; asking the same question again strengthens its notes'
links and makes the notes slower to forget; records are saved with the store."""

from __future__ import annotations

from datetime import timedelta

import torch

from soulmem_torch import MemoryBank, SoulMem
from soulmem_torch.data import sample_memory_path
from soulmem_torch.forget.decay import ebbinghaus_decay_batch, note_time_tensors
from soulmem_torch.model.soul_tune import load_soul_tune_graph
from soulmem_torch.model.timestamp import Timestamp

QUESTION = "a rainy afternoon at the café"


def _returned(result):
    return {i for i, _ in result.association} | {i for i, _ in result.action}


def test_ask_records_by_default_and_record_false_does_not():
    mem = SoulMem.from_graph_file(sample_memory_path())
    version = mem.cluster.version
    (r,) = mem.ask(QUESTION)
    ids = _returned(r)
    recs = mem.working_memory.records
    assert all(recs[i].retrieval_count == 1 for i in ids)
    assert all(mem.cluster[i].note.retrieval_count == 1 for i in ids)
    assert mem.cluster.version == version  # retrieval caches stay valid
    mem.ask(QUESTION, record=False)
    assert all(recs[i].retrieval_count == 1 for i in ids)
    (q,) = mem.query([{"tag": [], "variant": {"Semantic": [{"concept_identifier": "麻薯"}]}}])
    assert all(recs[i].retrieval_count >= 1 for i in _returned(q))


def test_bank_records_per_agent():
    notes = load_soul_tune_graph(sample_memory_path()).notes
    bank = MemoryBank()
    bank.add_agent("a", notes)
    bank.add_agent("b", notes)
    (r,) = bank.ask(["a"], [QUESTION])
    assert all(bank.agent("a").working_memory.records[i].retrieval_count == 1 for i in _returned(r))
    assert all(r2.retrieval_count == 0 for r2 in bank.agent("b").working_memory.records.values())
    bank.ask(["b"], [QUESTION], record=False)
    assert all(r2.retrieval_count == 0 for r2 in bank.agent("b").working_memory.records.values())


def test_repeated_question_strengthens_links_and_slows_forgetting(monkeypatch):
    # one clock for the whole test: a record's rate is count / its span in whole seconds, so a
    # second boundary between two asks would rank the hot notes differently (a flaky test)
    frozen = Timestamp.now()
    monkeypatch.setattr(Timestamp, "now", classmethod(lambda cls: frozen))
    mem = SoulMem.from_graph_file(sample_memory_path())
    (first,) = mem.ask(QUESTION, record=False)
    returned = _returned(first)
    # every returned note is retrieved on each of the asks below, so all tie on frequency and
    # the update's eight hot notes are an id-ordered pick among them (ids are fresh uuids per
    # load): the links checked are those between any two returned notes
    hot = returned
    links = {
        lk.id: lk.intensity for i in hot for lk in mem.cluster[i].note.mem_links if lk.to in hot
    }
    assert links
    notes = mem.cluster.notes()
    later = max(n.create_time for n in notes) + timedelta(days=3)
    before = ebbinghaus_decay_batch(*note_time_tensors(notes), now=later)
    recalled = set()  # stronger links may bring further notes into later answers
    for _ in range(5):
        (r,) = mem.ask(QUESTION)
        recalled |= _returned(r)
        mem.update_plasticity()
    assert returned <= recalled
    after_links = {
        lk.id: lk.intensity for i in hot for lk in mem.cluster[i].note.mem_links if lk.id in links
    }
    stronger = [lid for lid in links if after_links[lid] > links[lid]]
    assert stronger and all(after_links[lid] >= min(links[lid], 1.0) for lid in links)
    after = ebbinghaus_decay_batch(*note_time_tensors(mem.cluster.notes()), now=later)
    idx = [k for k, n in enumerate(mem.cluster.notes()) if n.id in returned]
    assert bool((after[idx] > before[idx]).all())  # reinforced half-life: slower to forget
    others = [k for k, n in enumerate(mem.cluster.notes()) if n.id not in recalled]
    assert others and torch.equal(after[others], before[others])


def test_records_and_summary_are_saved_with_the_store(tmp_path):
    mem = SoulMem.from_graph_file(sample_memory_path())
    (r,) = mem.ask(QUESTION)
    mem.working_memory.sliding_window.set_summary("we talked about rain")
    mem.save(tmp_path / "s")
    back = SoulMem.load(tmp_path / "s")
    for i in _returned(r):
        a, b = mem.working_memory.records[i], back.working_memory.records[i]
        assert a == b
    assert back.working_memory.sliding_window.summary == "we talked about rain"
    # the retrieval was not yet used by a plasticity update: the loaded memory still has it
    wm = back.working_memory
    assert wm.retrieval_revision != wm.plasticity_revision
    ours = {c.link_id: c.new_intensity for c in mem.update_plasticity()}
    theirs = {c.link_id: c.new_intensity for c in back.update_plasticity()}
    assert ours == theirs and ours
    assert wm.retrieval_revision == wm.plasticity_revision

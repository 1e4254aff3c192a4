"""Forgetting (docs/spec.md §8): Ebbinghaus decay, deterministic masking, LLM reconstruction.

* :mod:`.decay` — retention / missing degree / decayed link intensity, scalar and as tensors;
* :mod:`.mask` — ``mask_text`` (jieba tokens, SplitMix64 + Fisher–Yates, platform-independent);
* :mod:`.lazy` — ``lazy_forget`` → ``NoAction`` | ``MaskOnly`` | ``Revised``;
* :mod:`.align` — ``align_sem_fields`` for Semantic notes;
* :mod:`.cluster` — ``forget_cluster`` over a whole cluster (bounded concurrency, re-embedding,
  optional link pruning);
* :mod:`.fake_llm` — ``FakeLLM``, a deterministic offline LLM for demos and tests.

Touches only the model and the injected LLM (and, for re-embedding, the injected embedder).
"""

from __future__ import annotations

from soulmem_torch.forget.align import (
    ALIGN_LENGTH_CAP_THRESHOLD,
    ALIGN_SYSTEM_PROMPT,
    AlignReply,
    AlignResult,
    align_sem_fields,
    build_align_prompt,
    parse_align_response,
)
from soulmem_torch.forget.cluster import (
    ClusterAdapter,
    ForgetConfig,
    ForgetFailure,
    ForgetReport,
    LinkRef,
    PrunedLink,
    forget_cluster,
)
from soulmem_torch.forget.decay import (
    DEFAULT_ACTIVE_FACTOR,
    DEFAULT_BASE_HALF_LIFE_HOURS,
    DEFAULT_MAX_ACTIVATION_CAP,
    compute_missing_degree,
    ebbinghaus_decay,
    ebbinghaus_decay_batch,
    edge_decay_intensity,
    edge_decay_intensity_batch,
    elapsed_whole_hours,
    graph_decay,
    graph_edge_decay_intensity,
    graph_missing_degree,
    missing_degree_batch,
    note_time_tensors,
)
from soulmem_torch.forget.fake_llm import FakeLLM
from soulmem_torch.forget.lazy import (
    DEFAULT_LLM_TIMEOUT_S,
    MASK_THRESHOLD,
    RECONSTRUCT_SYSTEM_PROMPT,
    REPLY_LENGTH_FACTOR,
    REPLY_LENGTH_SLACK,
    REVISE_THRESHOLD,
    ForgetAction,
    LLMCallable,
    LLMReplyWarning,
    MaskOnly,
    NoAction,
    Revised,
    build_reconstruct_prompt,
    call_llm,
    check_reply,
    get_summary,
    lazy_forget,
    max_reply_chars,
    set_summary,
)
from soulmem_torch.forget.mask import (
    MASK_WORD,
    MaskResult,
    SplitMix64,
    Tokenizer,
    jieba_tokenizer,
    mask_text,
    resolve_tokenizer,
    text_seed,
)

__all__ = [
    "ALIGN_LENGTH_CAP_THRESHOLD",
    "ALIGN_SYSTEM_PROMPT",
    "DEFAULT_LLM_TIMEOUT_S",
    "DEFAULT_ACTIVE_FACTOR",
    "DEFAULT_BASE_HALF_LIFE_HOURS",
    "DEFAULT_MAX_ACTIVATION_CAP",
    "MASK_THRESHOLD",
    "MASK_WORD",
    "RECONSTRUCT_SYSTEM_PROMPT",
    "REPLY_LENGTH_FACTOR",
    "REPLY_LENGTH_SLACK",
    "REVISE_THRESHOLD",
    "AlignReply",
    "AlignResult",
    "ClusterAdapter",
    "FakeLLM",
    "ForgetAction",
    "ForgetConfig",
    "ForgetFailure",
    "ForgetReport",
    "LLMCallable",
    "LLMReplyWarning",
    "LinkRef",
    "MaskOnly",
    "MaskResult",
    "NoAction",
    "PrunedLink",
    "Revised",
    "SplitMix64",
    "Tokenizer",
    "align_sem_fields",
    "build_align_prompt",
    "build_reconstruct_prompt",
    "call_llm",
    "check_reply",
    "compute_missing_degree",
    "ebbinghaus_decay",
    "ebbinghaus_decay_batch",
    "edge_decay_intensity",
    "edge_decay_intensity_batch",
    "elapsed_whole_hours",
    "forget_cluster",
    "get_summary",
    "graph_decay",
    "graph_edge_decay_intensity",
    "graph_missing_degree",
    "jieba_tokenizer",
    "lazy_forget",
    "mask_text",
    "max_reply_chars",
    "missing_degree_batch",
    "note_time_tensors",
    "parse_align_response",
    "resolve_tokenizer",
    "set_summary",
    "text_seed",
]

"""Strategy configurations (docs/spec.md §7), with the original's names, JSON shape and defaults.

Each config is a frozen pydantic model; ``RetrRequestConfig`` is the tagged union (JSON field
``"type"``) that deserializes any of them, as the original's ``#[serde(tag = "type")]`` enum does.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "AUTO_SEQUENTIAL_MAX_NODES",
    "MAX_DAMPING_FACTOR",
    "AssociateWithActionConfig",
    "AssociationConfig",
    "BayesActionConfig",
    "DefaultPipelineConfig",
    "FusionChannel",
    "PprMethod",
    "RetrRequestConfig",
    "ShortOnlyConfig",
    "SimilarityConfig",
    "TypePreference",
    "parse_request_config",
]

from soulmem_torch.retrieve.requests import (
    AssociateWithActionRequest,
    AssociationRequest,
    BayesActionRequest,
    DefaultPipelineRequest,
    ShortOnlyRequest,
    SimilarityRequest,
)

if TYPE_CHECKING:
    from soulmem_torch.retrieve._types import MemorySource

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class TypePreference(str, Enum):
    """Which link kind association favours: ``[semantic_boost, situation_boost]`` (docs/spec.md §5)."""

    SEMANTIC = "Semantic"
    SITUATION = "Situation"

    @property
    def boosts(self) -> tuple[float, float]:
        """``(semantic_boost, situation_boost)``: Semantic = (0.7, 0.3), Situation = (0.3, 0.7)."""
        return (0.7, 0.3) if self is TypePreference.SEMANTIC else (0.3, 0.7)


AUTO_SEQUENTIAL_MAX_NODES = 4096
"""``method="auto"`` runs the exact sequential push on CPU graphs up to this many notes."""

POWER_DENSE_MAX_NODES = 128
"""Default ``AssociationConfig.power_dense_max_nodes``: at 128 notes the inverse of
``I - dP^T`` takes ~0.3 ms on one CPU thread (about what one power iteration at ``power_tol``
1e-9 costs there) and holds 128 KiB; it grows as ``N^3`` / ``N^2``."""

MAX_DENSE_NODES = 4096
"""Largest ``AssociationConfig.power_dense_max_nodes``: a dense inverse of 4,096 notes holds
128 MiB and takes seconds to compute."""

MAX_DAMPING_FACTOR = 0.99
"""Largest ``AssociationConfig.damping_factor``. The work of every PPR method grows like
``1 / (1 - damping)``; at 0.99 the power iteration needs 2,061 steps for ``power_tol`` 1e-9
(its cap, ``functional.ppr.MAX_POWER_STEPS``, is 10,000), while 0.999999 would need millions."""


class PprMethod(str, Enum):
    """How association runs PPR.

    * ``power`` (the default) — batched weighted power iteration to a certified L1 tolerance
      (``power_tol``): the exact PPR of the same weights and dangling rule, one sparse product
      per step for the whole batch, on every device and size.
    * ``auto`` — ``sequential`` for a graph on the CPU with at most
      ``AUTO_SEQUENTIAL_MAX_NODES`` (4096) notes, where it is cheap (milliseconds per query) and
      gives the original's numbers exactly; otherwise ``power``. The choice depends only on the
      graph and its device, never on the batch, so a query scores the same in any batch.
    * ``sequential`` — the original's push, node by node (docs/spec.md §6.1): exact parity, CPU, one
      Python loop per query.
    * ``push`` — batched vectorized forward push with the original's per-node rules: differs from
      ``sequential`` only within the residue threshold's error on small graphs; on large graphs
      the drop rule (the original's too) loses a lot of mass.
    """

    AUTO = "auto"
    SEQUENTIAL = "sequential"
    PUSH = "push"
    POWER = "power"


class SimilarityConfig(BaseModel):
    """``Similarity``: score every note; keep scores ≥ threshold; top ``max_results``."""

    model_config = _FROZEN
    type: Literal["Similarity"] = Field(default="Similarity", repr=False)
    similarity_threshold: float = Field(
        default=0.35, allow_inf_nan=False, description="Floor on the fused score (not a rank cut)."
    )
    max_results: int = Field(default=4, ge=1, description="How many notes to keep (>= 1).")
    situation_units: Literal["sum", "mean"] | None = Field(
        default=None,
        description="How a Situation query's unit scores combine: 'mean' (the newest original; "
        "the default of BlendWeights) or 'sum' (older versions: several units can exceed 1); "
        "None → the BlendWeights' own choice.",
    )

    def into_request(
        self, working_memory: MemorySource, query: Any, *, embedder: Any = None, device: Any = None
    ) -> SimilarityRequest:
        """A request over ``working_memory`` for ``query`` (see ``SimilarityRequest``)."""

        return SimilarityRequest(working_memory, query, self, embedder=embedder, device=device)


class AssociationConfig(BaseModel):
    """``Association``: Personalized PageRank from scored sources (docs/spec.md §6–7).

    ``damping_factor`` is the probability of *continuing* the walk (restart = 1 − damping), not
    PyG's teleport ``alpha``.
    """

    model_config = _FROZEN
    type: Literal["Association"] = Field(default="Association", repr=False)
    intensity_factor: float | None = Field(
        default=None, ge=0.0, allow_inf_nan=False, description="None → 1.0."
    )
    confidence_factor: float | None = Field(
        default=None, ge=0.0, allow_inf_nan=False, description="None → 0.8."
    )
    damping_factor: float = Field(
        default=0.65,
        ge=0.0,
        le=MAX_DAMPING_FACTOR,
        description="In [0, 0.99]: continue probability (restart = 1 - damping); bounded so "
        "every PPR method stops within its step cap (see MAX_DAMPING_FACTOR).",
    )
    residue_threshold: float = Field(default=1e-5, gt=0.0, allow_inf_nan=False)
    preference: TypePreference = TypePreference.SITUATION
    top_k: int = Field(default=8, ge=1)
    method: PprMethod = Field(
        default=PprMethod.POWER,
        description="See PprMethod; 'sequential' reproduces the original's numbers bit for bit.",
    )
    power_tol: float = Field(
        default=1e-9, gt=0.0, lt=1.0, description="L1 tolerance of the power method."
    )
    power_dtype: Literal["float64", "float32"] = Field(
        default="float64",
        description="Precision of the power iteration; float32 halves its memory traffic and "
        "is accurate to about 1e-6 in L1 (use it with power_tol >= 1e-6).",
    )
    power_dense_max_nodes: int = Field(
        default=POWER_DENSE_MAX_NODES,
        ge=0,
        le=MAX_DENSE_NODES,
        description="Graphs of at most this many notes get the exact PPR from a dense inverse "
        "of I - dP^T, computed once per graph version and damping and kept with its transition "
        "(O(N^2) memory, O(N) per source of a query) instead of the power iteration; 0 turns "
        "it off. The result is the limit the iteration approaches, so it meets power_tol.",
    )
    power_local: bool = Field(
        default=True,
        description="Iterate only the nodes reachable from the sources within the step count "
        "when they are at most a quarter of the graph (an exact shortcut).",
    )

    def into_request(
        self, working_memory: MemorySource, source: Any, *, device: Any = None
    ) -> AssociationRequest:
        """A request with ``source = [(MemoryId, f32 score)]``."""

        return AssociationRequest(working_memory, list(source), self, device)

    @property
    def resolved_intensity_factor(self) -> float:
        return 1.0 if self.intensity_factor is None else self.intensity_factor

    @property
    def resolved_confidence_factor(self) -> float:
        return 0.8 if self.confidence_factor is None else self.confidence_factor


class BayesActionConfig(BaseModel):
    """``BayesAction``: actions reachable by TrigToAction links, scored Σ prob · weight."""

    model_config = _FROZEN
    type: Literal["BayesAction"] = Field(default="BayesAction", repr=False)
    top_k: int = Field(default=5, ge=1)

    def into_request(
        self, working_memory: MemorySource, source: Any, *, device: Any = None
    ) -> BayesActionRequest:
        """A request with ``source = [(MemoryId, f64 weight)]``."""

        return BayesActionRequest(working_memory, list(source), self, device)


class ShortOnlyConfig(BaseModel):
    """``ShortOnly``: the short-term window (last ``clipping_length`` messages) and summary.

    **DECISION** (docs/spec.md §7): ``include_summary`` is honoured (the original ignores it).
    """

    model_config = _FROZEN
    type: Literal["ShortOnly"] = Field(default="ShortOnly", repr=False)
    clipping_length: int | None = Field(default=None, ge=0, description="Keep the last N.")
    include_summary: bool = False

    def into_request(self, working_memory: MemorySource) -> ShortOnlyRequest:

        return ShortOnlyRequest(working_memory, self)


class AssociateWithActionConfig(BaseModel):
    """``AssociateWithAction``: association, then Bayes actions from the situations found."""

    model_config = _FROZEN
    type: Literal["AssociateWithAction"] = Field(default="AssociateWithAction", repr=False)
    association: AssociationConfig = Field(default_factory=AssociationConfig)
    action_top_k: int = Field(default=3, ge=1)
    abstract_source_priority: float = Field(default=2.0, ge=0.0, allow_inf_nan=False)

    def into_request(
        self, working_memory: MemorySource, source: Any, *, device: Any = None
    ) -> AssociateWithActionRequest:
        """A request with seeds ``source = [(MemoryId, f32 score)]``."""

        return AssociateWithActionRequest(working_memory, list(source), self, device)


FusionChannel = Literal["seeds", "similarity", "text", "graph", "graph_undirected", "time"]
"""A channel of the rank fusion (see :mod:`soulmem_torch.functional.fusion`): ``seeds`` the
structured scores of the PPR seeds, ``similarity`` every structured score, ``text`` whole-note
BM25, ``graph`` PPR along the links, ``graph_undirected`` PPR along the links either way,
``time`` the notes near the time the question names relative to when it is asked
(:mod:`soulmem_torch.retrieve.when`; needs ``now``)."""


class DefaultPipelineConfig(BaseModel):
    """ShortOnly → Similarity → AssociateWithAction → fusion (docs/spec.md §7; the fusion is ours).

    ``fusion`` says how the per-query memory list is built from the stages' scores:

    * ``"max"`` — the original's merge: similarity seeds and PPR top-k, max per note, descending,
      cut to ``merge_top_k``.
    * ``"rank"`` — see :mod:`soulmem_torch.functional.fusion`.

    :meth:`original` is the original's pipeline exactly (its merge, its summed situation units,
    its sequential push): the parity configuration.
    """

    model_config = _FROZEN
    short_mem_with_history: ShortOnlyConfig = Field(
        default_factory=lambda: ShortOnlyConfig(include_summary=True)
    )
    similarity: SimilarityConfig = Field(default_factory=SimilarityConfig)
    assoc_with_action: AssociateWithActionConfig = Field(default_factory=AssociateWithActionConfig)
    merge_top_k: int = Field(default=10, ge=1, description="Length of the merged list.")
    fusion: Literal["rank", "max"] = Field(
        default="rank", description="How the stages' scores become one list (see the class)."
    )
    channels: tuple[FusionChannel, ...] = Field(
        default=("seeds", "text", "graph", "graph_undirected"),
        min_length=1,
        description="Channels the rank fusion reads (switch one off to see what it adds; "
        "('similarity', 'text', 'graph') is the first fused default).",
    )
    rank_constant: float = Field(
        default=5.0,
        gt=0.0,
        allow_inf_nan=False,
        description="k of reciprocal-rank fusion, Σ 1/(k + rank): how fast a channel's say "
        "falls with rank (larger → flatter).",
    )
    channel_weights: Literal["equal", "dispersion", "family"] = Field(
        default="equal",
        description="Rank fusion: 'equal' is plain reciprocal-rank fusion; 'dispersion' weighs "
        "each evidence family (the structured similarity and what derives from it — seeds, "
        "graph, graph both ways — and the text channel) per query by how far its best score "
        "stands above its mean, the most decided family 1 (functional.fusion."
        "score_dispersion); 'family' gives correlated channels one vote between them "
        "(similarity + seeds, graph + graph_undirected: 1/2 each). Both measured in "
        "benchmarks/RESULTS.md 'Conversations': better on long chat, worse on the original's "
        "suites, so not the default.",
    )
    seed_source: Literal["similarity", "fused"] = Field(
        default="similarity",
        description="Rank fusion: what picks the seeds (the PPR personalization and the "
        "'seeds' channel): the structured similarity (structured queries: SoulMem.query), or "
        "the reciprocal-rank fusion of the similarity and the text channel ('fused': what "
        "SoulMem.ask / MemoryBank.ask use for free-text questions, docs/spec.md §7).",
    )
    personalization: Literal["seeds", "first_stage", "text"] = Field(
        default="seeds",
        description="Rank fusion: what the graph channels' PPR starts from: the seeds (the "
        "relative cut below, as the original); 'first_stage': every note the first stage "
        "scores (the similarity, or with seed_source='fused' its fusion with the text "
        "channel), weighted by that score; 'text': every note the text channel scores, "
        "weighted by its BM25 score (a query without text evidence, or an agent without "
        "texts: the first stage). With either of the last two the graph spreads all the "
        "evidence along the links instead of pointing at the best note's neighbours; 'text' "
        "is what SoulMem.ask / MemoryBank.ask use for free-text questions (docs/spec.md §7). "
        "The seeds channel, the seed list and the actions keep the cut.",
    )
    seed_ratio: float = Field(
        default=0.9,
        ge=0.0,
        le=1.0,
        description="Seeds (of PPR and of the 'seeds' channel): notes whose structured score is "
        "at least this fraction of the query's best (at most similarity.max_results of them).",
    )

    @classmethod
    def for_questions(cls) -> DefaultPipelineConfig:
        """The default for free-text questions (``SoulMem.ask``, ``MemoryBank.ask``): the
        default with ``seed_source="fused"`` — a question has no fields for the structured
        similarity to match one by one, so its seeds come from the similarity and the text
        channel together — and ``channel_weights="family"``: the two graph channels, PPR one way and
        both ways, share one vote; and ``personalization="text"``: that PPR starts from every
        note the text channel scores (by its BM25 score), not only the seeds (docs/spec.md §7,
        DECISIONs "seeds of a question" and "what the graph starts from")."""
        return cls(seed_source="fused", channel_weights="family", personalization="text")

    @classmethod
    def original(cls) -> DefaultPipelineConfig:
        """The original's pipeline exactly: max merge, summed situation units, sequential push."""
        return cls(
            similarity=SimilarityConfig(situation_units="sum"),
            assoc_with_action=AssociateWithActionConfig(
                association=AssociationConfig(method=PprMethod.SEQUENTIAL)
            ),
            fusion="max",
        )

    def into_request(
        self,
        working_memory: MemorySource,
        query: Any,
        priority: int = 0,
        *,
        embedder: Any = None,
        device: Any = None,
        now: Any = None,
    ) -> DefaultPipelineRequest:
        """A pipeline request for one query (see ``DefaultPipelineRequest``); ``now``: when
        the question is asked (an aware datetime; the ``time`` channel reads it)."""

        return DefaultPipelineRequest(
            working_memory, query, priority, config=self, embedder=embedder, device=device, now=now
        )


RetrRequestConfig = Annotated[
    AssociationConfig
    | BayesActionConfig
    | AssociateWithActionConfig
    | ShortOnlyConfig
    | SimilarityConfig,
    Field(discriminator="type"),
]
"""Tagged union of the strategy configs (JSON field ``"type"``)."""

_ADAPTER: TypeAdapter[RetrRequestConfig] = TypeAdapter(RetrRequestConfig)


def parse_request_config(data: str | bytes | dict) -> RetrRequestConfig:
    """Any strategy config from JSON text or a dict with a ``"type"`` field."""
    if isinstance(data, (str, bytes)):
        return _ADAPTER.validate_json(data)
    return _ADAPTER.validate_python(data)

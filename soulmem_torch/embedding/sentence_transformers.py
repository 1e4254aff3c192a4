"""``SentenceTransformerEmbedder``: any sentence-transformers model as an ``Embedder``.

``sentence-transformers`` is optional (``pip install soulmem_torch[st]``) and imported only when
an embedder is built. For BGE v1.5 models, pass the model's retrieval instruction as
``query_prefix`` (the original prepends ``"为这个句子生成表示以用于检索相关文章："`` to every
query-side string of ``BAAI/bge-small-zh-v1.5``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from soulmem_torch.embedding.embedder import EmbedderUnavailableError
from soulmem_torch.errors import ValidationError

__all__ = ["BGE_ZH_QUERY_INSTRUCTION", "SentenceTransformerEmbedder"]

BGE_ZH_QUERY_INSTRUCTION = "为这个句子生成表示以用于检索相关文章："
"""Query instruction of the BGE v1.5 Chinese models (the original's ``QUERY_INSTRUCTION``)."""


class SentenceTransformerEmbedder:
    """Wraps ``sentence_transformers.SentenceTransformer`` (or an already built model).

    Args:
        model: a model name / path, or a ``SentenceTransformer`` instance.
        device: device for the model (``None`` = sentence-transformers' choice).
        batch_size: > 0. Encoding batch size.
        normalize: L2-normalize the outputs (cosine is scale-free, but normalized vectors keep
            mean-pooled fields well conditioned).
        query_prefix: prepended to every query-side string (``embed_query``).
        **model_kwargs: passed to ``SentenceTransformer(...)``.

    Raises:
        EmbedderUnavailableError: ``sentence-transformers`` is not installed.
    """

    def __init__(
        self,
        model: Any,
        *,
        device: str | torch.device | None = None,
        batch_size: int = 32,
        normalize: bool = True,
        query_prefix: str = "",
        **model_kwargs: Any,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValidationError(f"batch_size: expected an int > 0, found {batch_size!r}")
        if isinstance(model, str):
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise EmbedderUnavailableError(
                    "SentenceTransformerEmbedder needs the optional package sentence-transformers "
                    "(pip install 'soulmem_torch[st]' or pip install sentence-transformers); "
                    "HashingEmbedder works offline without it"
                ) from exc
            dev = None if device is None else str(device)
            model = SentenceTransformer(model, device=dev, **model_kwargs)
        if not callable(getattr(model, "encode", None)):
            raise ValidationError(
                f"model: expected a model name or a SentenceTransformer, found {type(model).__name__}"
            )
        self.model = model
        self.batch_size = batch_size
        self.normalize = normalize
        self.query_prefix = query_prefix
        get_dim = getattr(model, "get_sentence_embedding_dimension", None)
        dim = get_dim() if callable(get_dim) else None
        if dim is None:
            dim = int(self._encode(["dimension probe"]).shape[1])
        self.dim = int(dim)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(dim={self.dim}, query_prefix={self.query_prefix!r})"

    def _encode(self, texts: Sequence[str]) -> Tensor:
        out = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_tensor=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=False,
        )
        return torch.as_tensor(out).to(torch.float32)

    def __call__(self, texts: Sequence[str]) -> Tensor:
        """Document-side embeddings, ``(len(texts), dim)``."""
        return self._encode(texts)

    def embed_query(self, texts: Sequence[str]) -> Tensor:
        """Query-side embeddings: ``query_prefix + text``."""
        return self._encode([self.query_prefix + t for t in texts])

"""An OpenAI client's embeddings taken in their texts' order, by each vector's `index`.

OpenAI's embeddings API numbers each vector of its reply's `data` with the `index` of the text it
embeds, and a compatible server need not list them in that order. pydantic-ai (2.68) and the
openai client (3.57) take `data` in the order given: a server answering `[1, 0]` had each text
stored with the other one's vector. A provider whose client is OpenAI's gets its `embeddings`
resource replaced by `IndexOrderedEmbeddings`, which puts `data` in `index` order (and refuses a
reply that does not number each text once, or has not one vector per text; one that numbers
none is taken in its order, as before). Imported only when a provider's embedder is made:
it imports the openai package.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI
from openai.resources.embeddings import AsyncEmbeddings
from openai.types import CreateEmbeddingResponse

from ..usage import counted

__all__ = ["IndexOrderedEmbeddings", "order_by_index"]


class IndexOrderedEmbeddings(AsyncEmbeddings):
    """`AsyncEmbeddings` whose replies list their vectors in the order of the texts sent."""

    async def create(self, **arguments: Any) -> CreateEmbeddingResponse:
        """The reply of `AsyncEmbeddings.create`, its `data` sorted by `index`.

        A reply that leaves out any `index` (some compatible servers do) is taken in its order.
        `ValueError` when it has another number of vectors than texts were sent, or its indexes
        are not each of the texts' once (0 to texts - 1).
        """
        response = await super().create(**arguments)
        sent = arguments.get("input")
        texts = 1 if isinstance(sent, str) else len(sent) if isinstance(sent, list) else None
        if texts is not None and len(response.data) != texts:
            raise ValueError(
                f"the server answered {counted(len(response.data), 'vector')} for {counted(texts, 'text')}: "
                "each text must get one"
            )
        if any(getattr(item, "index", None) is None for item in response.data):
            return response
        indexes = [item.index for item in response.data]
        if sorted(indexes) != list(range(len(indexes))):
            shown = ", ".join(str(index) for index in indexes[:10]) + (", …" if len(indexes) > 10 else "")
            raise ValueError(
                f"the server numbered its {len(indexes)} vectors {shown}: "
                f"each text's index (0 to {len(indexes) - 1}) must come once"
            )
        if indexes != sorted(indexes):
            response.data = sorted(response.data, key=lambda item: item.index)
        return response


def order_by_index(provider: Any) -> Any:
    """`provider`, its OpenAI client's embeddings put in index order (any other client as it is)."""
    client = getattr(provider, "client", None)
    if isinstance(client, AsyncOpenAI) and not isinstance(client.embeddings, IndexOrderedEmbeddings):
        # `AsyncOpenAI.embeddings` is a cached property: the instance's own attribute takes its place
        client.embeddings = IndexOrderedEmbeddings(client)  # type: ignore[misc]
    return provider

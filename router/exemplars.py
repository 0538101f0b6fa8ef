"""Recent generation requests a sidecar proxied, kept so pre-warming can replay real requests.

Pre-warming must make the new replica's engine compute the *engine's* tokens for a hot prefix. The
sidecar's mirror only knows the fleet's word-tokenizer ids (CRC-32 of each word, up to 2**31), which
no real engine accepts as ``input_ids`` (vLLM refuses ids beyond its vocabulary). What does reproduce
the engine's cache is the request that filled it: its route and JSON body as the client sent them
(text, chat messages, or the client's own token ids), with its ``cache_salt`` (the tenant's cache
namespace, which the gateway writes into the body). So each sidecar keeps an :class:`ExemplarStore`
of recent requests, keyed by prompt (the newest request per distinct prompt and salt), bounded in
bytes with least-recently-used eviction; ``GET /prefixfleet/prefix/{hash}`` answers with the newest
one whose prompt starts with the prefix (:meth:`ExemplarStore.holding`): a client's prompt, so that
route needs the fleet's control token (router.control).

No header is kept: ``Authorization`` and every other credential stay out of the store. Pure data
structure, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_EXEMPLAR_BYTES = 16 * 1024 * 1024
# Fixed cost counted per exemplar on top of its body and tokens (object headers, dict slot, key
# tuple): a store of tiny prompts is bounded too.
EXEMPLAR_OVERHEAD_BYTES = 256
# A lookup compares at most this many exemplars, newest first (each a C-level bytes.startswith):
# the autoscaler's warm request asks for up to 64 hashes, each must answer in milliseconds.
MAX_SCAN = 20_000


@dataclass(frozen=True, slots=True)
class Exemplar:
    """One proxied generation request: its route, the body as received, the mirror namespace its
    prompt was cached under (its cache salt, None: unsalted; a ``mirror.AdapterNamespace`` for a
    request naming a LoRA adapter, so a base-model request never stands in for an adapter's) and
    the prompt's mirror tokens (little-endian uint32 bytes, the sidecar's own tokenizer: used to
    find it by prefix, never sent to an engine)."""

    path: str
    body: bytes
    salt: object
    token_bytes: bytes

    @property
    def size(self) -> int:
        # the namespace's size is bounded by the body that named it, already counted
        fields = len(self.path) + len(self.body) + len(self.token_bytes)
        return fields + EXEMPLAR_OVERHEAD_BYTES


class ExemplarStore:
    """At most ``max_bytes`` of exemplars (:attr:`Exemplar.size`), least recently used evicted first;
    ``max_bytes`` 0 keeps nothing. One exemplar per (salt, prompt tokens): a repeat replaces it."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be 0 or more, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[tuple[object, bytes], Exemplar] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def record(self, path: str, body: bytes, salt: object, token_bytes: bytes) -> bool:
        """Keep this request as the newest exemplar of its prompt; False when it is not kept (the
        store is off, or the request alone is larger than the whole store)."""
        exemplar = Exemplar(path, body, salt, token_bytes)
        size = exemplar.size
        if size > self.max_bytes or not token_bytes:
            return False
        key = (salt, token_bytes)
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        self._items[key] = exemplar
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self.bytes -= evicted.size
        return True

    def holding(self, prefix: bytes, salt: object) -> Exemplar | None:
        """The most recent exemplar under ``salt`` whose prompt starts with the token bytes
        ``prefix`` (None when none does among the newest :data:`MAX_SCAN`); it becomes the most
        recently used."""
        if not prefix:
            return None
        for scanned, (key, exemplar) in enumerate(reversed(self._items.items())):
            if scanned >= MAX_SCAN:
                return None
            if exemplar.salt == salt and exemplar.token_bytes.startswith(prefix):
                self._items.move_to_end(key)
                return exemplar
        return None

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

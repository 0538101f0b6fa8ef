"""The worker cache summary: what a sidecar publishes about its engine's KV cache (format v1).

Wire format (binary, little-endian; documented in docs/redis.md)::

    b"PFS" + u8 format version (1)
    u32  header length H
    H bytes  header: UTF-8 JSON object (scalars + the top-K hot nodes, see :class:`Summary`)
    8*n bytes  n = header["num_blocks"] chained block hashes (u64), sorted ascending

The block-hash set names every full block cached on the worker (see :mod:`.blockhash`), so a reader
finds a request's longest cached prefix by hashing the request the same way and walking its chain
until the first hash that is absent. When the set is capped, the most recently used blocks are kept;
because a block is never more recent than its parent the kept set stays prefix-closed.
Never raw text or token ids: only hashes, counts and times.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
import math
import operator
import struct
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .blockhash import extend_chain
from .little_endian import pack_le, unpack_le
from .radix import TOKEN_BYTES, RadixNode, RadixTree

FORMAT_VERSION = 1
MAGIC = b"PFS"
_HEAD = struct.Struct("<3sBI")
DEFAULT_MAX_BLOCKS = 32768  # 256 KiB of hashes: ~0.5M tokens at 16-token blocks
DEFAULT_HOT_K = 32
# Wider numbers cannot be honest counts and overflow float arithmetic downstream (also the bound of
# the JSON records beside a summary).
MAX_RECORD_INT = 2**63 - 1


class SummaryError(ValueError):
    """A summary (or load record) that cannot be decoded; readers skip it with a warning."""


@dataclass(frozen=True, slots=True)
class HotNode:
    """One hashed prefix node: the prefix of ``tokens`` tokens whose last full block hashes to ``hash``."""

    hash: int
    tokens: int
    hits: int
    last_access: float  # unix seconds (approximate: the sidecar maps tree ticks to wall time)


@dataclass(frozen=True, slots=True)
class Summary:
    worker: str
    version: int
    generated_at: float
    block_tokens: int
    identity_seed: int
    cached_tokens: int
    capacity_tokens: int
    blocks: array = field(compare=False)  # array('Q'), sorted ascending
    hot: tuple[HotNode, ...] = ()
    truncated: bool = False  # the block set was capped

    def has_block(self, block_hash: int) -> bool:
        blocks = self.blocks
        i = bisect.bisect_left(blocks, block_hash)
        return i < len(blocks) and blocks[i] == block_hash

    def matched_blocks(self, hashes: Iterable[int]) -> int:
        """Leading blocks of a request's chain present here (stop at the first absent one)."""
        n = 0
        for h in hashes:
            if not self.has_block(h):
                break
            n += 1
        return n


def _sorted_blocks(values: Iterable[int]) -> array:
    return array("Q", sorted(set(values)))


def make_summary(
    *,
    worker: str,
    version: int,
    generated_at: float,
    block_tokens: int,
    identity_seed: int,
    cached_tokens: int,
    capacity_tokens: int,
    blocks: Iterable[int],
    hot: Iterable[HotNode] = (),
    truncated: bool = False,
) -> Summary:
    return Summary(
        worker=worker,
        version=version,
        generated_at=generated_at,
        block_tokens=block_tokens,
        identity_seed=identity_seed,
        cached_tokens=cached_tokens,
        capacity_tokens=capacity_tokens,
        blocks=_sorted_blocks(blocks),
        hot=tuple(hot),
        truncated=truncated,
    )


# -- encode / decode -----------------------------------------------------------------------------


def encode_summary(summary: Summary) -> bytes:
    header = {
        "worker": summary.worker,
        "version": summary.version,
        "generated_at": summary.generated_at,
        "block_tokens": summary.block_tokens,
        "identity_seed": f"{summary.identity_seed:016x}",
        "cached_tokens": summary.cached_tokens,
        "capacity_tokens": summary.capacity_tokens,
        "num_blocks": len(summary.blocks),
        "truncated": summary.truncated,
        "hot": [
            {"h": f"{n.hash:016x}", "tokens": n.tokens, "hits": n.hits, "last_access": n.last_access}
            for n in summary.hot
        ],
    }
    head_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return _HEAD.pack(MAGIC, FORMAT_VERSION, len(head_bytes)) + head_bytes + pack_le(summary.blocks)


def _field(obj: dict, name: str, kind: type | tuple[type, ...], where: str = "summary") -> object:
    value = obj.get(name)
    # bool is an int subclass: never accept it where a number is meant
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise SummaryError(f"{where}: field {name!r} missing or not {_kind_name(kind)}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_RECORD_INT:
        raise SummaryError(f"{where}: field {name!r} is larger than {MAX_RECORD_INT}")
    return value


def finite_field(value: float, name: str, where: str) -> float:
    """A decoded number as a finite float: Python's json reads ``NaN``, ``Infinity`` and ``1e400``
    (infinite), and NaN compares false with everything, so one such field would poison every
    freshness comparison and the routing arithmetic that read it. Records use it too."""
    value = float(value)
    if not math.isfinite(value):
        raise SummaryError(f"{where}: field {name!r} must be a finite number, got {value!r}")
    return value


def _unix_time(obj: dict, name: str, where: str = "summary") -> float:
    return finite_field(_field(obj, name, (int, float), where), name, where)  # type: ignore[arg-type]


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return "/".join(k.__name__ for k in _as_tuple(kind))


def _hex64(value: object, name: str) -> int:
    if not isinstance(value, str) or len(value) != 16:
        raise SummaryError(f"summary: {name} must be 16 hex digits")
    try:
        return int(value, 16)
    except ValueError:
        raise SummaryError(f"summary: {name} must be 16 hex digits") from None


def _non_negative(value: int | float, name: str) -> None:
    if value < 0:
        raise SummaryError(f"summary: {name} must not be negative")


def decode_summary(data: bytes) -> Summary:
    """Parse and validate a summary; anything malformed raises :class:`SummaryError`."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SummaryError("summary must be bytes")
    # A view, not a copy: the block hashes (up to 256 KiB) are then copied once, into the array.
    with memoryview(data) as view:
        if not view.c_contiguous:
            raise SummaryError("summary must be contiguous bytes")
        with view.cast("B") as raw:
            return _decode_summary(raw)


def _decode_summary(data: memoryview) -> Summary:
    if len(data) < _HEAD.size:
        raise SummaryError(f"summary too short ({len(data)} bytes)")
    magic, version, head_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise SummaryError("not a prefixfleet summary (bad magic)")
    if version != FORMAT_VERSION:
        raise SummaryError(
            f"unsupported summary format version {version} (this reader knows {FORMAT_VERSION})"
        )
    end = _HEAD.size + head_len
    if end > len(data):
        raise SummaryError("summary header length exceeds the data")
    try:
        header = json.loads(str(data[_HEAD.size : end], "utf-8"))
    except ValueError as exc:  # also an integer of over 4300 digits
        raise SummaryError(f"summary header is not JSON: {exc}") from None
    except RecursionError:  # e.g. "[[[[...": the C scanner gives up on deep nesting
        raise SummaryError("summary header: JSON nested too deeply") from None
    if not isinstance(header, dict):
        raise SummaryError("summary header must be a JSON object")
    worker = _field(header, "worker", str)
    ver = _field(header, "version", int)
    generated_at = _unix_time(header, "generated_at")
    block_tokens = _field(header, "block_tokens", int)
    seed = _hex64(header.get("identity_seed"), "identity_seed")
    cached = _field(header, "cached_tokens", int)
    capacity = _field(header, "capacity_tokens", int)
    num_blocks = _field(header, "num_blocks", int)
    truncated = _field(header, "truncated", bool)
    hot_raw = _field(header, "hot", list)
    assert isinstance(block_tokens, int) and isinstance(num_blocks, int)
    for name, value in (("version", ver), ("cached_tokens", cached), ("capacity_tokens", capacity)):
        _non_negative(value, name)  # type: ignore[arg-type]
    if block_tokens <= 0:
        raise SummaryError("summary: block_tokens must be positive")
    if num_blocks < 0 or len(data) - end != 8 * num_blocks:
        raise SummaryError(f"summary: {len(data) - end} bytes of block hashes for num_blocks={num_blocks}")
    blocks = unpack_le("Q", data[end:])
    # strictly increasing, checked at C speed (a Python-level loop cost ms per big summary)
    if not all(map(operator.lt, blocks, itertools.islice(blocks, 1, None))):
        raise SummaryError("summary: block hashes must be sorted ascending without duplicates")
    hot: list[HotNode] = []
    for i, item in enumerate(hot_raw):  # type: ignore[arg-type]
        if not isinstance(item, dict):
            raise SummaryError(f"summary: hot[{i}] must be an object")
        where = f"summary hot[{i}]"
        node = HotNode(
            hash=_hex64(item.get("h"), f"hot[{i}].h"),
            tokens=_field(item, "tokens", int, where),  # type: ignore[arg-type]
            hits=_field(item, "hits", int, where),  # type: ignore[arg-type]
            last_access=_unix_time(item, "last_access", where),
        )
        if node.tokens < 0 or node.hits < 0:
            raise SummaryError(f"{where}: tokens and hits must not be negative")
        hot.append(node)
    return Summary(
        worker=worker,  # type: ignore[arg-type]
        version=ver,  # type: ignore[arg-type]
        generated_at=generated_at,
        block_tokens=block_tokens,
        identity_seed=seed,
        cached_tokens=cached,  # type: ignore[arg-type]
        capacity_tokens=capacity,  # type: ignore[arg-type]
        blocks=blocks,
        hot=tuple(hot),
        truncated=truncated,  # type: ignore[arg-type]
    )


# -- building a summary from a worker's radix tree ------------------------------------------------


@dataclass(frozen=True, slots=True)
class HotPrefix:
    """A hot node's actual prefix, kept in the sidecar only (never published): for pre-warming."""

    namespace: object
    token_bytes: bytes


def _prefix_bytes(node: RadixNode) -> bytes:
    parts: list[bytes] = []
    cur: RadixNode | None = node
    while cur is not None and cur.parent is not None:
        parts.append(cur.edge)
        cur = cur.parent
    return b"".join(reversed(parts))


def build_summary(
    tree: RadixTree,
    *,
    worker: str,
    version: int,
    now: float,
    identity_seed: int,
    block_tokens: int,
    namespace_seed: Callable[[object], int],
    wall_time_of: Callable[[int], float],
    max_blocks: int = DEFAULT_MAX_BLOCKS,
    hot_k: int = DEFAULT_HOT_K,
) -> tuple[Summary, dict[int, HotPrefix]]:
    """Hash every full cached block of ``tree`` (all namespaces) into a :class:`Summary`.

    ``namespace_seed(ns)`` gives block 0's seed for a namespace (identity seed, salted per tenant);
    ``wall_time_of(tick)`` maps the tree's logical access ticks to unix seconds. Also returns the
    hot nodes' real prefixes for the sidecar's own use (pre-warm export); those stay in the process.
    A live sidecar keeps the same result current incrementally (:class:`BlockIndex`); this full build
    is its reference and serves the simulator's elastic fleet.
    """
    # per node: (last_access, index of its first new block, its block hashes). A node is never more
    # recent than its parent, so taking nodes by (recency desc, depth asc) keeps a capped set closed.
    per_node: list[tuple[int, int, list[int]]] = []
    total = 0
    # per hot-node candidate: hash -> (hits, last_access, tokens, node, namespace)
    candidates: dict[int, tuple[int, int, int, RadixNode, object]] = {}
    step = block_tokens
    for ns in tree.namespaces():
        root = tree.root(ns)
        seed = namespace_seed(ns)
        stack: list[tuple[RadixNode, int, bytes, int]] = [(c, seed, b"", 0) for c in root.children.values()]
        while stack:
            node, prev_hash, leftover, start = stack.pop()
            hashes, rest = extend_chain(prev_hash, leftover, node.edge, step)
            end = start + node.num_tokens
            if hashes:
                first_block = (start - len(leftover) // TOKEN_BYTES) // step
                per_node.append((node.last_access, first_block, hashes))
                total += len(hashes)
            last_hash = hashes[-1] if hashes else prev_hash
            floored = (end // step) * step
            if floored > 0:
                prev = candidates.get(last_hash)
                if prev is None or node.hits > prev[0]:
                    candidates[last_hash] = (node.hits, node.last_access, floored, node, ns)
            stack.extend((c, last_hash, rest, end) for c in node.children.values())
    truncated = total > max_blocks
    blocks: list[int] = []
    if truncated:
        per_node.sort(key=lambda e: (-e[0], e[1]))
        for _tick, _first, hashes in per_node:
            room = max_blocks - len(blocks)
            if room <= 0:
                break
            blocks.extend(hashes[:room])
    else:
        for _tick, _first, hashes in per_node:
            blocks.extend(hashes)
    top = heapq.nlargest(hot_k, candidates.items(), key=lambda kv: (kv[1][0], kv[1][1]))
    hot = tuple(
        HotNode(hash=h, tokens=tokens, hits=hits, last_access=wall_time_of(tick))
        for h, (hits, tick, tokens, _node, _ns) in top
    )
    exports = {
        h: HotPrefix(ns, _prefix_bytes(node)[: tokens * TOKEN_BYTES])
        for h, (_hits, _tick, tokens, node, ns) in top
    }
    summary = make_summary(
        worker=worker,
        version=version,
        generated_at=now,
        block_tokens=block_tokens,
        identity_seed=identity_seed,
        cached_tokens=tree.cached_tokens,
        capacity_tokens=tree.capacity_tokens,
        blocks=blocks,
        hot=hot,
        truncated=truncated,
    )
    return summary, exports


# -- keeping a summary current as the tree changes -------------------------------------------------


def _patched(blocks: array, added: list[int], removed: list[int]) -> array:
    """``blocks`` (sorted, distinct) without ``removed`` (all present) and with ``added`` (all
    absent); both lists sorted."""
    if removed:
        kept = array("Q")
        start = 0
        for h in removed:
            i = bisect.bisect_left(blocks, h, start)
            kept.extend(blocks[start:i])
            start = i + 1
        kept.extend(blocks[start:])
        blocks = kept
    if added:
        merged = array("Q")
        start = 0
        for h in added:
            i = bisect.bisect_left(blocks, h, start)
            merged.extend(blocks[start:i])
            merged.append(h)
            start = i
        merged.extend(blocks[start:])
        blocks = merged
    return blocks


_RANK = operator.attrgetter("hits", "last_access")
# Touched paths kept between two summaries before the index gives up and ranks every node: a sidecar
# without Redis builds none, and its set must not grow with every request it serves
_MAX_TOUCHED = 4096
_first = operator.itemgetter(0)


class _Indexed:
    """One tree node's share of the summary: the blocks whose last token lies on its edge."""

    __slots__ = ("end", "first_block", "hashes", "last_hash", "namespace", "rest", "start")

    def __init__(
        self,
        namespace: object,
        start: int,
        end: int,
        first_block: int,
        hashes: list[int],
        rest: bytes,
        last_hash: int,
    ) -> None:
        self.namespace = namespace
        self.start = start  # prefix length (tokens) where the node's edge begins
        self.end = end
        self.first_block = first_block  # index of the first block it completes
        self.hashes = hashes
        self.rest = rest  # bytes of the partial block left open at ``end``
        self.last_hash = last_hash  # hash of the last full block ending at or before ``end``


class BlockIndex:
    """Every cached node's block hashes, kept as the tree changes, so a summary needs no tree walk.

    :func:`build_summary` hashes the whole tree per summary (milliseconds per thousand prompts, on
    the sidecar's event loop). The index instead hashes each node once, when it appears: the owner
    calls :meth:`track_path` after an insert (new nodes, and a split edge's lower half, lie on or
    under the inserted path), :meth:`drop_detached` notices evicted nodes (the tree detaches them),
    and :meth:`clear` follows a flush. The set of block hashes is kept as reference counts (two
    namespaces may share a seed, hence a hash) plus a sorted array patched at each summary; the hot
    nodes are the nodes completing a block, ranked from their live hit counts. The result equals
    :func:`build_summary` of the same tree (a property test holds the two together) as long as every
    insert into the tree is followed by :meth:`track_path` (evictions and touches need no call).
    """

    def __init__(self, tree: RadixTree, block_tokens: int, namespace_seed: Callable[[object], int]) -> None:
        self.tree = tree
        self.block_tokens = block_tokens
        self.namespace_seed = namespace_seed
        self._nodes: dict[RadixNode, _Indexed] = {}
        self._refs: dict[int, int] = {}  # block hash -> nodes completing it
        self._owners: dict[int, list[RadixNode]] = {}  # a node's last own block hash -> such nodes
        self._shared = 0  # hashes with more than one such node (namespaces sharing a seed)
        self._total = 0  # block hashes over all nodes, duplicates included (the cap counts these)
        self._sorted = array("Q")  # distinct hashes, sorted, as of the last summary
        self._added: set[int] = set()  # distinct hashes gained / lost since then
        self._removed: set[int] = set()
        self._evictions_seen = tree.evictions_total
        # The hot ranking, kept between summaries (see _ranked_since): the last summary's top nodes,
        # and the deepest node of each path touched since (None: too many, or a flush: rank all)
        self._ranked: list[RadixNode] | None = None
        self._ranked_k = 0  # the hot_k it was ranked for
        self._touched: set[RadixNode] | None = set()
        self.full_rankings = 0  # summaries that ranked every node (a figure for tests, no behaviour)

    def clear(self) -> None:
        self._nodes.clear()
        self._refs.clear()
        self._owners.clear()
        self._shared = 0
        self._total = 0
        self._sorted = array("Q")
        self._added.clear()
        self._removed.clear()
        self._evictions_seen = self.tree.evictions_total
        self._ranked = None
        self._touched = set()

    def __len__(self) -> int:
        return len(self._nodes)

    # -- following the tree ----------------------------------------------------------------------

    def touched(self, node: RadixNode) -> None:
        """A match or insert just touched the path from ``node``'s root down to ``node`` (the
        deepest node it reached): the nodes whose rank may have risen since the last summary."""
        touched = self._touched
        if touched is not None:
            touched.add(node)
            if len(touched) > _MAX_TOUCHED:  # no summary for long (no Redis): rank all next time
                self._touched = None

    def track_path(self, node: RadixNode) -> None:
        """Index the nodes from ``node``'s root down to ``node`` that are new since the last call."""
        path: list[RadixNode] = []
        cur: RadixNode | None = node
        nodes = self._nodes
        while cur is not None and cur.parent is not None:
            info = nodes.get(cur)
            if info is not None and info.end - info.start == cur.num_tokens:
                break  # indexed and unchanged, and so is everything above it
            path.append(cur)
            cur = cur.parent
        for n in reversed(path):
            self._index(n)
            for child in n.children.values():
                info = nodes.get(child)
                if info is not None and info.end - info.start != child.num_tokens:
                    self._index(child)  # the lower half of a split edge: its first blocks moved up

    def _index(self, node: RadixNode) -> None:
        parent = node.parent
        assert parent is not None
        above = self._nodes.get(parent)
        if above is None:  # a namespace root: the chain starts from the namespace's seed
            namespace = self.tree.namespace_of(parent)
            start, prev_hash, leftover = 0, self.namespace_seed(namespace), b""
        else:
            namespace, start, prev_hash, leftover = above.namespace, above.end, above.last_hash, above.rest
        hashes, rest = extend_chain(prev_hash, leftover, node.edge, self.block_tokens)
        end = start + node.num_tokens
        first_block = (start - len(leftover) // TOKEN_BYTES) // self.block_tokens
        last_hash = hashes[-1] if hashes else prev_hash
        fresh = _Indexed(namespace, start, end, first_block, hashes, rest, last_hash)
        old = self._nodes.get(node)
        self._nodes[node] = fresh
        self._count(node, fresh, +1)  # gain before loss: a moved block never drops to zero refs
        if old is not None:
            self._count(node, old, -1)

    def _count(self, node: RadixNode, info: _Indexed, sign: int) -> None:
        refs, added, removed = self._refs, self._added, self._removed
        for h in info.hashes:
            n = refs.get(h, 0) + sign
            if n > 0:
                refs[h] = n
                if n == 1 and sign > 0:
                    if h in removed:
                        removed.discard(h)
                    else:
                        added.add(h)
            else:
                del refs[h]
                if h in added:
                    added.discard(h)
                else:
                    removed.add(h)
        self._total += sign * len(info.hashes)
        if info.hashes:
            owners = self._owners.setdefault(info.last_hash, [])
            if sign > 0:
                owners.append(node)
                if len(owners) == 2:
                    self._shared += 1
            else:
                owners.remove(node)
                if len(owners) == 1:
                    self._shared -= 1
                elif not owners:
                    del self._owners[info.last_hash]

    def drop_detached(self) -> None:
        """Forget nodes the tree evicted since the last call (an eviction detaches a node)."""
        if self.tree.evictions_total == self._evictions_seen:
            return
        missing = self.tree.evictions_total - self._evictions_seen
        self._evictions_seen = self.tree.evictions_total
        # Every evicted node was indexed, so the scan may stop once it found as many as the tree
        # evicted; they are least recently used, so mostly early in the (insertion-ordered) index.
        gone: list[tuple[RadixNode, _Indexed]] = []
        for node, info in self._nodes.items():
            if node.parent is None:
                gone.append((node, info))
                if len(gone) == missing:
                    break
        for node, info in gone:
            del self._nodes[node]
            self._count(node, info, -1)

    # -- the summary -----------------------------------------------------------------------------

    def _sorted_hashes(self) -> array:
        """The distinct block hashes, sorted: last summary's array patched with what changed since.

        Patching works on the packed array (bisect for positions, C-level copies of the runs between
        them): a pass over every hash as a Python int costs ~0.3 µs each on a busy machine.
        """
        added, removed = self._added, self._removed
        if len(added) + len(removed) > len(self._sorted) // 4:
            self._sorted = array("Q", sorted(self._refs))
        elif added or removed:
            self._sorted = _patched(self._sorted, sorted(added), sorted(removed))
        added.clear()
        removed.clear()
        return self._sorted

    def _capped(self, max_blocks: int) -> list[int]:
        """The most recently used blocks when they do not all fit (as :func:`build_summary`)."""
        # (recency desc, depth asc); no two nodes tie on both, so the lists are never compared
        per_node = [
            (node.last_access, -info.first_block, info.hashes)
            for node, info in self._nodes.items()
            if info.hashes
        ]
        per_node.sort(reverse=True)
        blocks: list[int] = []
        for _tick, _first, hashes in per_node:
            room = max_blocks - len(blocks)
            if room <= 0:
                break
            blocks.extend(hashes[:room])
        return sorted(set(blocks))

    def _candidate(self, nodes: list[RadixNode], order: dict[object, int]) -> RadixNode:
        """Among nodes completing the same block hash (namespaces sharing a seed): most hits, then
        the first namespace in ``order``, as a walk in namespace order would pick."""
        if len(nodes) == 1:
            return nodes[0]
        return max(nodes, key=lambda n: (n.hits, -order[self._nodes[n].namespace]))

    def _ranks(self, node: RadixNode) -> bool:
        """Whether ``node`` is one the hot ranking looks at (no namespaces sharing a seed): in the
        tree, completing a block, and the node its last block's hash is kept for."""
        info = self._nodes.get(node)
        if info is None or not info.hashes or node.parent is None:
            return False
        owners = self._owners.get(info.last_hash)
        return owners is not None and owners[0] is node

    def _ranked_since(self, hot_k: int) -> list[RadixNode] | None:
        """The top ``hot_k`` nodes by (hits, recency) from the last summary's top and the paths
        touched since, without ranking every node; None when that cannot be known so.

        A node's (hits, last_access) changes only when a match or insert touches it, and every node
        so touched (a new leaf, the upper half of a split edge included) lies on the path from the
        root to the deepest node that operation reached, which the mirror hands to :meth:`touched`;
        a node starts completing a block only when indexed, on such a path too. So a node that was
        outside the last top and has not been touched since is still outranked by every node of
        that top; as long as all of them still rank, the new top is among them and the touched
        paths. Otherwise (one was evicted, withdrawn or split off its block, a touched node left
        the tree, too many touches, or a flush), None: rank every node. Two nodes never tie (one
        operation's tick goes to one path, whose hits fall strictly from the root down); were two
        candidates to tie, the full ranking, which breaks ties by position, is asked too."""
        last, touched = self._ranked, self._touched
        # (a top of fewer than hot_k nodes held every node that ranked then)
        if last is None or touched is None or hot_k > self._ranked_k:
            return None
        if not all(map(self._ranks, last)):
            return None
        candidates = set(last)
        seen: set[RadixNode] = set()
        for node in touched:
            if node.parent is None:
                return None  # left the tree since: the ancestors it was touched with are unknown
            cur: RadixNode | None = node
            while cur is not None and cur.parent is not None and cur not in seen:
                seen.add(cur)
                if self._ranks(cur):
                    candidates.add(cur)
                cur = cur.parent
        keys = set(map(_RANK, candidates))
        if len(keys) != len(candidates):
            return None
        return heapq.nlargest(hot_k, candidates, key=_RANK)

    def summary(
        self,
        *,
        worker: str,
        version: int,
        now: float,
        identity_seed: int,
        wall_time_of: Callable[[int], float],
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        hot_k: int = DEFAULT_HOT_K,
    ) -> tuple[Summary, dict[int, HotPrefix]]:
        """The summary :func:`build_summary` would give for the tree now, from the index."""
        self.drop_detached()
        truncated = self._total > max_blocks
        blocks = array("Q", self._capped(max_blocks)) if truncated else self._sorted_hashes()
        # A node that completes no block ties its hash with an ancestor that has strictly more hits
        # (an ancestor is touched whenever a descendant is), so the hot candidates are exactly the
        # nodes completing a block, ranked by (hits, recency) as the walk ranks them.
        if self._shared:
            order = {ns: i for i, ns in enumerate(self.tree.namespaces())}
            candidates = [(h, self._candidate(nodes, order)) for h, nodes in self._owners.items()]
            top = heapq.nlargest(hot_k, candidates, key=lambda hn: (hn[1].hits, hn[1].last_access))
        else:
            ranked = self._ranked_since(hot_k)
            if ranked is None:
                # One node per hash: rank the nodes with a C-level key, newest first so that the
                # many nodes tying on hits with a newer one are rejected without entering the heap.
                ranked = heapq.nlargest(hot_k, map(_first, reversed(self._owners.values())), key=_RANK)
                self.full_rankings += 1
            top = [(self._nodes[node].last_hash, node) for node in ranked]
        self._ranked = None if self._shared else [node for _h, node in top]
        self._ranked_k = hot_k
        self._touched = set()
        step = self.block_tokens
        hot: list[HotNode] = []
        exports: dict[int, HotPrefix] = {}
        for h, node in top:
            info = self._nodes[node]
            tokens = (info.end // step) * step
            hot.append(
                HotNode(hash=h, tokens=tokens, hits=node.hits, last_access=wall_time_of(node.last_access))
            )
            exports[h] = HotPrefix(info.namespace, _prefix_bytes(node)[: tokens * TOKEN_BYTES])
        summary = Summary(
            worker=worker,
            version=version,
            generated_at=now,
            block_tokens=step,
            identity_seed=identity_seed,
            cached_tokens=self.tree.cached_tokens,
            capacity_tokens=self.tree.capacity_tokens,
            blocks=blocks,
            hot=tuple(hot),
            truncated=truncated,
        )
        return summary, exports

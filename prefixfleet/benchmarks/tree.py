"""``prefixfleet bench tree``: the prefix index against the seed lab's tree algorithm.

Workload (deterministic from ``seed``): prompts of ``prompt_tokens`` tokens, each sharing a prefix of
random depth with a random earlier prompt and ending in fresh tokens, are inserted until the tree
holds at least ``min_nodes`` nodes. Both trees are pre-populated with the same prompts, then their
capacity is set to exactly what they hold, so every timed operation that adds tokens also evicts
LRU leaves. A timed operation is ``match_prefix`` + ``insert`` of one new prompt that shares a prefix
with a pre-populated one. The lab algorithm is far slower, so it runs the first ``lab_ops`` of the
same operations.

Memory is what ``tracemalloc`` sees retained by building each tree (token ids arriving as
``array('I')`` for ours, as tuples of Python ints for the lab, both converted inside the traced
region), cross-checked for ours with :meth:`RadixTree.memory_bytes`.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from prefixfleet.benchmarks.lab_tree import LabTree
from prefixfleet.cli import DefaultsHelpFormatter
from prefixfleet.router.radix import TOKEN_BYTES, RadixTree, as_token_bytes

UNBOUNDED_TOKENS = 2**62  # capacity while pre-populating: nothing is evicted until timing starts


@dataclass(frozen=True)
class TreeBenchSettings:
    min_nodes: int = 10_000
    prompt_tokens: int = 4096
    ops: int = 2_000
    lab_ops: int = 30
    seed: int = 0
    vocab: int = 128_000
    brand_new_share: float = 0.02  # prompts that share nothing (new top-level branches)

    def validate(self) -> None:
        for name in ("min_nodes", "prompt_tokens", "ops", "lab_ops", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.lab_ops > self.ops:
            raise ValueError(f"lab_ops ({self.lab_ops}) must not exceed ops ({self.ops})")


# -- workload -------------------------------------------------------------------------------


def _fresh_tokens(rng: random.Random, count: int, vocab: int) -> array:
    raw = array("I", rng.randbytes(count * TOKEN_BYTES))
    return array("I", (t % vocab for t in raw))


def next_prompt(rng: random.Random, bases: list[array], settings: TreeBenchSettings) -> array:
    """A prompt sharing a random-depth prefix (mostly deep) with one of ``bases``."""
    n = settings.prompt_tokens
    if not bases or rng.random() < settings.brand_new_share:
        return _fresh_tokens(rng, n, settings.vocab)
    base = bases[rng.randrange(len(bases))]
    shared = int(n * rng.random() ** 0.15)  # mean ~87% shared, every depth possible
    return base[:shared] + _fresh_tokens(rng, n - shared, settings.vocab)


def populate_prompts(
    rng: random.Random, settings: TreeBenchSettings, progress: bool
) -> tuple[list[array], RadixTree]:
    """Prompts to pre-populate with: enough for ``min_nodes`` nodes (counted on a scratch tree)."""
    prompts: list[array] = []
    scratch = RadixTree(UNBOUNDED_TOKENS)
    with tqdm(
        total=settings.min_nodes, desc="workload (nodes)", unit="node", file=sys.stderr, disable=not progress
    ) as bar:
        while scratch.node_count < settings.min_nodes:
            prompt = next_prompt(rng, prompts, settings)
            prompts.append(prompt)
            scratch.insert(prompt)
            bar.update(min(scratch.node_count, settings.min_nodes) - bar.n)
    return prompts, scratch


# -- measurement ----------------------------------------------------------------------------


def _traced_build(build: Any) -> tuple[Any, int]:
    """Run ``build()`` under tracemalloc; return its result and the bytes it still holds."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        built = build()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    return built, held


def _percentile_us(latencies_ns: list[int], q: float) -> float:
    ordered = sorted(latencies_ns)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] / 1000.0


def _side_report(
    latencies_ns: list[int], nodes: int, tokens: int, held_bytes: int, after: tuple[int, int, int]
) -> dict[str, Any]:
    seconds = sum(latencies_ns) / 1e9
    return {
        "ops": len(latencies_ns),
        "ops_per_s": len(latencies_ns) / seconds,
        "mean_us": sum(latencies_ns) / len(latencies_ns) / 1000.0,
        "p50_us": _percentile_us(latencies_ns, 0.50),
        "p99_us": _percentile_us(latencies_ns, 0.99),
        "nodes": nodes,
        "cached_tokens": tokens,
        "bytes_total": held_bytes,
        "bytes_per_node": held_bytes / nodes,
        "bytes_per_token": held_bytes / tokens,
        # what a node costs beyond its 4-byte token ids (the information itself)
        "overhead_bytes_per_node": (held_bytes - TOKEN_BYTES * tokens) / nodes,
        "nodes_after_ops": after[0],
        "cached_tokens_after_ops": after[1],
        "evicted_tokens_during_ops": after[2],
    }


def max_node_depth(tree: RadixTree) -> int:
    """Nodes on the longest root-to-leaf path (default namespace)."""
    deepest = 0
    stack = [(1, child) for child in tree.root().children.values()]
    while stack:
        level, node = stack.pop()
        deepest = max(deepest, level)
        stack.extend((level + 1, child) for child in node.children.values())
    return deepest


@dataclass
class LabTiming:
    built: tuple[int, int]  # (nodes, cached tokens) before the timed operations
    latencies_ns: list[int]


def _time_lab_ops(lab: LabTree, ops: list[array], progress: bool) -> LabTiming:
    built = (lab.node_count(), lab.cached_tokens)
    lab.capacity_tokens = lab.cached_tokens  # full, as for ours
    inputs = [tuple(p) for p in ops]  # the lab's native input; conversion not timed
    latencies: list[int] = []
    for prompt in tqdm(inputs, desc="time lab ops", file=sys.stderr, disable=not progress):
        start = time.perf_counter_ns()
        lab.match_prefix(prompt)
        lab.insert(prompt)
        latencies.append(time.perf_counter_ns() - start)
    return LabTiming(built, latencies)


def run_tree_benchmark(settings: TreeBenchSettings, progress: bool = True) -> dict[str, Any]:
    """Build both trees from the same prompts, time the same operations, return the report."""
    settings.validate()
    rng = random.Random(settings.seed)
    prompts, scratch = populate_prompts(rng, settings, progress)
    ops = [next_prompt(rng, prompts, settings) for _ in range(settings.ops)]

    def build_ours() -> RadixTree:
        tree = RadixTree(UNBOUNDED_TOKENS)
        for prompt in tqdm(prompts, desc="build ours", file=sys.stderr, disable=not progress):
            tree.insert(prompt)
        return tree

    def build_lab() -> LabTree:
        tree = LabTree(UNBOUNDED_TOKENS)
        for prompt in tqdm(prompts, desc="build lab", file=sys.stderr, disable=not progress):
            tree.load(tuple(prompt))
        return tree

    ours, ours_bytes = _traced_build(build_ours)
    del scratch
    ours_nodes, ours_tokens = ours.node_count, ours.cached_tokens
    depth = max_node_depth(ours)
    # copy.deepcopy recurses ~7 frames per tree level; the lab design needs the limit raised on
    # deep trees (itself a cost of that design), restored afterwards.
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 10 * depth + 1_000))
    try:
        lab, lab_bytes = _traced_build(build_lab)
        lab_timing = _time_lab_ops(lab, ops[: settings.lab_ops], progress)
    finally:
        sys.setrecursionlimit(old_limit)
    memory_estimate = ours.memory_bytes()
    ours.capacity_tokens = ours_tokens  # full from here on: an op that adds tokens must evict

    ours_latencies: list[int] = []
    evicted_before = ours.evicted_tokens_total
    for prompt in tqdm(ops, desc="time our ops", file=sys.stderr, disable=not progress):
        start = time.perf_counter_ns()
        key = as_token_bytes(prompt)  # conversion from the tokenizer's array('I') is part of the op
        ours.match_prefix(key)
        ours.insert(key)
        ours_latencies.append(time.perf_counter_ns() - start)

    ours_report = _side_report(
        ours_latencies,
        ours_nodes,
        ours_tokens,
        ours_bytes,
        (ours.node_count, ours.cached_tokens, ours.evicted_tokens_total - evicted_before),
    )
    ours_report["memory_bytes_estimate"] = memory_estimate
    # the very operations the lab was timed on, for a like-for-like check of the speedup
    same_ops = ours_latencies[: settings.lab_ops]
    ours_report["ops_per_s_on_lab_ops"] = len(same_ops) / (sum(same_ops) / 1e9)
    lab_nodes, lab_tokens = lab_timing.built
    if (lab_nodes, lab_tokens) != (ours_nodes, ours_tokens):  # same inserts must give the same tree
        raise RuntimeError(
            f"the trees disagree after the same inserts: ours {ours_nodes} nodes/{ours_tokens} tokens, "
            f"lab {lab_nodes} nodes/{lab_tokens} tokens"
        )
    lab_report = _side_report(
        lab_timing.latencies_ns,
        lab_nodes,
        lab_tokens,
        lab_bytes,
        (lab.node_count(), lab.cached_tokens, lab.evicted_tokens_total),
    )
    return {
        "ours": ours_report,
        "lab": lab_report,
        "speedup": ours_report["ops_per_s"] / lab_report["ops_per_s"],
        "settings": {
            **asdict(settings),
            "prepopulated_prompts": len(prompts),
            "capacity_tokens": ours_tokens,
            "operation": "match_prefix + insert of one prompt sharing a prefix with a cached one",
            "eviction": "capacity set to the pre-populated size, so each op that adds tokens evicts",
            "memory": "tracemalloc bytes retained by building the tree",
            "max_node_depth": depth,
            "python": sys.version.split()[0],
        },
    }


# -- presentation ---------------------------------------------------------------------------


def format_table(report: dict[str, Any]) -> str:
    header = (
        f"{'side':<5} {'ops':>6} {'ops/s':>11} {'p50 µs':>11} {'p99 µs':>11} {'nodes':>7} "
        f"{'tokens':>10} {'B/node':>8} {'B/token':>8} {'overhead B/node':>16}"
    )
    lines = [header, "-" * len(header)]
    for side in ("ours", "lab"):
        r = report[side]
        lines.append(
            f"{side:<5} {r['ops']:>6} {r['ops_per_s']:>11.1f} {r['p50_us']:>11.1f} {r['p99_us']:>11.1f} "
            f"{r['nodes']:>7} {r['cached_tokens']:>10} {r['bytes_per_node']:>8.0f} "
            f"{r['bytes_per_token']:>8.2f} {r['overhead_bytes_per_node']:>16.0f}"
        )
    lines.append(f"speedup (ours ops/s / lab ops/s): {report['speedup']:.0f}x")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from prefixfleet.cli import UsageError
    from prefixfleet.outputs import output_file, write_json

    settings = TreeBenchSettings(
        min_nodes=args.min_nodes,
        prompt_tokens=args.prompt_tokens,
        ops=args.ops,
        lab_ops=args.lab_ops,
        seed=args.seed,
    )
    try:
        settings.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    json_path = output_file(args.json, "--json")
    report = run_tree_benchmark(settings, progress=not args.quiet)
    print(format_table(report))
    if json_path is not None:
        write_json(json_path, report)
        print(f"wrote {json_path}")
    return 0


# The docstring's workload paragraph in terms of the flags (the docstring names code, for readers of it).
TREE_HELP = (
    "Workload (deterministic from --seed): prompts of --prompt-tokens tokens, each sharing a prefix of "
    "random depth with a random earlier prompt and ending in fresh tokens, are inserted until the tree "
    "holds at least --min-nodes nodes. Both trees are pre-populated with the same prompts, then their "
    "capacity is set to exactly what they hold, so every timed operation that adds tokens also evicts "
    "LRU leaves. A timed operation is a prefix match plus an insert of one new prompt that shares a "
    "prefix with a pre-populated one. The lab algorithm is far slower, so it runs only the first "
    "--lab-ops of the same operations. See docs/benchmarks.md."
)


def add_bench(bench_subparsers: argparse._SubParsersAction) -> None:
    parser = bench_subparsers.add_parser(
        "tree",
        help="prefix index vs the seed lab's tree: match+insert of long prompts on a 10k-node tree",
        description=TREE_HELP,
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON here")
    parser.add_argument("--min-nodes", type=int, default=10_000, help="pre-populate until this many nodes")
    parser.add_argument("--prompt-tokens", type=int, default=4096, help="tokens per prompt")
    parser.add_argument("--ops", type=int, default=2_000, help="timed operations on our tree")
    parser.add_argument("--lab-ops", type=int, default=30, help="timed operations on the lab tree")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=_run)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Entry point listed in prefixfleet.cli: registers the whole ``bench`` group once."""
    from prefixfleet.benchmarks.cli import register as register_bench_group

    register_bench_group(subparsers)

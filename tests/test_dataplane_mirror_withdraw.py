"""A prompt the engine never prefilled leaves the sidecar's mirror (and so its published summary).

Specification:
* the sidecar admits a prompt into its mirror when it sends it (so the summary shows it at once);
  a request that ends before the engine's first token — its client left, the engine failed, or
  the engine answered with an error — takes back the tokens that admission added;
* conservative both ways: tokens the mirror held before stay, and so do tokens another request has
  used since (matched into, extended), since that request is having the engine prefill them;
  a stream whose first event arrived keeps its prompt (the engine prefilled it), whatever follows;
* withdrawing keeps the mirror's incremental summary equal to a rebuild from its tree, and its tree
  sound (every leaf evictable, token counts right), over any sequence of operations.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from fleet_fixtures import Spawner, free_port, prefixfleet_argv, serve_http, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.blockhash import CacheIdentity, block_hashes
from prefixfleet.router.mirror import Admission, CacheMirror
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.summary import build_summary

B = 4


def _mirror(capacity: int = 10_000) -> CacheMirror:
    return CacheMirror(capacity, CacheIdentity("m", "r"), block_tokens=B, clock=lambda: 0.0)


def _tokens(values: list[int]) -> bytes:
    return as_token_bytes(values)


def _listed(mirror: CacheMirror, prompt: list[int]) -> int:
    """How many of the prompt's blocks the mirror's summary lists."""
    summary = mirror.summary(worker="w", version=1)
    return sum(summary.has_block(h) for h in block_hashes(prompt, mirror.identity_seed, B))


# -- the mirror -----------------------------------------------------------------------------------


def test_a_withdrawn_prompt_leaves_the_mirror_and_its_summary():
    mirror = _mirror()
    prompt = list(range(100, 140))
    admission = mirror.admit_sent(_tokens(prompt), None)
    assert _listed(mirror, prompt) == 10  # published as soon as sent
    assert mirror.withdraw(admission) == 40
    assert mirror.tree.cached_tokens == 0 and _listed(mirror, prompt) == 0
    assert mirror.withdraw(admission) == 0  # once


def test_what_the_mirror_held_before_stays():
    mirror = _mirror()
    system = list(range(100, 120))
    mirror.admit(_tokens(system), None)
    prompt = [*system, *range(500, 520)]
    admission = mirror.admit_sent(_tokens(prompt), None)
    assert admission.matched_tokens == 20
    assert mirror.withdraw(admission) == 20
    assert mirror.tree.matched_tokens(_tokens(prompt)) == 20 and _listed(mirror, system) == 5
    full_hit = mirror.admit_sent(_tokens(system), None)  # nothing new: nothing to take back
    assert full_hit.added is None and mirror.withdraw(full_hit) == 0
    assert mirror.tree.cached_tokens == 20


def test_tokens_another_request_used_since_stay():
    mirror = _mirror()
    prompt = list(range(100, 140))
    first = mirror.admit_sent(_tokens(prompt), None)
    mirror.admit_sent(_tokens(prompt), None)  # the same prompt again, while the first is in flight
    assert mirror.withdraw(first) == 0
    longer = mirror.admit_sent(_tokens([*prompt, 1, 2, 3, 4]), None)
    assert mirror.withdraw(mirror.admit_sent(_tokens(list(range(200, 240))), None)) == 40
    assert mirror.withdraw(longer) == 4
    assert mirror.tree.matched_tokens(_tokens(prompt)) == 40


def test_a_prompt_split_by_a_later_one_gives_back_only_its_own_tail():
    mirror = _mirror()
    prompt = list(range(100, 140))
    admission = mirror.admit_sent(_tokens(prompt), None)
    sibling = [*range(100, 120), *range(900, 920)]  # shares the first 20 tokens, then differs
    mirror.admit_sent(_tokens(sibling), None)
    assert mirror.withdraw(admission) == 20
    assert mirror.tree.matched_tokens(_tokens(sibling)) == 40
    assert mirror.tree.matched_tokens(_tokens(prompt)) == 20


def test_after_a_flush_or_an_eviction_there_is_nothing_to_take_back():
    mirror = _mirror(capacity=50)
    evicted = mirror.admit_sent(_tokens(list(range(100, 140))), None)
    mirror.admit(_tokens(list(range(200, 240))), None)  # evicts the first prompt (LRU)
    assert mirror.withdraw(evicted) == 0 and mirror.tree.cached_tokens == 40
    flushed = mirror.admit_sent(_tokens(list(range(300, 310))), None)
    mirror.flush()
    mirror.admit(_tokens(list(range(300, 310))), None)  # the same prompt, cached again after the flush
    assert mirror.withdraw(flushed) == 0 and mirror.tree.cached_tokens == 10


prompts = st.lists(st.integers(0, 3), min_size=4, max_size=24)
namespaces = st.sampled_from([None, "tenant-a"])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("send"), prompts, namespaces),
        st.tuples(st.just("send"), prompts, namespaces),
        st.tuples(st.just("withdraw"), st.integers(0, 50)),
        st.tuples(st.just("withdraw"), st.integers(0, 50)),
        st.tuples(st.just("admit"), prompts, namespaces),
        st.tuples(st.just("resize"), st.integers(8, 120)),
        st.tuples(st.just("flush")),
    ),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(ops=operations, capacity=st.integers(8, 100))
def test_withdrawing_keeps_the_summary_and_the_tree_sound(ops, capacity):
    mirror = _mirror(capacity)
    sent: list[Admission] = []
    for op in ops:
        if op[0] == "send":
            sent.append(mirror.admit_sent(_tokens([10 + t for t in op[1]]), op[2]))
        elif op[0] == "withdraw" and sent:
            mirror.withdraw(sent.pop(op[1] % len(sent)))
        elif op[0] == "admit":
            mirror.admit(_tokens([10 + t for t in op[1]]), op[2])
        elif op[0] == "resize":
            mirror.resize(op[1])
        elif op[0] == "flush":
            mirror.flush()
        kept = mirror.summary(worker="w", version=1, max_blocks=24, hot_k=4)
        fresh, _ = build_summary(
            mirror.tree, worker="w", version=1, now=0.0, identity_seed=mirror.identity_seed,
            block_tokens=B, namespace_seed=mirror.namespace_seed, wall_time_of=mirror.wall_time_of,
            max_blocks=24, hot_k=4,
        )  # fmt: skip
        assert kept == fresh
    tree = mirror.tree
    held = sum(node.num_tokens for ns in tree.namespaces() for _, node in tree.iter_nodes(ns))
    assert held == tree.cached_tokens <= tree.capacity_tokens
    if tree.cached_tokens:  # every leaf is still evictable: the whole mirror can be emptied
        tree.evict(tree.cached_tokens)
    assert tree.cached_tokens == 0


# -- a real sidecar in front of a stand-in engine --------------------------------------------------


class StallingEngine(BaseHTTPRequestHandler):
    """Answers by the prompt's first word: ``hold`` — nothing until its client leaves; ``die`` — its
    connection closed unanswered; ``first`` — a stream, an event every 0.1 s until its client leaves;
    ``bad`` — 400. GETs (the sidecar's probes) get an empty 200."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        kind = body["prompt"].split(" ", 1)[0]
        if kind == "die":
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if kind == "bad":
            self.send_error(400, "no such model")
            return
        if kind == "first":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream()
            return
        self._hold()

    def _stream(self) -> None:
        """Events every 0.1 s until its client (the sidecar) leaves."""
        deadline = time.monotonic() + 30
        event = b'data: {"choices": [{"text": "a"}]}\n\n'
        while time.monotonic() < deadline:
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.1)

    def _hold(self) -> None:
        """Until its client (the sidecar) leaves: nothing more is sent, so a read ends at its close."""
        self.connection.settimeout(30)
        with contextlib.suppress(OSError):
            self.connection.recv(1)

    def log_message(self, *_args: object) -> None:
        return


def mirrored_tokens(client: httpx.Client, sidecar: str) -> int:
    for line in client.get(f"{sidecar}/metrics").text.splitlines():
        if line.startswith("prefixfleet_sidecar_mirror_cached_tokens "):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("the sidecar's /metrics has no mirror_cached_tokens")


def in_flight(client: httpx.Client, sidecar: str) -> int:
    return client.get(f"{sidecar}/prefixfleet/status").json()["load"]["in_flight"]


def stream_request(port: int, prompt: str) -> socket.socket:
    """A streaming request on a new connection (closing it is the client leaving)."""
    body = json.dumps({"prompt": prompt, "stream": True, "max_tokens": 50}).encode()
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return conn


@pytest.mark.timeout(60)
def test_the_sidecar_takes_back_a_prompt_the_engine_never_prefilled(spawn: Spawner) -> None:
    with serve_http(StallingEngine) as engine:
        port = free_port()
        sidecar = f"http://127.0.0.1:{port}"
        argv = prefixfleet_argv("router", "sidecar", "--engine", engine, "--port", str(port))
        spawn(argv, name="sidecar", ready_url=f"{sidecar}/prefixfleet/status")
        words = " ".join(f"w{i}" for i in range(40))
        with httpx.Client(timeout=10) as client:
            # an error answer and an engine that died: nothing prefilled, nothing kept
            assert (
                client.post(f"{sidecar}/v1/completions", json={"prompt": f"bad {words}"}).status_code == 400
            )
            assert (
                client.post(f"{sidecar}/v1/completions", json={"prompt": f"die {words}"}).status_code == 502
            )
            assert mirrored_tokens(client, sidecar) == 0
            # a client that leaves while the engine holds its request: mirrored while in flight ...
            with stream_request(port, f"hold {words}"):
                wait_until(lambda: mirrored_tokens(client, sidecar), 10, "the sidecar to mirror the prompt")
            # ... and taken back once it left before the engine's first token
            wait_until(lambda: in_flight(client, sidecar) == 0, 10, "the sidecar to end the request")
            assert mirrored_tokens(client, sidecar) == 0
            # a stream whose first event arrived keeps its prompt when its client then leaves
            with stream_request(port, f"first {words}") as conn:
                received = b""
                while b'"text": "a"' not in received:
                    chunk = conn.recv(4096)
                    assert chunk, "the sidecar closed the stream before its first event"
                    received += chunk
                kept = mirrored_tokens(client, sidecar)
            wait_until(lambda: in_flight(client, sidecar) == 0, 10, "the sidecar to end the request")
            assert mirrored_tokens(client, sidecar) == kept > 40

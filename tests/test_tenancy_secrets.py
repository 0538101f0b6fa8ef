"""Tenant isolation, secrets and least privilege.

Specification:
* a tenant is named by the request's ``cache_salt`` (vLLM's field; the gateway, the sidecar and the
  emulator all honour it): two tenants sending identical prefixes never share a prefix node — tenant
  B gets no cache hit from tenant A's traffic on the engines, the gateway estimates no match for it,
  and a tenant still hits its own cache;
* the router's choice for tenant B does not depend on which prefix tenant A sent (no side channel
  through routing), for every registered policy;
* no prompt text, token ids or tenant salt appear in Redis, in any service's log (at DEBUG) or in any
  /metrics page;
* Redis with a password: the services take it from the URL, from ``PREFIXFLEET_REDIS_PASSWORD`` or from
  the file named by ``PREFIXFLEET_REDIS_PASSWORD_FILE``; a wrong password is an outage (warned about),
  never a crash; the password never appears in a log;
* the operator's pods get the Redis password from its Secret by ``secretKeyRef`` (never in args), TLS
  by ``PREFIXFLEET_REDIS_TLS``; sidecar, gateway and emulator containers run non-root on a read-only
  root filesystem with no capabilities.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import ssl
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from fleet_fixtures import (
    RedisServer,
    Spawned,
    Spawner,
    eventually,
    free_port,
    prefixfleet_argv,
    redis_server_binary,
    wait_for_http,
    wait_for_port,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_usage import cached_tokens

from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, desired_children, replica_template
from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.policies import POLICIES, CostModel, RouteRequest, make_policy
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.records import LoadReport, MemberRecord, encode_record
from prefixfleet.router.redis_conn import redacted, redis_options
from prefixfleet.router.requests import BadRequest
from prefixfleet.router.summary import Summary, encode_summary
from prefixfleet.router.tenancy import checked_tenant, salted_body
from prefixfleet.router.view import FleetView
from prefixfleet.tokenizer import tokenize

pytestmark = pytest.mark.timeout(120)

SECRET_WORDS = ("zebra", "quokka", "narwhal", "axolotl", "pangolin")
SALT_A = "salt-alpha-7f3k"
SALT_B = "salt-bravo-9q2z"


@dataclass
class Fleet:
    engines: list[Spawned] = field(default_factory=list)
    sidecars: list[Spawned] = field(default_factory=list)
    gateway: Spawned | None = None
    engine_urls: list[str] = field(default_factory=list)
    sidecar_urls: list[str] = field(default_factory=list)
    gateway_url: str = ""

    def children(self) -> list[Spawned]:
        return [*self.engines, *self.sidecars, *([self.gateway] if self.gateway else [])]


def start_fleet(
    spawn: Spawner,
    redis_url: str,
    *,
    engines: int = 2,
    env: dict[str, str] | None = None,
    gateway_env: dict[str, str] | None = None,
    gateway_redis: str | None = None,
) -> Fleet:
    fleet = Fleet()
    for i in range(engines):
        port = free_port()
        argv = prefixfleet_argv(
            "emulator",
            "--port",
            str(port),
            "--cache-tokens",
            "20000",
            "--time-scale",
            "20",
            "--log-level",
            "debug",
            "--enable-cache-report",
        )
        fleet.engines.append(spawn(argv, name=f"engine{i}"))
        fleet.engine_urls.append(f"http://127.0.0.1:{port}")
    for i, engine_url in enumerate(fleet.engine_urls):
        port = free_port()
        argv = prefixfleet_argv(
            "router", "sidecar", "--engine", engine_url, "--redis", redis_url, "--port", str(port),
            "--worker-id", f"w{i}", "--fleet", "tn", "--publish-interval", "0.1", "--log-level", "DEBUG",
        )  # fmt: skip
        fleet.sidecars.append(spawn(argv, name=f"sidecar{i}", env=env))
        fleet.sidecar_urls.append(f"http://127.0.0.1:{port}")
    port = free_port()
    argv = prefixfleet_argv(
        "router", "gateway", "--redis", gateway_redis or redis_url, "--port", str(port), "--fleet", "tn",
        "--refresh-interval", "0.1", "--log-level", "DEBUG",
    )  # fmt: skip
    fleet.gateway = spawn(argv, name="gateway", env=gateway_env if gateway_env is not None else env)
    fleet.gateway_url = f"http://127.0.0.1:{port}"
    for child, url in zip(fleet.engines, fleet.engine_urls, strict=True):
        wait_for_http(f"{url}/health", proc=child.proc)
    for child, url in zip(fleet.sidecars, fleet.sidecar_urls, strict=True):
        wait_for_http(f"{url}/prefixfleet/status", proc=child.proc)
    wait_for_http(f"{fleet.gateway_url}/livez", proc=fleet.gateway.proc)
    return fleet


async def completion(http: aiohttp.ClientSession, url: str, prompt: str, salt: str | None) -> tuple[int, str]:
    body: dict = {"prompt": prompt, "max_tokens": 2}
    if salt is not None:
        body["cache_salt"] = salt
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        data = await resp.json()
        return cached_tokens(data["usage"]), resp.headers["X-Prefixfleet-Worker"]


async def metric_total(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def wait_all_routable(http: aiohttp.ClientSession, gateway_url: str, n: int) -> None:
    async def view() -> dict:
        async with http.get(f"{gateway_url}/prefixfleet/view") as resp:
            return await resp.json()

    def all_routable(v: dict) -> bool:
        return sum(w["routable"] for w in v["workers"]) == n

    await eventually(view, 20, f"{gateway_url} to see {n} routable workers", done=all_routable)


PREFIX_BLOCKS = 300 // 16  # full 16-token blocks of a 320-word system prompt (at least)


async def wait_summary_blocks(
    http: aiohttp.ClientSession, gateway_url: str, worker: str | None, n: int
) -> None:
    """Until the gateway's view holds at least ``n`` summary blocks of ``worker`` (None: of all
    workers together): the sidecar has published them and the gateway has read them. A fixed sleep
    here raced both on a loaded machine."""

    async def blocks() -> int:
        async with http.get(f"{gateway_url}/prefixfleet/view") as resp:
            rows = (await resp.json())["workers"]
        return sum(w["summary_blocks"] for w in rows if worker is None or w["worker_id"] == worker)

    what = f"{gateway_url} to read {n} summary blocks of {worker or 'the fleet'}"
    await eventually(blocks, 30, what, done=lambda got: got >= n)


async def test_two_tenants_with_identical_prefixes_never_share_a_cache_and_nothing_leaks(spawn, redis_server):
    fleet = start_fleet(spawn, redis_server.url)
    system = " ".join(f"{SECRET_WORDS[i % 5]}{i}" for i in range(320))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        await wait_all_routable(http, fleet.gateway_url, 2)
        gw = fleet.gateway_url
        first, holder = await completion(http, gw, f"{system} question one", SALT_A)
        assert first == 0
        await wait_summary_blocks(http, gw, holder, PREFIX_BLOCKS)  # A's prefix is in its summary
        again, holder_again = await completion(http, gw, f"{system} question two", SALT_A)
        assert again >= 300 and holder_again == holder, "a tenant hits its own cache"

        matched_before = await metric_total(http, gw, "prefixfleet_gateway_matched_tokens_total")
        b_first, _ = await completion(http, gw, f"{system} question one", SALT_B)
        matched_after = await metric_total(http, gw, "prefixfleet_gateway_matched_tokens_total")
        assert b_first == 0, "tenant B got a cache hit from tenant A's prefix"
        assert matched_after == matched_before, "the gateway estimated a match for B from A's traffic"
        shared, _ = await completion(http, gw, f"{system} question one", None)
        assert shared == 0, "the unsalted (shared) cache holds nothing of tenant A"
        # every engine directly: B's prefix is a miss wherever it lands, A's is a hit where it lives
        for engine_url in fleet.engine_urls:
            cached, _ = await _engine_completion(http, engine_url, f"{system} question three", SALT_B + "x")
            assert cached == 0
        b_again, _ = await completion(http, gw, f"{system} question two", SALT_B)
        assert b_again >= 300, "tenant B hits its own cache"

        # A's, B's and the unsalted prefix published (what the Redis check below reads)
        await wait_summary_blocks(http, gw, None, 3 * PREFIX_BLOCKS)
        pages = []
        for url in [gw, *fleet.sidecar_urls, *fleet.engine_urls]:
            async with http.get(f"{url}/metrics") as resp:
                pages.append((url, await resp.text()))
    assert_nothing_secret(redis_blob(redis_server), "Redis", tokenize(system))
    for child in fleet.children():
        assert child.running()
        assert_nothing_secret(child.log().encode(), f"{child.name}'s log", None)
    for url, page in pages:
        assert_nothing_secret(page.encode(), f"{url}/metrics", None)


async def test_a_batch_with_one_salt_per_prompt_is_routed_and_cached_under_each_prompts_salt(
    spawn, redis_server
):
    """SGLang takes a batch's ``cache_salt`` as a list, one per prompt; the gateway and the sidecar
    refused it (400) though the engine serves it. The gateway routes a batch by its first prompt,
    under that prompt's salt; the engine caches each prompt under its own."""
    fleet = start_fleet(spawn, redis_server.url)
    system = " ".join(f"{SECRET_WORDS[i % 5]}{i}" for i in range(320))
    other = " ".join(f"{SECRET_WORDS[(i + 2) % 5]}x{i}" for i in range(320))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        await wait_all_routable(http, fleet.gateway_url, 2)
        gw = fleet.gateway_url
        batch = {"prompt": [f"{system} one", f"{other} one"], "max_tokens": 2, "cache_salt": [SALT_A, SALT_B]}
        async with http.post(f"{gw}/v1/completions", json=batch) as resp:
            assert resp.status == 200, await resp.text()
            assert len((await resp.json())["choices"]) == 2
            holder = resp.headers["X-Prefixfleet-Worker"]
        # the batch's first prompt is in the holder's published summary
        await wait_summary_blocks(http, gw, holder, PREFIX_BLOCKS)
        # the gateway learned the first prompt under the first salt: it routes A's next turn there
        again, holder_again = await completion(http, gw, f"{system} two", SALT_A)
        assert again >= 300 and holder_again == holder
        # ... and under no other salt
        matched_before = await metric_total(http, gw, "prefixfleet_gateway_matched_tokens_total")
        b_first, _ = await completion(http, gw, f"{system} three", SALT_B)
        assert b_first == 0
        assert await metric_total(http, gw, "prefixfleet_gateway_matched_tokens_total") == matched_before
        # the engine cached the second prompt under the second salt, not the first
        engine_url = fleet.engine_urls[int(holder.removeprefix("w"))]
        cached_b, _ = await _engine_completion(http, engine_url, f"{other} two", SALT_B)
        cached_a, _ = await _engine_completion(http, engine_url, f"{other} three", SALT_A)
        assert (cached_b >= 300, cached_a) == (True, 0)
    for child in fleet.children():
        assert child.running()


async def _engine_completion(
    http: aiohttp.ClientSession, url: str, prompt: str, salt: str
) -> tuple[int, str]:
    async with http.post(
        f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1, "cache_salt": salt}
    ) as r:
        assert r.status == 200
        return cached_tokens((await r.json())["usage"]), url


def redis_blob(server: RedisServer) -> bytes:
    client = server.client()
    values: list[bytes] = []
    for key in client.scan_iter("*"):
        values.append(key)
        kind = client.type(key)
        if kind == b"string":
            values.append(client.get(key))
        elif kind == b"hash":
            values.extend(k + b"=" + v for k, v in client.hgetall(key).items())
    assert values, "the fleet wrote nothing to Redis"
    return b"\n".join(values)


def assert_nothing_secret(blob: bytes, where: str, token_ids: object) -> None:
    for word in (*SECRET_WORDS, SALT_A, SALT_B):
        assert word.encode() not in blob, f"{word!r} found in {where}"
    if token_ids is not None:
        ids = list(token_ids)
        for i in range(0, 30):
            assert struct.pack("<3I", *ids[i : i + 3]) not in blob, f"raw token ids in {where}"
            assert re.search(rf"\b{ids[i]}\b".encode(), blob) is None, f"token id {ids[i]} in {where}"


# -- no side channel through the router's choice --------------------------------------------------------

B_BLOCK = 4
WORKERS = ("w0", "w1", "w2")


def _view_with(summaries: dict[str, list[int]]) -> FleetView:
    view = FleetView(block_tokens=B_BLOCK)
    members = {
        w: encode_record(MemberRecord(url=f"http://127.0.0.1:{9000 + i}")) for i, w in enumerate(WORKERS)
    }
    loads = {
        w: encode_record(LoadReport(1, 1.0, "ready", True, 1, 0, 10, 1000.0, 0, 10_000, 1)) for w in WORKERS
    }
    view.apply_snapshot(members, loads, now=1.0)
    for w in WORKERS:
        blocks = sorted(set(summaries.get(w, [])))
        summary = Summary(w, 1, 1.0, B_BLOCK, CacheIdentity().seed(), 0, 10_000, _array(blocks))
        assert view.apply_summary(w, encode_summary(summary)) is None
    return view


def _array(values: list[int]):  # -> array('Q')
    from array import array

    return array("Q", values)


def _decide(
    view: FleetView, policy, tokens: list[int], salt: str | None, now: float
) -> tuple[str, list[int]]:
    token_bytes = as_token_bytes(tokens)
    workers = view.routable(1.0)
    hashes = view.request_hashes(token_bytes, salt, workers)
    rows = view.replica_states(workers, hashes, len(tokens), now)
    request = RouteRequest(
        tokens=token_bytes, num_tokens=len(tokens), now=now, namespace=salt, max_new_tokens=4
    )
    decision = policy.choose(request, rows)
    policy.on_routed(request, decision)
    chain = hashes[(CacheIdentity().seed(), B_BLOCK)]
    handle = view.record_send(str(decision.replica_id), chain, 0, now)
    view.record_done(str(decision.replica_id), handle)
    return str(decision.replica_id), [r.matched_tokens for r in rows]


@settings(max_examples=25, deadline=None)
@given(
    policy_name=st.sampled_from(sorted(POLICIES)),
    prefix=st.lists(st.integers(0, 50), min_size=8, max_size=40),
    other=st.lists(st.integers(51, 100), min_size=8, max_size=40),
    a_requests=st.integers(1, 6),
)
def test_the_routers_choice_for_tenant_b_does_not_depend_on_tenant_a_s_prefix(
    policy_name, prefix, other, a_requests
):
    """World 1: tenant A sends B's prefix; world 2: tenant A sends another prefix of the same shape.
    Tenant B's decision and the matches it sees are identical in both worlds."""
    other = (other * 3)[: len(prefix)]
    results = []
    for a_prefix in (prefix, other):
        view = _view_with({})
        policy = make_policy(policy_name, CostModel())
        for i in range(a_requests):
            chosen, _ = _decide(view, policy, [*a_prefix, 200 + i], SALT_A, now=2.0 + i)
            # the holder's sidecar then publishes A's salted blocks
            a_hashes = view.request_hashes(as_token_bytes([*a_prefix, 200 + i]), SALT_A, view.routable(1.0))
            summary_blocks = a_hashes[(CacheIdentity().seed(), B_BLOCK)]
            w = view.workers[chosen]
            merged = sorted(set(w.summary.blocks) | set(summary_blocks))
            seed = w.summary.identity_seed
            w.summary = Summary(
                chosen, w.summary.version + 1, 2.0 + i, B_BLOCK, seed, 0, 10_000, _array(merged)
            )
        if a_prefix is prefix:  # not vacuous: tenant A itself would match its prefix now
            own = view.request_hashes(as_token_bytes([*prefix, 300]), SALT_A, view.routable(1.0))
            rows = view.replica_states(view.routable(1.0), own, len(prefix) + 1, 20.0)
            assert max(r.matched_tokens for r in rows) >= (len(prefix) // B_BLOCK) * B_BLOCK
        results.append(_decide(view, policy, [*prefix, 300], SALT_B, now=20.0))
    (choice_1, matched_1), (choice_2, matched_2) = results
    assert matched_1 == matched_2 == [0] * len(WORKERS)
    assert choice_1 == choice_2


# -- Redis password -----------------------------------------------------------------------------------


@pytest.fixture
def password_redis(spawn: Spawner) -> Iterator[tuple[int, str]]:
    port = free_port()
    password = "s3cret-pass-Wq81"
    argv = [
        redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--requirepass", password,
    ]  # fmt: skip
    child = spawn(argv, name="redis-auth")
    wait_for_port(port, proc=child.proc)
    yield port, password


async def test_redis_password_from_env_file_or_url_and_a_wrong_one_is_an_outage_not_a_crash(
    spawn, password_redis, tmp_path
):
    port, password = password_redis
    url = f"redis://127.0.0.1:{port}/0"
    secret_file = tmp_path / "redis-password"
    secret_file.write_text(password + "\n")
    fleet = start_fleet(
        spawn, url, engines=1,
        env={"PREFIXFLEET_REDIS_PASSWORD": password},  # sidecar: env var (a Secret via secretKeyRef)
        gateway_env={"PREFIXFLEET_REDIS_PASSWORD_FILE": str(secret_file)},  # gateway: a mounted Secret
    )  # fmt: skip
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        await wait_all_routable(http, fleet.gateway_url, 1)  # membership came through Redis
        _, worker = await completion(http, fleet.gateway_url, "hello secured fleet", None)
        assert worker == "w0"
        # a password in the URL works too
        url_port = free_port()
        url_gateway = spawn(
            prefixfleet_argv(
                "router", "gateway", "--redis", f"redis://:{password}@127.0.0.1:{port}/0",
                "--port", str(url_port), "--fleet", "tn", "--refresh-interval", "0.1",
            ),
            name="gateway-url-password", ready_url=f"http://127.0.0.1:{url_port}/livez",
        )  # fmt: skip
        await wait_all_routable(http, f"http://127.0.0.1:{url_port}", 1)
        # a wrong password: the gateway warns, stays up, has no worker (503), never crashes
        bad_port = free_port()
        bad = spawn(
            prefixfleet_argv(
                "router", "gateway", "--redis", url, "--port", str(bad_port), "--fleet", "tn",
                "--refresh-interval", "0.1",
            ),
            name="gateway-bad-password", env={"PREFIXFLEET_REDIS_PASSWORD": "wrong"},
        )  # fmt: skip
        wait_for_http(f"http://127.0.0.1:{bad_port}/livez", proc=bad.proc)
        async with http.post(f"http://127.0.0.1:{bad_port}/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 503
        await eventually(lambda: "redis unavailable" in bad.log(), 30, "the bad gateway's Redis warning")
        assert bad.running()
    for child in [*fleet.children(), url_gateway, bad]:
        assert password not in child.log(), f"password in {child.name}'s log"
        assert "Traceback" not in child.log()


def test_redis_options_read_the_password_from_env_or_file_and_upgrade_to_tls(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    assert redis_options("redis://h:6379/0", {}) == ("redis://h:6379/0", {})
    assert redis_options("redis://h:6379/0", {"PREFIXFLEET_REDIS_PASSWORD": "p"})[1] == {"password": "p"}
    assert redis_options("redis://h/0", {"PREFIXFLEET_REDIS_PASSWORD_FILE": str(secret)})[1] == {
        "password": "from-file"
    }
    env = {"PREFIXFLEET_REDIS_PASSWORD": "p", "PREFIXFLEET_REDIS_USERNAME": "fleet"}
    assert redis_options("redis://h/0", env)[1] == {"password": "p", "username": "fleet"}
    # a password in the URL wins
    assert redis_options("redis://:u@h/0", {"PREFIXFLEET_REDIS_PASSWORD": "p"}) == ("redis://:u@h/0", {})
    url, opts = redis_options(
        "redis://h/0", {"PREFIXFLEET_REDIS_TLS": "1", "PREFIXFLEET_REDIS_CA_FILE": "/ca.pem"}
    )
    assert url == "rediss://h/0" and opts == {"ssl_ca_certs": "/ca.pem"}
    assert redis_options("rediss://h/0", {})[0] == "rediss://h/0"
    assert redacted("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    with pytest.raises(ValueError, match="PREFIXFLEET_REDIS_PASSWORD_FILE"):
        redis_options("redis://h/0", {"PREFIXFLEET_REDIS_PASSWORD_FILE": str(tmp_path / "missing")})


# -- the operator's pods ---------------------------------------------------------------------------------

FLEET = FleetRef(name="chat", namespace="team-a", uid="uid-1", generation=1)


def secured_spec(**redis: object) -> FleetSpec:
    return FleetSpec.model_validate(
        {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "replicas": 2, "redis": redis}
    )


def pods(spec: FleetSpec) -> dict[str, tuple[dict, dict]]:
    """container name -> (container, its pod's securityContext): replica pod and gateway Deployment."""
    template, _ = replica_template(FLEET, spec, "redis://default:6379/0")
    out = {c["name"]: (c, template["spec"]["securityContext"]) for c in template["spec"]["containers"]}
    for child in desired_children(FLEET, spec, "redis://default:6379/0"):
        if child["kind"] == "Deployment":
            pod = child["spec"]["template"]["spec"]
            out.update({c["name"]: (c, pod["securityContext"]) for c in pod["containers"]})
    return out


def containers(spec: FleetSpec) -> dict[str, dict]:
    return {name: container for name, (container, _) in pods(spec).items()}


def test_the_redis_password_reaches_sidecar_and_gateway_only_through_a_secret_ref():
    spec = secured_spec(
        url="redis://redis.infra:6379/0",
        passwordSecretRef={"name": "redis-auth", "key": "password"},
        tls=True,
    )
    found = containers(spec)
    for name in ("sidecar", "gateway"):
        env = {e["name"]: e for e in found[name]["env"]}
        assert env["PREFIXFLEET_REDIS_PASSWORD"]["valueFrom"] == {
            "secretKeyRef": {"name": "redis-auth", "key": "password"}
        }
        assert env["PREFIXFLEET_REDIS_TLS"]["value"] == "1"
        assert "value" not in env["PREFIXFLEET_REDIS_PASSWORD"]
        assert not any("password" in str(a).lower() for a in found[name]["args"])
    assert "PREFIXFLEET_REDIS_PASSWORD" not in {e["name"] for e in found["engine"].get("env", [])}
    url_from_secret = containers(secured_spec(secretRef={"name": "redis-url", "key": "url"}))
    env = {e["name"]: e for e in url_from_secret["sidecar"]["env"]}
    assert env["REDIS_URL"]["valueFrom"] == {"secretKeyRef": {"name": "redis-url", "key": "url"}}


def test_operator_pods_run_non_root_read_only_and_without_capabilities():
    found = pods(secured_spec())
    assert set(found) == {"engine", "sidecar", "gateway"}
    for name, (container, pod_security) in found.items():
        sc = container["securityContext"]
        assert sc.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is True, name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["capabilities"] == {"drop": ["ALL"]}, name


def test_secret_words_are_really_in_the_prompts_used_above():
    # guards the leak test against a vacuous pass (e.g. a tokenizer that drops these words)
    ids = tokenize(" ".join(SECRET_WORDS))
    assert len(ids) == len(SECRET_WORDS)
    assert json.dumps({"cache_salt": SALT_A}).count(SALT_A) == 1


# -- Redis over TLS ----------------------------------------------------------------------------------


def self_signed_certificate(directory) -> tuple[str, str]:
    cert, key = directory / "redis-cert.pem", directory / "redis-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


async def tls_terminator(cert: str, key: str, backend_port: int) -> asyncio.Server:
    """A TLS endpoint in front of a plain Redis (the bundled Valkey is built without TLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)


@pytest.mark.skipif(
    shutil.which("openssl") is None,
    reason="needs the openssl command to make a certificate (.ci/run installs it)",
)
async def test_sidecar_and_gateway_reach_redis_over_tls_with_a_private_ca(spawn, password_redis, tmp_path):
    port, password = password_redis
    cert, key = self_signed_certificate(tmp_path)
    server = await tls_terminator(cert, key, port)
    tls_port = server.sockets[0].getsockname()[1]
    env = {"PREFIXFLEET_REDIS_PASSWORD": password, "PREFIXFLEET_REDIS_CA_FILE": cert}
    try:
        fleet = await asyncio.to_thread(  # the TLS endpoint runs on this loop: keep it free
            start_fleet, spawn, f"rediss://127.0.0.1:{tls_port}/0", engines=1, env=env,
            # the gateway gets a redis:// URL and is told to upgrade it (spec.redis.tls: true)
            gateway_env={**env, "PREFIXFLEET_REDIS_TLS": "1"}, gateway_redis=f"redis://127.0.0.1:{tls_port}/0",
        )  # fmt: skip
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await wait_all_routable(http, fleet.gateway_url, 1)
            _, worker = await completion(http, fleet.gateway_url, "over tls", None)
            assert worker == "w0"
    finally:
        server.close()
        await server.wait_closed()
    for child in fleet.children():
        assert "Traceback" not in child.log() and "redis unavailable" not in child.log()


# -- isolation on: the tenant from a trusted header ----------------------------------------------------


async def test_with_a_tenant_header_the_gateway_isolates_tenants_and_clients_cannot_pick_a_salt(
    spawn, redis_server
):
    start_fleet(spawn, redis_server.url, engines=1)  # both tenants share one engine
    port = free_port()
    isolating = spawn(
        prefixfleet_argv(
            "router", "gateway", "--redis", redis_server.url, "--port", str(port), "--fleet", "tn",
            "--refresh-interval", "0.1", "--tenant-header", "X-Prefixfleet-Tenant",
        ),
        name="gateway-isolating", ready_url=f"http://127.0.0.1:{port}/livez",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    prompt = " ".join(f"{SECRET_WORDS[i % 5]}{i}" for i in range(200))

    async def send(tenant: str | None, salt: str | None = None) -> tuple[int, dict]:
        body: dict = {"prompt": prompt, "max_tokens": 1}
        if salt is not None:
            body["cache_salt"] = salt
        headers = {"X-Prefixfleet-Tenant": tenant} if tenant is not None else {}
        async with http.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
            return resp.status, await resp.json()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        await wait_all_routable(http, url, 1)
        status, first = await send("acme")
        assert status == 200 and cached_tokens(first["usage"]) == 0
        status, again = await send("acme")
        assert cached_tokens(again["usage"]) >= 192, "a tenant hits its own cache"
        status, other = await send("globex")
        assert cached_tokens(other["usage"]) == 0, "no hit from another tenant"
        # a client of tenant "initech" naming acme's tenant as its salt still gets nothing of acme's
        status, sneaky = await send("initech", salt="acme")
        assert status == 200 and cached_tokens(sneaky["usage"]) == 0
        status, refused = await send(None)
        assert status == 400 and "X-Prefixfleet-Tenant" in refused["error"]["message"]
        assert refused["error"]["param"] == "X-Prefixfleet-Tenant"
    assert isolating.running()


def test_the_tenant_salt_overrides_the_clients_salt_and_requires_the_header():
    obj = {"prompt": "hi", "cache_salt": "chosen-by-client"}
    assert json.loads(salted_body(obj, checked_tenant(" acme ", "X-T"))) == {
        "prompt": "hi",
        "cache_salt": "acme",
    }
    assert obj["cache_salt"] == "acme"  # in place: the gateway validates the value it forwards
    for missing in (None, "", "   "):
        with pytest.raises(BadRequest, match="header X-T is required"):
            checked_tenant(missing, "X-T")
    with pytest.raises(BadRequest, match="longer than"):
        checked_tenant("x" * 300, "X-T")


def test_tenant_isolation_in_the_fleet_spec_turns_on_the_gateways_tenant_header():
    plain = containers(secured_spec())["gateway"]["args"]
    isolated_spec = FleetSpec.model_validate(
        {"model": {"name": "m"}, "engine": {"kind": "emulator"}, "cacheIdentity": {"tenantIsolation": True}}
    )
    isolated = containers(isolated_spec)["gateway"]["args"]
    assert "--tenant-header" not in plain
    assert isolated[isolated.index("--tenant-header") + 1] == "X-Prefixfleet-Tenant"


def test_a_bad_tenant_header_name_is_refused_with_one_line():
    argv = prefixfleet_argv(
        "router", "gateway", "--port", "8000", "--redis", "redis://h", "--tenant-header", "a b"
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "--tenant-header" in done.stderr and "Traceback" not in done.stderr

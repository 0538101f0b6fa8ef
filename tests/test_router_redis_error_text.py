"""A sidecar, a gateway and ``router inspect`` never print the fleet's Redis password in a Redis error.

redis-py 8 opens every connection with ``HELLO 3 AUTH <user> <password>``; a Redis older than 6 does
not know HELLO and answers ``unknown command `HELLO`, with args beginning with: `3`, `AUTH`,
`default`, `<password>`,``. The operator's log lines were scrubbed in a865c21; the sidecar's and the
gateway's ``redis unavailable (...)`` warnings (and the gateway's sends-channel warning, and ``router
inspect``'s error) still printed that text as is: the password in every pod's log. They now say it
with ``redis_conn.redis_error_text``, the function the operator uses too.

The Redis 5 is the fake RESP server of tests/test_operator_redis_refusals.py (the processes under
test are real, spawned as the fleet's pods run them).
"""

from __future__ import annotations

import subprocess

import pytest
import redis
from fleet_fixtures import Spawner, free_port, prefixfleet_argv, wait_until

from prefixfleet.router.redis_conn import redis_error_text
from tests.test_operator_redis_refusals import fake_redis

PASSWORD = "pw-router-5e71d"  # distinctive: any occurrence in a log is this one
SCRUBBED = (
    "HELLO (redis-py >= 8 opens every connection with it: Redis 6 or later):"
    " ERR unknown command (a Redis older than 6)"
)
RESP3 = getattr(redis.utils, "DEFAULT_RESP_VERSION", 2) == 3

pytestmark = pytest.mark.skipif(not RESP3, reason="redis-py < 8 speaks RESP2: no HELLO, nothing to scrub")


@pytest.mark.parametrize("component", ["sidecar", "gateway"])
@pytest.mark.parametrize("password_from", ["url", "env"])
def test_the_redis_unavailable_warning_of_a_redis_older_than_6_holds_no_password(
    spawn: Spawner, component: str, password_from: str
) -> None:
    with fake_redis(version=5, password=PASSWORD) as fake:
        url = fake.url(f":{PASSWORD}" if password_from == "url" else "")
        env = {"PREFIXFLEET_REDIS_PASSWORD": PASSWORD} if password_from == "env" else {}
        port = free_port()
        if component == "sidecar":
            # an engine that is not there: the sidecar publishes its record all the same
            argv = prefixfleet_argv(
                "router", "sidecar", "--engine", f"http://127.0.0.1:{free_port()}", "--redis", url,
                "--port", str(port), "--worker-id", "w0", "--fleet", "old", "--publish-interval", "0.1",
            )  # fmt: skip
        else:
            argv = prefixfleet_argv(
                "router", "gateway", "--redis", url, "--port", str(port), "--fleet", "old",
                "--refresh-interval", "0.1",
            )  # fmt: skip
        child = spawn(argv, name=component, env=env, ready_port=port)
        wait_until(lambda: "redis unavailable" in child.log(), 30, what=f"the {component}'s Redis warning")
        assert fake.ran == []
    log = child.log()
    # before: "redis unavailable (unknown command `HELLO`, with args beginning with: `3`, `AUTH`,
    # `default`, `pw-router-5e71d`, ): ..."
    assert PASSWORD not in log, log
    assert f"redis unavailable ({SCRUBBED})" in log, log
    assert child.running()


def test_router_inspect_on_a_redis_older_than_6_prints_no_password() -> None:
    with fake_redis(version=5, password=PASSWORD) as fake:
        done = subprocess.run(
            prefixfleet_argv("router", "inspect", "--redis", fake.url(f":{PASSWORD}"), "--fleet", "old"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done
    assert PASSWORD not in done.stdout + done.stderr, done.stderr
    assert f": {SCRUBBED}" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            f"unknown command `HELLO`, with args beginning with: `3`, `AUTH`, `default`, `{PASSWORD}`, ",
            SCRUBBED,
        ),
        ("ERR unknown command 'HELLO'", SCRUBBED),  # Redis 4 quotes no argument: said the same way
        ("ERR unknown command 'hello'", SCRUBBED),  # a proxy's wording
        ("unknown command `FOO`, with args beginning with: `hello`, ", None),  # not the handshake
        ("Connection closed by server.", None),
    ],
)
def test_redis_error_text_says_only_the_handshakes_refusal_otherwise(text: str, said: str | None) -> None:
    for exc in (redis.ResponseError(text), redis.ConnectionError(text)):
        assert redis_error_text(exc) == (said or text)

"""Small records in Redis next to a sidecar's summary: membership and load (JSON, format v1), the
load pushes sidecars publish on the loads channel, and the send notices gateways exchange so each
sees the prefixes the others just routed."""

from __future__ import annotations

import json
import math
import re
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeGuard

from .little_endian import pack_le, unpack_le
from .summary import MAX_RECORD_INT, SummaryError, finite_field

RECORD_VERSION = 1
WORKER_STATES = ("ready", "warming", "draining")
# Matched with fullmatch: ``$`` would also accept a trailing newline ("w1\n"), which then splits a
# newline-separated wire message or a Redis key in two.
_WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def validate_worker_id(worker_id: str) -> str:
    if not isinstance(worker_id, str) or not _WORKER_ID.fullmatch(worker_id):
        raise ValueError(
            f"worker id {worker_id!r} must be 1-128 characters of letters, digits, '_', '.', ':' or '-'"
        )
    return worker_id


def split_member_fields(
    fields: Mapping[bytes | str, bytes | str],
) -> tuple[dict[str, bytes | str], list[tuple[bytes | str, str]]]:
    """The members hash as read (HGETALL), keyed by worker id; apart, the fields that name no worker
    (e.g. not UTF-8, written by hand), each as (field as read, printable name of at most 140
    characters). One such field must not fail the whole read."""
    named: dict[str, bytes | str] = {}
    invalid: list[tuple[bytes | str, str]] = []
    for key, raw in fields.items():
        wid = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        if _WORKER_ID.fullmatch(wid):
            named[wid] = raw
        else:
            invalid.append((key, wid[:140]))
    return named, invalid


def validate_state(state: object) -> str:
    if state not in WORKER_STATES:
        raise ValueError(f"state must be one of {', '.join(WORKER_STATES)}, got {state!r}")
    return state  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """``members`` hash value: how to reach a worker and what cache identity it serves."""

    url: str
    state: str = "ready"
    model: str = ""
    revision: str = ""
    adapter: str = ""
    block_tokens: int = 16
    registered_at: float = 0.0
    # The model names its engine answers to (vLLM: every /v1/models id; SGLang: its served model
    # name). Empty: not stated (a sidecar that predates the field, or an engine not asked yet).
    served_models: tuple[str, ...] = ()
    # The LoRA adapters its engine has loaded (vLLM: the /v1/models ids with a parent; SGLang: its
    # lora_paths' names) and the API it speaks, which says how a request names one
    # (blockhash.request_identity). Empty: none, or not stated (older sidecars): every request is
    # hashed under the identity above.
    adapters: tuple[str, ...] = ()
    engine_api: str = ""
    v: int = RECORD_VERSION


@dataclass(frozen=True, slots=True)
class EngineRecord:
    """``engine:{worker}`` value: the member record's engine fields (their meaning is there), written
    by a sidecar run with ``--no-self-register``. The operator writes that worker's member record
    from the fleet's spec and cannot know them; gateways read them from here (:func:`with_engine`),
    and the operator, never writing this key, cannot erase them when it rewrites the record."""

    served_models: tuple[str, ...] = ()
    adapters: tuple[str, ...] = ()
    engine_api: str = ""
    v: int = RECORD_VERSION


@dataclass(frozen=True, slots=True)
class LoadReport:
    """``load:{worker}`` value, published every interval; its ``seq`` advancing is the heartbeat."""

    seq: int  # increases on every publish (liveness judged on the reader's own clock)
    ts: float  # unix seconds when published
    state: str
    engine_ok: bool
    in_flight: int
    queued: int  # requests not yet past prefill (no first byte seen)
    pending_prefill_tokens: int
    prefill_tokens_per_s: float
    cached_tokens: int
    capacity_tokens: int
    summary_version: int
    # engine latency no queued token explains (optional: 0 from sidecars that do not measure it)
    fixed_latency_s: float = 0.0
    # Every request the worker got through its sidecar, whatever gateway sent it, as decayed rates
    # (policies.DecayedRate over RATE_WINDOW_S) at ``ts``: arrivals per second, and uncached tokens
    # per second they wrote to its cache. Optional: None from sidecars that predate them (and in
    # records built by hand); gateways then count their own sends alone.
    arrivals_per_s: float | None = None
    write_tokens_per_s: float | None = None
    v: int = RECORD_VERSION


def encode_record(record: MemberRecord | LoadReport | EngineRecord) -> str:
    # An optional field left unset (None) is written as absent, not null: a record without the
    # newer fields keeps the wire format older readers and pinned tests know, and reads back alike.
    fields = {name: value for name, value in asdict(record).items() if value is not None}
    return json.dumps(fields, separators=(",", ":"))


def _load_json(raw: str | bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except (ValueError, TypeError) as exc:  # ValueError: also an integer of over 4300 digits
        raise SummaryError(f"{what} is not JSON: {exc}") from None
    except RecursionError:  # e.g. "[[[[...": the C scanner gives up on deep nesting
        raise SummaryError(f"{what}: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise SummaryError(f"{what} must be a JSON object")
    if obj.get("v") != RECORD_VERSION:
        raise SummaryError(f"{what}: unsupported record version {obj.get('v')!r}")
    return obj


def _typed(
    obj: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str, default: Any = None
) -> Any:
    value = obj.get(name, default)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise SummaryError(f"{what}: field {name!r} missing or of the wrong type")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise SummaryError(f"{what}: field {name!r} must not be negative")
        if isinstance(value, int) and value > MAX_RECORD_INT:
            raise SummaryError(f"{what}: field {name!r} is larger than {MAX_RECORD_INT}")
    return value


def _seconds_or_rate(obj: dict[str, Any], name: str, what: str, default: Any = None) -> float:
    return finite_field(_typed(obj, name, (int, float), what, default), name, what)


MAX_SERVED_MODELS = 256  # a vLLM engine lists its base model and each LoRA adapter it loaded
MAX_MODEL_NAME = 1024


def _is_model_name(name: object) -> TypeGuard[str]:
    """Whether a member record's served_models may hold ``name``: a string of 1 to MAX_MODEL_NAME
    characters. The one rule behind both the sidecar's filter and the gateway's decoder, so what a
    sidecar publishes is what a gateway accepts."""
    return isinstance(name, str) and 0 < len(name) <= MAX_MODEL_NAME


def servable_names(names: Iterable[object]) -> tuple[str, ...]:
    """The names a member record can carry, from what an engine stated: strings of 1 to
    MAX_MODEL_NAME characters, each once, at most MAX_SERVED_MODELS. A sidecar publishing more would
    have its whole record refused by gateways (its worker dropped from routing)."""
    kept = dict.fromkeys(n for n in names if _is_model_name(n))
    return tuple(kept)[:MAX_SERVED_MODELS]


def _model_names(obj: dict[str, Any], field: str, what: str) -> tuple[str, ...]:
    """An optional list of model names (``served_models``, ``adapters``): absent from records of
    sidecars that predate it, read as none."""
    names = obj.get(field, [])
    if not isinstance(names, list) or len(names) > MAX_SERVED_MODELS:
        raise SummaryError(f"{what}: field {field!r} must be a list of at most {MAX_SERVED_MODELS} names")
    for name in names:
        if not _is_model_name(name):
            shown = str(name)[:140]
            raise SummaryError(
                f"{what}: field {field!r} holds {shown!r}, not a name of 1-{MAX_MODEL_NAME} characters"
            )
    return tuple(dict.fromkeys(names))  # in order, once each


MAX_ENGINE_API = 32


def _engine_api(obj: dict[str, Any], what: str) -> str:
    """The optional ``engine_api``: any short string (an API a later sidecar speaks is read, and its
    requests keep the worker's identity), "" when absent."""
    api = obj.get("engine_api", "")
    if not isinstance(api, str) or len(api) > MAX_ENGINE_API:
        raise SummaryError(
            f"{what}: field 'engine_api' must be a string of at most {MAX_ENGINE_API} characters"
        )
    return api


def decode_member(raw: str | bytes) -> MemberRecord:
    what = "member record"
    obj = _load_json(raw, what)
    url = _typed(obj, "url", str, what)
    if not url.startswith(("http://", "https://")):
        raise SummaryError(f"{what}: url must start with http:// or https://")
    state = _typed(obj, "state", str, what, "ready")
    if state not in WORKER_STATES:
        raise SummaryError(f"{what}: unknown state {state!r}")
    block_tokens = _typed(obj, "block_tokens", int, what, 16)
    if block_tokens == 0:  # requests are hashed in blocks of this many tokens
        raise SummaryError(f"{what}: field 'block_tokens' must be positive")
    return MemberRecord(
        url=url.rstrip("/"),
        state=state,
        model=_typed(obj, "model", str, what, ""),
        revision=_typed(obj, "revision", str, what, ""),
        adapter=_typed(obj, "adapter", str, what, ""),
        block_tokens=block_tokens,
        registered_at=_seconds_or_rate(obj, "registered_at", what, 0.0),
        served_models=_model_names(obj, "served_models", what),
        adapters=_model_names(obj, "adapters", what),
        engine_api=_engine_api(obj, what),
    )


def decode_engine(raw: str | bytes) -> EngineRecord:
    what = "engine record"
    obj = _load_json(raw, what)
    return EngineRecord(
        served_models=_model_names(obj, "served_models", what),
        adapters=_model_names(obj, "adapters", what),
        engine_api=_engine_api(obj, what),
    )


def with_engine(member: MemberRecord, engine: EngineRecord | None) -> MemberRecord:
    """``member`` as gateways route on it: a record that states none of the engine fields (the
    operator's) takes them from its sidecar's engine record; one that states any (a self-registering
    sidecar's) is its sidecar's own word and stays as it is."""
    if engine is None or member.served_models or member.adapters or member.engine_api:
        return member
    return replace(
        member, served_models=engine.served_models, adapters=engine.adapters, engine_api=engine.engine_api
    )


# Far above any engine's (a replica serving a million requests or a billion new tokens a second),
# below what would make a routing score's arithmetic lose its meaning.
MAX_ARRIVALS_PER_S = 1e6
MAX_WRITE_TOKENS_PER_S = 1e9


def _optional_rate(obj: dict[str, Any], name: str, limit: float, what: str) -> float | None:
    """An optional decayed rate: absent or null (a sidecar that predates it) reads as None."""
    if obj.get(name) is None:
        return None
    rate = _seconds_or_rate(obj, name, what)
    if rate > limit:
        raise SummaryError(f"{what}: field {name!r} is {rate!r}, above {limit:g}")
    return rate


def decode_load(raw: str | bytes) -> LoadReport:
    what = "load record"
    obj = _load_json(raw, what)
    state = _typed(obj, "state", str, what)
    if state not in WORKER_STATES:
        raise SummaryError(f"{what}: unknown state {state!r}")
    return LoadReport(
        seq=_typed(obj, "seq", int, what),
        ts=_seconds_or_rate(obj, "ts", what),
        state=state,
        engine_ok=_typed(obj, "engine_ok", bool, what),
        in_flight=_typed(obj, "in_flight", int, what),
        queued=_typed(obj, "queued", int, what),
        pending_prefill_tokens=_typed(obj, "pending_prefill_tokens", int, what),
        prefill_tokens_per_s=_seconds_or_rate(obj, "prefill_tokens_per_s", what),
        cached_tokens=_typed(obj, "cached_tokens", int, what),
        capacity_tokens=_typed(obj, "capacity_tokens", int, what),
        summary_version=_typed(obj, "summary_version", int, what),
        fixed_latency_s=_seconds_or_rate(obj, "fixed_latency_s", what, 0.0),
        arrivals_per_s=_optional_rate(obj, "arrivals_per_s", MAX_ARRIVALS_PER_S, what),
        write_tokens_per_s=_optional_rate(obj, "write_tokens_per_s", MAX_WRITE_TOKENS_PER_S, what),
    )


# -- load pushes (sidecar -> gateways) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadPush:
    """One message on the fleet's loads channel: ``worker`` just wrote ``load`` to ``load:{worker}``."""

    worker: str
    load: LoadReport


def encode_load_push(worker: str, record: str) -> str:
    """``<worker>\\n<load JSON>``, where ``record`` is the load record exactly as written to
    ``load:{worker}`` (``encode_record(report)``): taken encoded so a publish serialises it once."""
    validate_worker_id(worker)
    return f"{worker}\n{record}"


def decode_load_push(data: bytes | str) -> LoadPush:
    """Parse a loads-channel message; anything malformed raises :class:`SummaryError`."""
    if isinstance(data, bytes):
        head, sep, record = data.partition(b"\n")
        worker = head.decode("ascii", "replace")  # a non-ASCII id fails the pattern below
    elif isinstance(data, str):
        worker, sep, record = data.partition("\n")
    else:
        raise SummaryError(f"load push must be bytes or str, not {type(data).__name__}")
    if not sep:
        raise SummaryError("load push: no newline between the worker id and the load record")
    if not _WORKER_ID.fullmatch(worker):
        raise SummaryError(f"load push: bad worker id {worker[:140]!r}")
    try:
        load = decode_load(record)
    except SummaryError as exc:
        raise SummaryError(f"load push of {worker!r}: {exc}") from None
    return LoadPush(worker, load)


# -- send notices (gateway -> gateways) --------------------------------------------------------------

SENDS_MAGIC = b"PFX1"
# A withdrawal: same frame as a send notice under its own magic, so a gateway that predates it
# refuses it as a bad-magic notice (one rate-limited warning) instead of counting it as a send.
WITHDRAW_MAGIC = b"PFW1"
_GATEWAY_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True, slots=True)
class SendNotice:
    """One gateway routed a request whose hash chain is ``hashes`` to ``worker`` at ``sent_at``."""

    gateway: str
    worker: str
    sent_at: float  # unix seconds
    hashes: array  # array('Q'): the request's chained block hashes, in chain order


@dataclass(frozen=True, slots=True)
class SendWithdrawal:
    """The send ``gateway`` made to ``worker`` at ``sent_at`` ended before the engine's first token:
    ``hashes`` (the blocks of its chain past what that gateway had matched) are not cached there."""

    gateway: str
    worker: str
    sent_at: float  # the withdrawn send's time, exactly as its notice carried it
    hashes: array  # array('Q')


def _encode_sends_frame(
    magic: bytes, gateway: str, worker: str, sent_at: float, hashes: Sequence[int]
) -> bytes:
    if not _GATEWAY_ID.fullmatch(gateway):
        raise ValueError(f"gateway id {gateway!r} must be 1-64 letters, digits, '_', '.', ':' or '-'")
    validate_worker_id(worker)
    if not math.isfinite(sent_at) or sent_at < 0:
        raise ValueError(f"send time {sent_at!r} must be a finite non-negative number")
    blocks = pack_le(array("Q", hashes))
    # repr: the shortest text that reads back as the same float (withdrawals match sends on it)
    return magic + f"{gateway}\n{worker}\n{sent_at!r}\n".encode() + blocks


def encode_send(gateway: str, worker: str, sent_at: float, hashes: Sequence[int]) -> bytes:
    """``PFX1 <gateway>\\n<worker>\\n<sent_at>\\n`` then the hashes as little-endian u64."""
    return _encode_sends_frame(SENDS_MAGIC, gateway, worker, sent_at, hashes)


def encode_withdraw(gateway: str, worker: str, sent_at: float, hashes: Sequence[int]) -> bytes:
    """``PFW1 <gateway>\\n<worker>\\n<sent_at>\\n`` then the withdrawn hashes as little-endian u64;
    ``sent_at`` is the withdrawn send's time as its notice carried it."""
    return _encode_sends_frame(WITHDRAW_MAGIC, gateway, worker, sent_at, hashes)


def _decode_sends_frame(data: bytes, what: str) -> tuple[str, str, float, array]:
    parts = data[4:].split(b"\n", 3)
    if len(parts) != 4:
        raise SummaryError(f"{what}: header must be gateway, worker and time lines")
    gateway, worker, sent, body = parts
    try:
        gateway_s, worker_s = gateway.decode("ascii"), worker.decode("ascii")
        sent_at = float(sent)
    except (UnicodeDecodeError, ValueError):
        raise SummaryError(f"{what}: unreadable gateway, worker or time") from None
    if not _GATEWAY_ID.fullmatch(gateway_s) or not _WORKER_ID.fullmatch(worker_s):
        raise SummaryError(f"{what}: bad gateway or worker id")
    if not math.isfinite(sent_at) or sent_at < 0:
        raise SummaryError(f"{what}: time must be a finite non-negative number")
    if len(body) % 8:
        raise SummaryError(f"{what}: {len(body)} bytes of hashes is not a multiple of 8")
    return gateway_s, worker_s, sent_at, unpack_le("Q", body)


def _as_bytes(data: bytes | str) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8", "surrogateescape")
    if not isinstance(data, bytes):
        raise SummaryError(f"sends-channel message must be bytes or str, not {type(data).__name__}")
    return data


def decode_send(data: bytes | str) -> SendNotice:
    """Parse a send notice; anything malformed raises :class:`SummaryError`."""
    data = _as_bytes(data)
    if not data.startswith(SENDS_MAGIC):
        raise SummaryError("send notice: bad magic")
    return SendNotice(*_decode_sends_frame(data, "send notice"))


def decode_withdraw(data: bytes | str) -> SendWithdrawal:
    """Parse a send withdrawal; anything malformed raises :class:`SummaryError`."""
    data = _as_bytes(data)
    if not data.startswith(WITHDRAW_MAGIC):
        raise SummaryError("send withdrawal: bad magic")
    return SendWithdrawal(*_decode_sends_frame(data, "send withdrawal"))


def decode_sends_message(data: bytes | str) -> SendNotice | SendWithdrawal:
    """Parse any message of the sends channel by its magic; an unknown kind (a newer gateway's) or
    anything malformed raises :class:`SummaryError`, for the reader to skip with a warning."""
    data = _as_bytes(data)
    if data.startswith(SENDS_MAGIC):
        return decode_send(data)
    if data.startswith(WITHDRAW_MAGIC):
        return decode_withdraw(data)
    raise SummaryError(f"sends channel: unknown message kind {data[:4]!r}")

"""What the SGLang face adds to an EmulatorConfig: SGLang's LoRA flags and its API key (pure).

LoRA as SGLang serves it (its sources, read 2026-12-02: ``server_args`` / ``LoRAPathAction``,
``lora/lora_registry.py``, ``TokenizerManager.generate_request``, ``serving_base._resolve_lora_path``,
``http_server.available_models``):

* ``--lora-paths`` entries are ``<PATH>`` (its own name), ``<NAME>=<PATH>`` or a JSON object
  ``{"lora_name", "lora_path", "pinned"}``; giving them turns ``--enable-lora`` on; a name given twice
  refuses to start.
* A request names an adapter by ``lora_path`` (``/generate``; an extra field of the OpenAI bodies) or,
  on the OpenAI routes, by ``model`` of the form ``"base:adapter"``. Without ``--enable-lora`` it is
  ignored (SGLang looks adapters up only ``if enable_lora and obj.lora_path``); with it, an adapter
  not loaded is refused (the registry's ValueError, a 400).
* SGLang's radix cache keys a prompt by its adapter (and cache salt): the same prompt under another
  adapter, or the base model, is a miss.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prefixfleet.router.blockhash import requested_adapter
from prefixfleet.router.engine_api import SGLANG  # the API whose adapter rule applies

from .protocol import BadRequest


@dataclass(frozen=True, slots=True)
class LoraRef:
    """One adapter SGLang serves (its LoRARef, without the generated id)."""

    name: str
    path: str
    pinned: bool = False


def parse_lora_path(item: str) -> LoraRef:
    """One ``--lora-paths`` value as SGLang reads it; ValueError naming what is wrong (SGLang itself
    fails with an assertion or a JSON traceback there)."""
    text = item.strip()
    if text.startswith("{") and text.endswith("}"):
        try:
            obj = json.loads(text)
        except ValueError:
            raise ValueError(f"--lora-paths {item!r} looks like JSON but is not valid JSON") from None
        if not isinstance(obj, dict) or "lora_name" not in obj or "lora_path" not in obj:
            raise ValueError(
                f"--lora-paths {item!r} looks like a JSON str, but it does not contain 'lora_name' and "
                "'lora_path' keys"
            )
        name, path, pinned = obj["lora_name"], obj["lora_path"], obj.get("pinned", False)
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            raise ValueError(f"--lora-paths {item!r}: lora_name and lora_path must be non-empty strings")
        if not isinstance(pinned, bool):
            raise ValueError(f"--lora-paths {item!r}: pinned must be true or false")
        return LoraRef(name, path, pinned)
    name, sep, path = text.partition("=")
    if not sep:
        name = path = text
    if not name or not path:
        raise ValueError(f"--lora-paths {item!r}: expected PATH, NAME=PATH or a JSON object")
    return LoraRef(name, path)


@dataclass(frozen=True, slots=True)
class SglangOptions:
    """SGLang's flags the emulator's SGLang face honours."""

    enable_lora: bool = False  # --enable-lora (on whenever lora_paths are given, as in SGLang)
    lora_paths: tuple[LoraRef, ...] = ()  # --lora-paths: adapters loaded at start
    api_key: str | None = field(default=None, repr=False)  # --api-key: kept out of repr, so of logs

    def __post_init__(self) -> None:
        if self.lora_paths and not self.enable_lora:
            object.__setattr__(self, "enable_lora", True)

    def problems(self) -> list[str]:
        names = [lora.name for lora in self.lora_paths]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            return [f"--lora-paths names an adapter twice: {', '.join(twice)} (SGLang refuses to start)"]
        return []


def server_info_loras(loras: Sequence[LoraRef]) -> list[dict[str, object]]:
    """``lora_paths`` as ``/get_server_info`` states them (LoRARef objects, as later SGLang
    normalises the flag; the sidecar reads adapter names from here)."""
    return [{"lora_name": r.name, "lora_path": r.path, "pinned": r.pinned} for r in loras]


def _lora_path_field(value: object, prompts: int, batch: bool) -> tuple[str | None, ...]:
    if value is None or isinstance(value, str):
        return (value or None,) * prompts
    if (
        isinstance(value, list)
        and batch
        and len(value) == prompts
        and all(v is None or isinstance(v, str) for v in value)
    ):
        return tuple(v or None for v in value)
    raise BadRequest(
        "lora_path must be a string (or, for a batch, a list with one string or null per prompt), "
        f"got {type(value).__name__}" + (f" of {len(value)}" if isinstance(value, list) else ""),
        "lora_path",
    )


def requested_adapters(
    body: Mapping[str, object], prompts: int, batch: bool, *, openai: bool
) -> tuple[tuple[str | None, ...], str]:
    """The adapter each prompt of a request names, by SGLang's rule (``model: "base:adapter"`` on the
    OpenAI routes, else ``lora_path``), and the field that named them."""
    from_field = _lora_path_field(body.get("lora_path"), prompts, batch)
    model = body.get("model") if openai else None
    if isinstance(model, str):
        adapter = requested_adapter(SGLANG, model, None)
        if adapter is not None:
            return (adapter,) * prompts, "model"
    return from_field, "lora_path"


def registry_keys(loaded: Sequence[str]) -> str:
    """The adapters loaded, as SGLang's messages print its registry's keys (an OrderedDict's)."""
    return f"odict_keys({list(loaded)!r})"


def not_loaded_message(name: str, loaded: Sequence[str]) -> str:
    """SGLang's refusal of an adapter it has not loaded (LoRARegistry.acquire), its words."""
    loaded_keys = registry_keys(loaded)
    return f"The following requested LoRA adapters are not loaded: {name}\nLoaded adapters: {loaded_keys}."


def check_adapters(adapters: tuple[str | None, ...], loaded: Sequence[str], param: str) -> None:
    """Every adapter named must be loaded: a 400 in SGLang's words for the first that is not."""
    for name in adapters:
        if name is not None and name not in loaded:
            raise BadRequest(not_loaded_message(name, loaded), param)

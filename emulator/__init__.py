"""GPU-free engine emulator speaking SGLang's HTTP API, or vLLM's (see docs/emulator.md).

Programmatic use::

    from prefixfleet.emulator import EmulatorConfig, EmulatorServer, start_emulator

    async with EmulatorServer(EmulatorConfig(time_scale=50), port=0) as server:
        ...  # server.url, server.engine (EngineRunner), server.engine.model (EngineModel)
"""

from .config import DEFAULT_MODEL, EmulatorConfig
from .server import EmulatorServer, start_emulator
from .sglang_options import SglangOptions
from .vllm_api import VllmOptions

__all__ = [
    "DEFAULT_MODEL",
    "EmulatorConfig",
    "EmulatorServer",
    "SglangOptions",
    "VllmOptions",
    "start_emulator",
]

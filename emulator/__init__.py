"""GPU-free engine emulator speaking SGLang's HTTP API."""

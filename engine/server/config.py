"""Configuration of the engine server (`pagedkube serve`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.lora.modules import LoRAModule
from pagedkube.http_head_limits import HeadLimits
from pagedkube.observability import ObservabilityConfig


@dataclass(slots=True)
class ServerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: str | None = None  # None = the engine's model name (its directory name)
    host: str = "127.0.0.1"
    port: int = 8000                      # vLLM's default port (docs/interfaces.md)
    api_key: str | None = None            # bearer token required on /v1/*, /tokenize, /detokenize
    max_waiting: int | None = 4096        # sequences (n x prompts): 16 x max_num_seqs' default (256); None = unbounded
    drain_timeout: float = 25.0           # seconds; under Kubernetes' default 30 s grace period
    engine_in_process: bool = False       # step the engine in a thread of the HTTP process (debugging)
    max_request_tokens: int | None = None  # prompt + n x max_tokens over a request's prompts; None = no cap
    max_body_bytes: int = 16 << 20        # 413 above: a 10 MB prompt still fits; a 128k-token context is ~0.5 MB
    body_read_timeout: float = 30.0       # 408 for a body not received in full in this many s (http_limits.py)
    head_limits: HeadLimits = field(default_factory=HeadLimits)   # header size/count/deadline, connections
    heartbeat_timeout: float = 30.0       # s without word from the engine core before /health fails (core_client.py)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)   # access log, tracing
    # Parses tool calls out of tool_choice "auto" answers (tool_parsers.py); auto = the one the chat
    # template's format calls for, none = off (then tool_choice "auto" with tools is a 400, as in vLLM).
    tool_call_parser: str = "auto"
    lora_modules: tuple[LoRAModule, ...] = ()   # adapters served from start-up (--lora-modules)
    lora_modules_file: str | None = None        # adapters listed in a file, followed while running (lora_file.py)
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter: off by default, as in vLLM (the
    # caller names a path on the server's disk)
    allow_runtime_lora_updating: bool = False
    generation_config: str = "auto"       # request sampling defaults: auto | vllm | FOLDER (sampling_defaults.py)

    def __post_init__(self) -> None:
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.max_request_tokens is not None and self.max_request_tokens < 1:
            raise ValueError(f"max_request_tokens must be >= 1, got {self.max_request_tokens}")
        if self.max_body_bytes < 1 or not self.body_read_timeout > 0:
            raise ValueError("max_body_bytes must be >= 1 and body_read_timeout > 0")
        if not self.heartbeat_timeout > 0:
            raise ValueError(f"heartbeat_timeout must be > 0, got {self.heartbeat_timeout}")
        from pagedkube.engine.server.tool_parsers import PARSER_NAMES
        if self.tool_call_parser not in PARSER_NAMES:
            raise ValueError(f"tool_call_parser must be one of {PARSER_NAMES}, got {self.tool_call_parser!r}")
        if (self.lora_modules or self.lora_modules_file or self.allow_runtime_lora_updating) \
                and not self.engine.enable_lora:
            raise ValueError("--lora-modules, --lora-modules-file and --allow-runtime-lora-updating need --enable-lora")
        names = [m.name for m in self.lora_modules]
        if len(set(names)) != len(names):
            raise ValueError(f"--lora-modules names an adapter twice: {names}")
        if not self.generation_config:
            raise ValueError("generation_config must be auto, vllm or a folder")
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must be >= 0, got {self.drain_timeout}")

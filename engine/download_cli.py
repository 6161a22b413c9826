"""`pagedkube download MODEL`: a Hub model fetched into the Hugging Face cache and made ready to
serve (a GGUF's tokenizer converted into the engine's cache), without serving it, as `ollama pull`
does. The operator's model-download init container runs it; its last line is the model's path,
or one `error:` line and exit code 2 (with --termination-log, the container's termination message,
which the LLMService's status shows)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from pagedkube.model_source import MODEL_FLAG_HELP


def add_download_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("download", help="fetch a Hugging Face Hub model into the cache (no server)",
                              description="Download a Hub model (ORG/NAME, ORG/NAME:QUANT) into huggingface_hub's "
                                          "cache, check that the engine can serve it, and print its local path.")
    p.add_argument("model_tag", nargs="?", metavar="MODEL", help="the model (the same as --model)")
    p.add_argument("--model", default=None, help=MODEL_FLAG_HELP)
    p.add_argument("--lora-modules-file", metavar="FILE", default=None,
                   help="also fetch the Hub adapters this --lora-modules-file lists (one that fails is reported "
                        "and left to the engine, which tries again)")
    p.add_argument("--termination-log", metavar="PATH", default=None,
                   help="also write the error line here (Kubernetes reads /dev/termination-log into the pod's "
                        "status; the operator passes it)")
    p.set_defaults(func=run_download)
    return p


def run_download(args: argparse.Namespace) -> int:
    from pagedkube.engine.server.serve_cli import resolve_model
    from pagedkube.hub_download import log_progress_to_stderr
    from pagedkube.model_source import hub_model_of

    log_progress_to_stderr()
    model = args.model_tag or args.model
    try:
        if hub_model_of(model) is None:
            raise ValueError(f"{model!r} is not a Hugging Face Hub model name (ORG/NAME, ORG/NAME:QUANT, "
                             f"ORG/NAME/FILE.gguf, each with an optional @REVISION)")
        path = resolve_model(model)
        if path.is_file():   # a GGUF: its tokenizer conversion, once, into the engine's cache
            from pagedkube.engine.gguf.prepare import gguf_model_dir

            gguf_model_dir(path)
    except ValueError as e:
        line = f"pagedkube download: error: {e}"
        print(line, file=sys.stderr, flush=True)
        if args.termination_log:
            with open(args.termination_log, "w") as f:
                f.write(str(e))
        return 2
    if args.lora_modules_file:
        fetch_adapters(args.lora_modules_file)
    print(path, flush=True)
    return 0


def fetch_adapters(modules_file: str) -> None:
    """The Hub adapters of a --lora-modules-file into the Hub cache, where the engine finds them
    without a Hub request. Not fatal: a bad adapter costs its own name in the engine, never the pod."""
    from pathlib import Path

    from pagedkube.engine.server.lora_file import read_lora_modules_file
    from pagedkube.hub_download import resolve_adapter_path

    try:
        modules = read_lora_modules_file(Path(modules_file))
    except (ValueError, OSError) as e:
        print(f"pagedkube download: warning: {e}", file=sys.stderr, flush=True)
        return
    for module in modules:
        try:
            local = resolve_adapter_path(module.path)
        except ValueError as e:
            print(f"pagedkube download: warning: LoRA adapter {module.name}: {e}", file=sys.stderr, flush=True)
            continue
        if local != module.path:
            print(f"LoRA adapter {module.name}: {module.path} -> {local}", file=sys.stderr, flush=True)

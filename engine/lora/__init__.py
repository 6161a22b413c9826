"""LoRA adapters served batched (docs/engine.md "LoRA adapters"): many fine-tunes of one base
model in one engine, their requests mixed in one step with the base model's.

    request.py        LoRARequest(lora_name, lora_int_id, lora_path): vLLM's shape (torch-free)
    modules.py        --lora-modules values: name=path or vLLM's JSON form (torch-free)
    peft_format.py    read and check a PEFT adapter directory against the model
    punica.py         the per-slot delta: its layout, grouped matmuls (CPU), the per-token reference
    triton_punica.py  the same delta as Triton kernels (CUDA), Punica's BGMV style
    layers.py         LoRALinear: a projection plus the step's delta; install_lora wraps a model
    manager.py        LoRAManager: host-memory LRU and device slots, the step's token slots
"""

"""GGUF models (llama.cpp's file format) in the engine.

    reader.py    the file: metadata, tensors one at a time, dequantize (the `gguf` package)
    header.py    the header (metadata, tensor table) read in bulk: gguf-py's fields in milliseconds
    config.py    metadata -> config.json, as transformers maps it
    prepare.py   config and tokenizer as Hugging Face files, cached by the file's sha256
    weights.py   tensor names and llama's q/k row order -> Hugging Face's
    packing.py   GGUF's quantized blocks kept packed for QuantLinear (engine/quant/)
"""

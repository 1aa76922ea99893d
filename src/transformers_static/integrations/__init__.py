"""Integrations with other formats and engines: GGUF / llama.cpp checkpoints (`ggml`, `ggml_tokenizer`), tensor
parallelism over torch.distributed (`tensor_parallel`)."""

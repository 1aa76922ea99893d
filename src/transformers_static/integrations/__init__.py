"""Integrations with other formats and libraries (GGUF / llama.cpp)."""

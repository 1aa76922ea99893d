from setuptools import find_packages, setup

UPSTREAM = "transformers==5.23.0"  # the behavioural reference, pinned

extras = {
    "bench": [UPSTREAM, "matplotlib>=3.7", "tqdm>=4.60"],
    "tokenizers": ["tokenizers>=0.15"],
    "gguf": ["gguf>=0.16", "tokenizers>=0.15"],  # GGUF (llama.cpp) checkpoints: weights and tokenizer
}
# accelerate: upstream's GGUF loading (the reference in the GGUF tests) requires it
extras["testing"] = [
    "pytest>=8",
    "parameterized>=0.9",
    "ruff>=0.6",
    "accelerate",
    *extras["bench"],
    *extras["tokenizers"],
    *extras["gguf"],
]

setup(
    name="transformers-static",
    version="0.1.0",
    description="Compile-friendly generation for Hugging Face-style causal LMs: static 4D masks, static caches.",
    package_dir={"": "src"},
    packages=find_packages("src"),
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "safetensors>=0.4"],
    extras_require=extras,
    entry_points={"console_scripts": ["transformers-static=transformers_static.cli:main"]},
)

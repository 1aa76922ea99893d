from setuptools import find_packages, setup

UPSTREAM = "transformers==5.23.0"  # the behavioural reference, pinned

extras = {
    "bench": [UPSTREAM, "matplotlib>=3.7", "tqdm>=4.60"],
    # AutoTokenizer, chat templates (jinja2's sandbox fixes from 3.1.6), streamers, pipeline("text-generation")
    "tokenizers": ["tokenizers>=0.22", "jinja2>=3.1.6"],
    # Hub ids ("org/name"): the local Hugging Face cache, downloads when online
    "hub": ["huggingface_hub>=0.30"],
    # GGUF (llama.cpp) checkpoints: weights, config and tokenizer
    "gguf": ["gguf>=0.16", "tokenizers>=0.22"],
    # `transformers-static serve`: the HTTP stack (the chat template needs the tokenizers extra)
    "serve": ["fastapi>=0.110", "uvicorn>=0.29", "tokenizers>=0.22", "jinja2>=3.1.6"],
}
# accelerate: upstream's GGUF loading (the reference in the GGUF tests) requires it
extras["testing"] = [
    "pytest>=8",
    "pytest-xdist>=3.5",  # `make test` runs on two workers
    "parameterized>=0.9",
    "ruff>=0.6",
    "accelerate",
    *extras["bench"],
    *extras["tokenizers"],
    *extras["hub"],
    *extras["gguf"],
    *extras["serve"],
    "openai>=1.30",  # the serve tests drive the server with the official client
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
    entry_points={"console_scripts": ["transformers-static=transformers_static.commands:main"]},
)

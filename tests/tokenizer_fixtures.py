"""Real tokenizers built with the `tokenizers` library and saved as checkpoints ship them: byte-level BPE (GPT-2),
a SmolLM2-style BPE with a chat template, a Llama-2-style SentencePiece BPE with byte fallback, a Unigram."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = [
    "Hello world! This is a small test of the tokenizer, with punctuation: yes; no? maybe...",
    "The quick brown fox jumps over the lazy dog 12345 times in 2024.",
    "Ünïcödé text: café, naïve, São Paulo, Zürich, Ελληνικά, русский.",
    "emoji 🎉🙂 and 中文字符 测试 and 日本語",
    "  leading spaces\tand tabs\nand newlines\n\nparagraphs",
    "You are a helpful assistant. What is the capital of France? Paris is the capital.",
] * 8

# Strings the comparisons encode: unicode, emoji, leading spaces, special tokens inside text, empty strings.
TEXTS = [
    "Hello world!",
    " leading space",
    "   three leading spaces",
    "",
    " ",
    "Ünïcödé café naïve Zürich",
    "emoji 🎉🙂👍🏽 done 🤖",
    "中文字符 测试 日本語テキスト",
    "tabs\tand\nnewlines\n\n",
    "numbers 12345 and 3.14159",
    "can't won't it's I'm we've they're",
    "trailing space ",
    "An  Apple,  Fine   day",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama-2's template: raise_exception, loopcontrols-free indexing, bos/eos from the special tokens.
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# Exercises trim_blocks/lstrip_blocks, loop controls, namespace, tojson of non-ASCII and strftime_now's presence.
FEATURE_TEMPLATE = """{% set ns = namespace(count=0) %}
{% for message in messages %}
  {% if message['role'] == 'system' %}{% continue %}{% endif %}
  {% set ns.count = ns.count + 1 %}
<|im_start|>{{ message['role'] }} {{ ns.count }}
{{ message['content'] | tojson }}<|im_end|>
{% endfor %}
{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}
{% if strftime_now is defined %}[dated]{% endif %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def _write(path: str, tokenizer: Tokenizer, config: dict[str, Any], model_type: str | None = None) -> str:
    os.makedirs(path, exist_ok=True)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    if model_type is not None:
        with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
            json.dump({"model_type": model_type}, f)
    return path


def byte_level_bpe(special_tokens: list[str], digits: bool = False, vocab_size: int = 500) -> Tokenizer:
    """GPT-2 style: byte-level pre-tokenizer and decoder (SmolLM2 style adds a digit split)."""
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]) if digits else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def gpt2_tokenizer(path: str, tokenizer_class: str = "GPT2Tokenizer", json_settings: bool = False) -> str:
    """GPT-2's layout; `json_settings` puts padding (left, with a pad token) and truncation into tokenizer.json."""
    config = {"tokenizer_class": tokenizer_class, "model_max_length": 1024, "add_prefix_space": False}
    for name in ("bos_token", "eos_token", "unk_token"):
        config[name] = "<|endoftext|>"
    tokenizer = byte_level_bpe(["<|endoftext|>", "<pad>"])
    if json_settings:
        tokenizer.enable_padding(direction="left", pad_id=1, pad_token="<pad>")
        tokenizer.enable_truncation(max_length=8, direction="left")
    return _write(path, tokenizer, config, model_type="gpt2")


def smollm_tokenizer(path: str, tokenizer_class: str = "GPT2Tokenizer") -> str:
    """SmolLM2-135M-Instruct's layout: ChatML specials, digits split, a chat template, pad = eos."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>"]
    config = {
        "tokenizer_class": tokenizer_class,
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "model_max_length": 8192,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHATML_TEMPLATE,
    }
    return _write(path, byte_level_bpe(specials, digits=True), config, model_type="llama")


def llama2_tokenizer(path: str, tokenizer_class: str = "LlamaTokenizer", **config: Any) -> str:
    """Llama-2 style SentencePiece BPE: "▁" for spaces, byte-fallback pieces <0x00>..<0xFF>, <s> prepended."""
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    trained.train_from_iterator(CORPUS, trainer)
    spec = json.loads(trained.to_str())
    learned = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    pieces += [token for token, _ in learned if token not in pieces]
    spec["model"].update(vocab={token: i for i, token in enumerate(pieces)}, byte_fallback=True, fuse_unk=True)
    spec["added_tokens"] = [{**t, "id": pieces.index(t["content"])} for t in spec["added_tokens"]]
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
    )
    settings = {
        "tokenizer_class": tokenizer_class,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "add_bos_token": True,
        "legacy": False,
        "padding_side": "right",
        "chat_template": LLAMA2_TEMPLATE,
        **config,
    }
    return _write(path, tokenizer, settings, model_type="llama")


def unigram_tokenizer(path: str) -> str:
    """A SentencePiece Unigram (T5 style: Metaspace, </s> appended), loaded as tokenizer.json is."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "clean_up_tokenization_spaces": True,
    }
    return _write(path, tokenizer, config)


def qwen2_tokenizer(path: str) -> str:
    """A Qwen2 checkpoint whose Hub class is wrong (upstream uses Qwen2Tokenizer for model_type qwen2)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    config["chat_template"] = CHATML_TEMPLATE
    return _write(path, byte_level_bpe(specials), config, model_type="qwen2")


def qwen3_5_tokenizer(path: str) -> str:
    """A Qwen3.5 checkpoint: its own class (a split that keeps combining marks in words)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    config = {"tokenizer_class": "Qwen3_5Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return _write(path, byte_level_bpe(specials), config, model_type="qwen3_5_text")


def neox_tokenizer(path: str) -> str:
    config = {"tokenizer_class": "GPTNeoXTokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    return _write(path, byte_level_bpe(["<|endoftext|>", "<|padding|>"]), config, model_type="gpt_neox")


def gemma_tokenizer(path: str) -> str:
    """A Llama-2 style tokenizer.json loaded as GemmaTokenizer (its own normalizer and specials)."""
    llama2_tokenizer(path, tokenizer_class="GemmaTokenizer", bos_token="<s>", eos_token="</s>")
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"model_type": "gemma"}, f)
    return path


COHERE_TOOL_USE_TEMPLATE = (
    "{{ bos_token }}{% for tool in tools %}tool {{ tool['name'] }}\n{% endfor %}"
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
)
COHERE_RAG_TEMPLATE = (
    "{{ bos_token }}{% for document in documents %}doc: {{ document['text'] }}\n{% endfor %}"
    "mode {{ citation_mode }}\n{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
)


def cohere_tokenizer(path: str) -> str:
    """Command-R's layout: byte-level BPE with digits split, its specials, bos added, named chat templates."""
    specials = ["<PAD>", "<UNK>", "<CLS>", "<SEP>", "<MASK_TOKEN>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"]
    config = {
        "tokenizer_class": "CohereTokenizer",
        "add_bos_token": True,
        "chat_template": [
            {"name": "default", "template": CHATML_TEMPLATE},
            {"name": "tool_use", "template": COHERE_TOOL_USE_TEMPLATE},
            {"name": "rag", "template": COHERE_RAG_TEMPLATE},
        ],
    }
    return _write(path, byte_level_bpe(specials, digits=True), config, model_type="cohere")


def openai_gpt_tokenizer(path: str) -> str:
    """GPT-1's layout: lower-cased BERT-style words, BPE pieces ending a word with "</w>"."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.BPEDecoder(suffix="</w>")
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>"], end_of_word_suffix="</w>", show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    config = {"tokenizer_class": "OpenAIGPTTokenizer", "unk_token": "<unk>", "model_max_length": 512}
    return _write(path, tokenizer, config, model_type="openai-gpt")


# A SentencePiece normaliser blob (what XGLM's tokenizer.json stores as `Precompiled`): sentencepiece 0.2.3's
# `spm_train --normalization_rule_tsv` output for the rules "A" -> "a", "Fi" -> "fi".
SPM_CHARSMAP = (
    "AAQAAAAAAQBBDQAAAAAAgGkdAAACAACABAAAAEawAQAGAAAACQAAAAgAAAALAAAACgAAAA0AAAAMAAAADwAAAA4AAAARAAAAEAAAABMAAAASAA"
    "AAFQAAABQAAAAXAAAAFgAAABkAAAAYAAAAGwAAABoAAAAdAAAAHAAAAB8AAAAeAAAAIQAAACAAAAAjAAAAIgAAACUAAAAkAAAAJwAAACYAAAAp"
    "AAAAKAAAACsAAAAqAAAALQAAACwAAAAvAAAALgAAADEAAAAwAAAAMwAAADIAAAA1AAAANAAAADcAAAA2AAAAOQAAADgAAAA7AAAAOgAAAD0AAA"
    "A8AAAAPwAAAD4AAABBAAAAQAAAAEMAAABCAAAARQAAAEQAAABHAAAARgAAAEkAAABIAAAASwAAAEoAAABNAAAATAAAAE8AAABOAAAAUQAAAFAA"
    "AABTAAAAUgAAAFUAAABUAAAAVwAAAFYAAABZAAAAWAAAAFsAAABaAAAAXQAAAFwAAABfAAAAXgAAAGEAAABgAAAAYwAAAGIAAABlAAAAZAAAAG"
    "cAAABmAAAAaQAAAGgAAABrAAAAagAAAG0AAABsAAAAbwAAAG4AAABxAAAAcAAAAHMAAAByAAAAdQAAAHQAAAB3AAAAdgAAAHkAAAB4AAAAewAA"
    "AHoAAAB9AAAAfAAAAH8AAAB+AAAAgQAAAIAAAACDAAAAggAAAIUAAACEAAAAhwAAAIYAAACJAAAAiAAAAIsAAACKAAAAjQAAAIwAAACPAAAAjg"
    "AAAJEAAACQAAAAkwAAAJIAAACVAAAAlAAAAJcAAACWAAAAmQAAAJgAAACbAAAAmgAAAJ0AAACcAAAAnwAAAJ4AAAChAAAAoAAAAKMAAACiAAAA"
    "pQAAAKQAAACnAAAApgAAAKkAAACoAAAAqwAAAKoAAACtAAAArAAAAK8AAACuAAAAsQAAALAAAACzAAAAsgAAALUAAAC0AAAAtwAAALYAAAC5AA"
    "AAuAAAALsAAAC6AAAAvQAAALwAAAC/AAAAvgAAAMEAAADAAAAAwwAAAMIAAADFAAAAxAAAAMcAAADGAAAAyQAAAMgAAADLAAAAygAAAM0AAADM"
    "AAAAzwAAAM4AAADRAAAA0AAAANMAAADSAAAA1QAAANQAAADXAAAA1gAAANkAAADYAAAA2wAAANoAAADdAAAA3AAAAN8AAADeAAAA4QAAAOAAAA"
    "DjAAAA4gAAAOUAAADkAAAA5wAAAOYAAADpAAAA6AAAAOsAAADqAAAA7QAAAOwAAADvAAAA7gAAAPEAAADwAAAA8wAAAPIAAAD1AAAA9AAAAPcA"
    "AAD2AAAA+QAAAPgAAAD7AAAA+gAAAP0AAAD8AAAA/wAAAP4AAABhAGZpAA=="
)


def xglm_tokenizer(path: str) -> str:
    """XGLM's layout: a SentencePiece Unigram with <s> <pad> </s> <unk> first, a precompiled normaliser and a
    Metaspace prefix."""
    tokenizer = Tokenizer(models.Unigram())
    charsmap = normalizers.Precompiled(base64.b64decode(SPM_CHARSMAP))
    tokenizer.normalizer = normalizers.Sequence([charsmap, normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return _write(path, tokenizer, {"tokenizer_class": "XGLMTokenizer"}, model_type="xglm")


def tiny_llama_checkpoint(path: str, tokenizer_builder: Any = smollm_tokenizer) -> str:
    """A checkpoint dir: the tokenizer `tokenizer_builder` writes, and a tiny random upstream Llama over it."""
    import torch
    import transformers

    tokenizer_builder(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.5,  # logits far apart: greedy picks are robust to rounding
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path

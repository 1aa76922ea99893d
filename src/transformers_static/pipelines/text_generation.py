"""TextGenerationPipeline: upstream's "text-generation" pipeline (strings or chats in, `generated_text` out) over a
causal LM of this library."""

from __future__ import annotations

import enum
from typing import Any

import torch

from ..generation import GenerationConfig
from ..utils.chat_template_utils import Chat, is_valid_message

# Parameters set by neither the user nor the model's generation config take these values, as upstream's pipeline.
DEFAULT_GENERATION = {"max_new_tokens": 256, "do_sample": True, "temperature": 0.7}
SAMPLING_PARAMS = {"temperature", "top_k", "top_p", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff"}
UNSUPPORTED = ("prefix", "handle_long_generation", "stop_sequence", "num_workers")


class ReturnType(enum.Enum):
    TENSORS = 0
    NEW_TEXT = 1
    FULL_TEXT = 2


class TextGenerationPipeline:
    """`pipe("text")` -> `[{"generated_text": "text..."}]`; `pipe([messages])` -> the messages with the assistant's
    reply appended; a list of inputs -> a list of such results. kwargs at construction or call: `max_new_tokens`,
    `do_sample`, ... (to `generate`), `return_full_text`, `return_text`, `return_tensors`, `skip_special_tokens`,
    `clean_up_tokenization_spaces`, `continue_final_message`, `add_special_tokens`, `padding`, `truncation`,
    `max_length`, `tokenizer_encode_kwargs`, `tools`, `documents`, `batch_size`."""

    task = "text-generation"

    def __init__(self, model: Any, tokenizer: Any, device: Any = None, batch_size: int | None = None, **kwargs: Any):
        self.model, self.tokenizer = model, tokenizer
        self.device = _pipeline_device(device, model)
        if model.device != self.device:
            model.to(self.device)
        if tokenizer.padding_side == "right":
            tokenizer.padding_side = "left"
        generation_keys = GenerationConfig.field_names() | {"generation_config"}
        self._generate_kwargs = {key: kwargs.pop(key) for key in generation_keys & kwargs.keys()}
        self._generation_defaults = dict(DEFAULT_GENERATION)
        if tokenizer.pad_token_id is not None:
            self._generation_defaults["pad_token_id"] = tokenizer.pad_token_id
        self._batch_size = batch_size
        self._params = self._sanitize_parameters(**kwargs)

    def __call__(self, text_inputs: Any, batch_size: int | None = None, **kwargs: Any) -> list[Any]:
        inputs = _as_chats(text_inputs)
        call_params = self._sanitize_parameters(**kwargs)
        pre, forward, post = ({**init, **call} for init, call in zip(self._params, call_params, strict=True))
        if not isinstance(inputs, list):
            return self._run([inputs], pre, forward, post)[0]
        size = batch_size or self._batch_size or 1
        return [
            out
            for start in range(0, len(inputs), size)
            for out in self._run(inputs[start : start + size], pre, forward, post)
        ]

    def _sanitize_parameters(
        self,
        return_full_text: bool | None = None,
        return_tensors: bool | None = None,
        return_text: bool | None = None,
        return_type: ReturnType | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        truncation: bool | None = None,
        max_length: int | None = None,
        continue_final_message: bool | None = None,
        skip_special_tokens: bool | None = None,
        tokenizer_encode_kwargs: dict[str, Any] | None = None,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        **generate_kwargs: Any,
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Split kwargs into tokenizer (preprocess), generate (forward) and decode (postprocess) parameters."""
        for name in UNSUPPORTED:
            if generate_kwargs.get(name) is not None:
                raise NotImplementedError(
                    f"The text-generation pipeline of transformers_static does not support {name}="
                )
        pre = {k: generate_kwargs.pop(k) for k in ("add_special_tokens", "padding") if k in generate_kwargs}
        named = {"truncation": truncation, "max_length": max_length, "tools": tools, "documents": documents}
        named.update(continue_final_message=continue_final_message, tokenizer_encode_kwargs=tokenizer_encode_kwargs)
        pre.update({k: v for k, v in named.items() if v is not None})
        if max_length is not None:
            generate_kwargs["max_length"] = max_length
        post = {}
        if return_full_text is not None and return_type is None:
            if return_text is not None:
                raise ValueError("`return_text` is mutually exclusive with `return_full_text`")
            if return_tensors is not None:
                raise ValueError("`return_full_text` is mutually exclusive with `return_tensors`")
            return_type = ReturnType.FULL_TEXT if return_full_text else ReturnType.NEW_TEXT
        if return_tensors is not None and return_type is None:
            if return_text is not None:
                raise ValueError("`return_text` is mutually exclusive with `return_tensors`")
            return_type = ReturnType.TENSORS
        named = {"return_type": return_type, "clean_up_tokenization_spaces": clean_up_tokenization_spaces}
        named.update(continue_final_message=continue_final_message, skip_special_tokens=skip_special_tokens)
        post.update({k: v for k, v in named.items() if v is not None})
        return pre, generate_kwargs, post

    # ------------------------------------------------------------------ the three steps
    def _run(self, prompts: list[Any], pre: dict, forward: dict, post: dict) -> list[list[dict[str, Any]]]:
        encoded = [self.preprocess(prompt, **pre) for prompt in prompts]
        inputs = encoded[0] if len(encoded) == 1 else self._pad(encoded)
        sequences = self._forward(inputs, **forward)  # [batch, prompt_len + new]
        prompt_len = inputs["input_ids"].shape[-1]
        return [
            self.postprocess(seq[None], prompt_len, prompt, **post)
            for seq, prompt in zip(sequences, prompts, strict=True)
        ]

    def preprocess(
        self,
        prompt: str | Chat,
        add_special_tokens: bool | None = None,
        truncation: bool | None = None,
        padding: bool | str | None = None,
        max_length: int | None = None,
        continue_final_message: bool | None = None,
        tokenizer_encode_kwargs: dict[str, Any] | None = None,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
    ) -> Any:
        """The prompt's ids and mask `[1, prompt_len]`: a string tokenized, a chat rendered with the chat template
        (with a generation prompt, unless the last message is the assistant's, which is then continued)."""
        options = {"add_special_tokens": add_special_tokens, "truncation": truncation, "padding": padding}
        options = {k: v for k, v in {**options, "max_length": max_length}.items() if v is not None}
        options.update(tokenizer_encode_kwargs or {})
        if not isinstance(prompt, Chat):
            return self.tokenizer(prompt, return_tensors="pt", **options)
        options.pop("add_special_tokens", None)
        if continue_final_message is None:
            continue_final_message = prompt.messages[-1]["role"] == "assistant"
        return self.tokenizer.apply_chat_template(
            prompt.messages,
            add_generation_prompt=not continue_final_message,
            continue_final_message=continue_final_message,
            return_dict=True,
            return_tensors="pt",
            tools=tools,
            documents=documents,
            **options,
        )

    def _pad(self, encoded: list[Any]) -> Any:
        """Several prompts as one left-padded batch (upstream's batching collate)."""
        if self.tokenizer.pad_token_id is None:
            raise ValueError(
                "Pipeline with tokenizer without pad_token cannot do batching. You can try to set it with "
                "`pipe.tokenizer.pad_token_id = model.config.eos_token_id`."
            )
        rows = [{k: v[0].tolist() for k, v in e.items() if k in ("input_ids", "attention_mask")} for e in encoded]
        return self.tokenizer.pad(rows, padding=True, return_tensors="pt")

    def _forward(self, inputs: Any, **generate_kwargs: Any) -> torch.Tensor:
        input_ids = inputs["input_ids"].to(self.device)
        if input_ids.shape[1] == 0:
            raise ValueError("The prompt encodes to no tokens: transformers_static's generate needs at least one")
        mask = inputs.get("attention_mask")
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=None if mask is None else mask.to(self.device),
            **self._prepare_generate_kwargs(generate_kwargs),
        )
        return getattr(output, "sequences", output).cpu()

    def _prepare_generate_kwargs(self, generate_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's generate kwargs on top of the construction ones, plus the pipeline's defaults for what neither
        they nor the model's generation config set (sampling defaults only when sampling). A passed generation config
        (this library's, upstream's or a dict) is taken as `generate` takes it, and gets the defaults in a copy."""
        if "generation_config" not in generate_kwargs:
            generate_kwargs = {**self._generate_kwargs, **generate_kwargs}
        user_config = generate_kwargs.get("generation_config")
        if user_config is not None:
            user_config = GenerationConfig.from_any(user_config)
        set_params = {**self._model_generation_params(user_config), **generate_kwargs}
        added = {
            k: v
            for k, v in self._generation_defaults.items()
            if k not in set_params and not (k == "max_new_tokens" and "max_length" in set_params)
        }
        if not {**set_params, **added}.get("do_sample"):
            added = {k: v for k, v in added.items() if k not in SAMPLING_PARAMS}
        if user_config is None:
            return {**generate_kwargs, **added}
        return {**generate_kwargs, "generation_config": user_config.update(**added)}

    def _model_generation_params(self, user_config: GenerationConfig | None) -> dict[str, Any]:
        """The generation parameters the model's generation config (then a passed one) set: those not None."""
        params = {}
        for config in (GenerationConfig.from_any(self.model.generation_config), user_config):
            if config is not None:
                params.update({k: getattr(config, k) for k in config.field_names() if getattr(config, k) is not None})
        return params

    def postprocess(
        self,
        sequence: torch.Tensor,
        prompt_len: int,
        prompt: str | Chat,
        return_type: ReturnType = ReturnType.FULL_TEXT,
        clean_up_tokenization_spaces: bool | None = None,
        continue_final_message: bool | None = None,
        skip_special_tokens: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Records for one prompt's sequences `[n, seq]`: token ids, the new text, or prompt + new text (for a chat:
        the messages with the reply appended, or the last message continued)."""
        records = []
        for ids in sequence.tolist():
            if return_type == ReturnType.TENSORS:
                records.append({"generated_token_ids": ids})
                continue
            text = self.tokenizer.decode(
                ids[prompt_len:],
                skip_special_tokens=True if skip_special_tokens is None else skip_special_tokens,
                clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            )
            if return_type == ReturnType.FULL_TEXT:
                text = _full_text(prompt, text, continue_final_message, self.tokenizer)
            records.append({"generated_text": text})
        return records


def _full_text(prompt: str | Chat, text: str, continue_final_message: bool | None, tokenizer: Any) -> Any:
    if isinstance(prompt, str):
        return prompt + text
    messages = list(prompt.messages)
    if continue_final_message is None:
        continue_final_message = messages[-1]["role"] == "assistant"
    if continue_final_message:
        return messages[:-1] + [{"role": messages[-1]["role"], "content": messages[-1]["content"] + text}]
    if getattr(tokenizer, "response_template", None) is not None:
        raise NotImplementedError("Parsing replies with the tokenizer's response_template is not supported")
    return messages + [{"role": "assistant", "content": text}]


def _as_chats(inputs: Any) -> Any:
    """A list of messages -> Chat; a list of conversations -> list of Chat; anything else unchanged."""
    if isinstance(inputs, (list, tuple)) and inputs:
        if is_valid_message(inputs[0]):
            return Chat(inputs)
        if isinstance(inputs[0], (list, tuple)) and all(chat and is_valid_message(chat[0]) for chat in inputs):
            return [Chat(chat) for chat in inputs]
    return inputs


def _pipeline_device(device: Any, model: Any) -> torch.device:
    """Upstream's choice: None -> GPU 0 when there is one, else CPU; -1 -> the model's device; ints are GPU ordinals."""
    if device is None:
        device = 0
    if device == -1:
        return model.device
    if isinstance(device, (str, torch.device)):
        return torch.device(device)
    if device < 0 or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device(f"cuda:{device}")

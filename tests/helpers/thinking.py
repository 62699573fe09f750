"""Tiny random-weight thinking models for tests (issue 56): the default model's tokenizer with ``<think>`` and
``</think>`` added as tokens of their own (as Qwen3's vocabulary has them) and a thinking chat template, in one of
the two shapes the families use: the model opens the section itself (Qwen3, with ``enable_thinking``), or the
template opens it (DeepSeek-R1's generation prompt ends with ``<think>``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TURNS = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
         "'<|im_end|>' + '\n'}}{% endfor %}")
# Qwen3's shape: with thinking off the template writes an empty thought, else the model opens its own.
MODEL_OPENS = TURNS + ("{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                       "{% if enable_thinking is defined and enable_thinking is false %}"
                       "{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}")
# DeepSeek-R1's shape: the generation prompt opens the thought.
TEMPLATE_OPENS = TURNS + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{% endif %}"
TEMPLATES = {"model_opens": MODEL_OPENS, "template_opens": TEMPLATE_OPENS}


def thinking_tokenizer(model_dir: Path, shape: str) -> Any:
    """The default model's tokenizer with the two markers and the ``shape``'s template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), clean_up_tokenization_spaces=False,
                                              local_files_only=True)
    # Six reserved tokens beside the markers keep the vocabulary a multiple of 8, as the q4 weights need.
    tokenizer.add_tokens(["<think>", "</think>", *(f"<|reserved_{i}|>" for i in range(6))], special_tokens=False)
    tokenizer.chat_template = TEMPLATES[shape]
    return tokenizer


def thinking_model(tokenizer: Any, context: int, seed: int = 0) -> Any:
    """A 2-layer Llama over ``tokenizer``'s vocabulary, random weights (spread as tests/conftest.py's)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=len(tokenizer), max_position_embeddings=context, tie_word_embeddings=True, initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    model.requires_grad_(False)
    return model


def thinking_loaded(model_dir: Path, shape: str, context: int) -> Any:
    """A ``LoadedModel`` of a tiny thinking model (in memory; ``path`` the default model's, for its files)."""
    import torch

    from proctor.models import LoadedModel

    tokenizer = thinking_tokenizer(model_dir, shape)
    return LoadedModel(
        model=thinking_model(tokenizer, context), tokenizer=tokenizer, model_id=f"tiny-thinking-{shape}",
        path=model_dir, weights_sha256="tiny", tokenizer_sha256="tiny", dtype=torch.float32,
        device=torch.device("cpu"), eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, context_length=context, vocab_size=len(tokenizer),
        special_token_ids=frozenset(int(i) for i in tokenizer.all_special_ids))


def save_thinking_model(model_dir: Path, shape: str, out: Path, context: int = 1024) -> Path:
    """A tiny thinking model written as a Hugging Face directory (a server loads it with ``--model``)."""
    tokenizer = thinking_tokenizer(model_dir, shape)
    model = thinking_model(tokenizer, context)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out

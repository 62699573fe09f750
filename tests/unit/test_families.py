"""Every family of executor/families.py on the slot forward (issue 25), against transformers' own classes.

Each family is a tiny random-weight model built with its transformers class, its norm weights and biases
randomised so that a norm or bias the slot forward skipped (or computed in another arithmetic) shows. Its
sliding window (where it has one) is shorter than the prompts, so windows are exercised. Checked: the
prompt's logits at every position against the model's forward (float32, within 1e-4), 64 greedy tokens
identical to the model's own greedy loop, and each row's logits the same bits alone and in a batch of 16
rows of mixed lengths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from helpers.slots import feed_prompt, feed_prompts, feed_step

from proctor.executor.families import Unsupported, describe
from proctor.executor.plan import executor_plan
from proctor.executor.protocol import Feed
from proctor.executor.slot_forward import SlotForward

WINDOW = 16
BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "vocab_size": 1024, "rms_norm_eps": 1e-5}
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
    "llama-llama3-rope": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "llama-linear-rope": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "llama-yarn-rope": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128}}),
    "llama-dynamic-rope": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}),
    "llama-biases": ("LlamaConfig", "LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen2-sliding": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": WINDOW,
                                                          "max_window_layers": 2}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {
        "head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": WINDOW, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh"}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": WINDOW, "rope_local_base_freq": 1000.0,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": WINDOW, "pad_token_id": 0,
                                              "partial_rotary_factor": 0.5}),
    "phi3-longrope": ("Phi3Config", "Phi3ForCausalLM", {
        "pad_token_id": 0, "original_max_position_embeddings": 256, "rope_parameters": {
            "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
            "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
            "long_factor": [2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5], "original_max_position_embeddings": 256}}),
}


def build(name: str, **overrides: Any) -> Any:
    config_class, model_class, extra = FAMILIES[name]
    config = getattr(transformers, config_class)(**{**BASE, **extra, **overrides})
    torch.manual_seed(sum(map(ord, name)))
    model = getattr(transformers, model_class)(config).eval()
    offset = describe(model.config).norm_offset
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if "norm" in parameter_name:  # around the family's identity: a skipped or misapplied norm shows
                parameter.copy_(torch.randn_like(parameter) * 0.3 + (0.0 if offset else 1.0))
            elif parameter_name.endswith("bias"):
                parameter.copy_(torch.randn_like(parameter) * 0.2)
            elif "embed" in parameter_name or "lm_head" in parameter_name:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
    return model


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_model(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, build(request.param)


def prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, BASE["vocab_size"], (length,), generator=generator).tolist()


def test_the_prompt_logits_equal_the_models_forward(family_model: tuple[str, Any]) -> None:
    name, model = family_model
    ids = prompt(3 * WINDOW, 1)  # longer than every window
    with torch.inference_mode():
        slots = SlotForward(model, 1, torch.device("cpu"))
        ours = feed_prompt(slots, 0, ids, every_position=True)
        theirs = model(input_ids=torch.tensor([ids])).logits[0].float()
    assert (ours - theirs).abs().max().item() < 1e-4, name


def test_64_greedy_tokens_equal_the_models_own_greedy_loop(family_model: tuple[str, Any]) -> None:
    name, model = family_model
    ids = prompt(WINDOW - 3, 2)  # the output crosses the window
    ours: list[int] = []
    theirs: list[int] = []
    with torch.inference_mode():
        slots = SlotForward(model, 1, torch.device("cpu"))
        logits = feed_prompt(slots, 0, ids)
        for _ in range(64):
            ours.append(int(logits[0].argmax()))
            logits = feed_step(slots, [ours[-1]])
        sequence = list(ids)
        for _ in range(64):
            theirs.append(int(model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax()))
            sequence.append(theirs[-1])
    assert ours == theirs, name


LENGTHS = (1, 3, 7, 12, 15, 16, 17, 20, 24, 31, 33, 40, 47, 52, 60, 64)  # around and past the window


def decode_rows(model: Any, rows: list[list[int]], steps: int, weights: str) -> list[torch.Tensor]:
    """Each row's logits at every decode step [steps, V], the rows decoded together."""
    slots = SlotForward(model, len(rows), torch.device("cpu"), weights)
    nexts = [int(row.argmax()) for row in feed_prompts(slots, rows)]
    outputs: list[list[torch.Tensor]] = [[] for _ in rows]
    for _ in range(steps):
        logits = feed_step(slots, nexts)
        for i in range(len(rows)):
            outputs[i].append(logits[i])
        nexts = [int(row.argmax()) for row in logits]
    return [torch.stack(rows_logits) for rows_logits in outputs]


@pytest.mark.parametrize("weights", ["dense", "q4"])
def test_a_row_is_the_same_bits_alone_and_in_a_batch_of_16(family_model: tuple[str, Any], weights: str) -> None:
    name, model = family_model
    rows = [prompt(length, 10 + index) for index, length in enumerate(LENGTHS)]
    with torch.inference_mode():
        together = decode_rows(model, rows, 6, weights)
        for index in (0, 5, 9, 15):  # alone: a short row, one at the window, two past it
            alone = decode_rows(model, [rows[index]], 6, weights)[0]
            assert torch.equal(alone, together[index]), (name, weights, LENGTHS[index])


def test_a_family_that_is_not_served_is_refused_naming_it() -> None:
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=64)
    with pytest.raises(Unsupported, match="'gpt2'"):
        describe(config)
    with pytest.raises(Unsupported, match="activation 'relu'"):
        describe(transformers.LlamaConfig(**BASE, hidden_act="relu"))


def test_q8_on_a_family_its_kernels_do_not_compute_is_refused_at_construction() -> None:
    model: Callable[[], Any] = lambda: build("gemma2")  # noqa: E731
    with pytest.raises(ValueError, match="q8 is built for Llama's arithmetic only; gemma2"):
        SlotForward(model(), 1, torch.device("cpu"), "q8", calibration_ids=[1, 2, 3])


def test_a_length_dependent_rope_gives_each_position_its_regime_whatever_else_runs() -> None:
    """longrope past ``original_max_position_embeddings``: positions below it keep the short factors, the
    rest take the long ones, per position (transformers switches the whole sequence, so only a prompt within
    the original length is compared with it); a row's logits are the same bits alone and beside longer rows."""
    config_class, model_class, extra = FAMILIES["phi3-longrope"]
    rope = {**extra["rope_parameters"], "original_max_position_embeddings": 32}
    config = getattr(transformers, config_class)(**{**BASE, **extra, "original_max_position_embeddings": 32,
                                                    "rope_parameters": rope})
    torch.manual_seed(7)
    model = getattr(transformers, model_class)(config).eval()
    short = prompt(20, 3)
    with torch.inference_mode():
        slots = SlotForward(model, 1, torch.device("cpu"))
        ours = feed_prompt(slots, 0, short, every_position=True)
        theirs = model(input_ids=torch.tensor([short])).logits[0].float()
        assert (ours - theirs).abs().max().item() < 1e-4
        rows = [short, prompt(30, 4), prompt(70, 5)]  # the last one past the original length
        together = decode_rows(model, rows, 6, "dense")
        for index, row in enumerate(rows):
            assert torch.equal(decode_rows(model, [row], 6, "dense")[0], together[index]), index


def test_the_runner_description_names_the_path_and_why() -> None:
    cpu = torch.device("cpu")

    def description(model: Any, weights: str) -> str:
        return executor_plan(model, cpu, weights).description

    assert description(build("llama"), "q4") == "slot forward: llama, batched, q4 weights in the C++ decode kernels"
    assert description(build("gemma2"), "q8").endswith("the q8 C++ kernel does not compute this family's layer")
    assert description(build("phi3"), "q4").endswith("q4 weights in the C++ decode kernels")
    assert description(build("gemma2"), "q4").endswith("q4 weights in the C++ decode kernels")
    assert description(build("qwen2-sliding"), "q4").endswith("q4 weights in the C++ decode kernels")
    assert description(build("qwen3"), "dense") == (
        "slot forward: qwen3, batched, dense weights through PyTorch operations")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=64))
    assert description(gpt2, "q4").startswith("per-slot: transformers' forward, one row at a time")


@pytest.mark.parametrize("name", ["gemma2", "qwen2-sliding", "phi3"])
def test_the_engine_batches_other_families_with_the_same_tokens_as_alone(
        name: str, tokenizer: Any, tiny_loaded: Any, make_engine: Any) -> None:
    """The whole engine on a family's tiny model with the real tokenizer: requests that join a running batch
    (one prompt long enough for chunked prefill) get the tokens they get alone, greedy and sampled."""
    import dataclasses

    from helpers.engine import Collector

    from proctor.domain import GenerationRequest, SamplingParams, StoppingParams

    config_class, model_class, extra = FAMILIES[name]
    config = getattr(transformers, config_class)(**{**BASE, **extra, "vocab_size": len(tokenizer),
                                                    "max_position_embeddings": 1024})
    torch.manual_seed(3)
    model = getattr(transformers, model_class)(config).float().eval().requires_grad_(False)
    loaded = dataclasses.replace(tiny_loaded, model=model, model_id=name, context_length=1024)
    prompts = ["The capital of France is", "Hi", "Once upon a time " * 20, "1, 2, 3, 4,"]

    def request(index: int, request_id: str) -> GenerationRequest:
        sampling = SamplingParams(temperature=0.9, seed=index) if index % 2 else SamplingParams()
        return GenerationRequest(request_id=request_id, prompt=prompts[index], sampling=sampling,
                                 stopping=StoppingParams(max_new_tokens=12 + 4 * index, ignore_eos=True))

    def run(engine: Any, prefix: str, indices: range) -> list[list[int]]:
        sinks = []
        for index in indices:
            sink = Collector()
            engine.submit(engine.prepare(request(index, f"{prefix}-{index}")), sink)
            sinks.append(sink)
        return [sink.wait(60) and sink.token_ids for sink in sinks]

    solo = make_engine(loaded=loaded, max_batch_size=1, prefill_chunk_tokens=16, weights="dense")
    alone = [run(solo, "solo", range(index, index + 1))[0] for index in range(len(prompts))]
    batched = make_engine(loaded=loaded, max_batch_size=4, prefill_chunk_tokens=16, weights="dense")
    together = run(batched, "joined", range(len(prompts)))
    assert together == alone, name
    assert batched.steps < sum(len(tokens) for tokens in together)  # they shared steps


KERNEL_FAMILIES = tuple(sorted(FAMILIES))


@pytest.mark.parametrize("name", KERNEL_FAMILIES)
def test_the_q4_kernel_computes_what_the_operations_compute_for_the_family(name: str) -> None:
    """The q4 C++ decode step with the family's extras (biases of every product, q/k norms, partial rotation,
    windows, soft-capping, sandwich norms, GeGLU, per-type rotary tables) against the same step as PyTorch
    operations on the same q4 weights, over rows shorter and longer than the window."""
    from helpers.requirements import missing

    from proctor.executor import fused_decode

    problem = fused_decode.load_problem()
    if problem is not None:
        missing(f"the decode kernels: {problem}")
    model = build(name)
    with torch.inference_mode():
        slots = SlotForward(model, 3, torch.device("cpu"), "q4")
        assert slots.products == "kernels", name
        feed_prompts(slots, [prompt(length, 30 + slot) for slot, length in enumerate((5, 20, 40))])
        lengths, keys = list(slots.lengths), [k.clone() for k in slots._keys]
        values = [v.clone() for v in slots._values]
        steps = [[Feed(slot, [token], 1) for slot, token in enumerate(tokens)] for tokens in ([7, 8, 9], [10, 11, 12])]
        fused = [slots.forward(feeds) for feeds in steps]
        slots.lengths, slots._keys, slots._values = lengths, keys, values
        ops = [slots.forward_ops(feeds) for feeds in steps]
    for ours, reference in zip(fused, ops, strict=True):
        assert torch.allclose(ours, reference, rtol=1e-3, atol=2e-3), (name, (ours - reference).abs().max())


def test_a_start_with_a_mode_the_model_cannot_run_fails_naming_what_is_missing(
        tmp_path: Any, tokenizer: Any) -> None:
    """The server's own start (app._build_engine) on model directories: an architecture the slot forward does
    not serve with --weights q4, and a Gemma 2 with --weights q8, each stop it with a message naming why."""
    from proctor.app import _build_engine
    from proctor.config import Settings

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4,
                                                                 vocab_size=len(tokenizer)))
    gemma = build("gemma2")
    gemma.resize_token_embeddings(len(tokenizer))
    for name, model, weights, expected in (("gpt2", gpt2, "q4", "--weights q4 needs the batched slot forward"),
                                           ("gemma2", gemma, "q8", "q8 is built for Llama's arithmetic only")):
        directory = tmp_path / name
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        settings = Settings.load({"model": str(directory), "weights": weights, "warmup": False, "device": "cpu",
                                  "dtype": "float32"}, environ={})
        with pytest.raises(ValueError, match=expected) as refused:
            _build_engine(settings, None)
        assert name in str(refused.value)

"""A .gguf file of each family served from its own blocks (``--weights gguf``), against transformers.

Each family's tiny random-weight model (test_families.build: norms and biases randomised) is written as
llama.cpp's convert_hf_to_gguf writes it (helpers/gguf_writer.py: its tensor names, Llama's permuted q/k
rows, Gemma's ``1 + w`` norms, rope scaling as keys or tensors), with float32 matrices so the file holds
exactly the model's weights. Loaded from the file's metadata alone (models/gguf_model.py), the slot
forward must give transformers' logits at every prompt position (1e-4; the float16 KV cache of the decode
kernel: 5e-3), and a row the same bits alone and in a batch of rows of mixed lengths.

What a GGUF cannot carry (models/gguf_config.py) is left out of the cases: dynamic rope, Mistral's and
Qwen2's windows, a Gemma ``query_pre_attn_scalar`` other than its head size, Gemma 3's local rope base
other than llama.cpp's 10000.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers.gguf_writer import tiny_loaded_from_gguf, write_gguf, write_raw_tensor_gguf
from helpers.requirements import missing
from helpers.slots import feed_prompt, feed_prompts, feed_step
from test_families import build

from proctor.executor import fused_decode
from proctor.executor.families import describe
from proctor.executor.plan import executor_plan
from proctor.executor.protocol import Feed
from proctor.executor.slot_forward import SlotForward
from proctor.models.errors import ModelError
from proctor.models.gguf_file import GgufFile
from proctor.models.placement import resolve_weights

CASES: dict[str, dict[str, Any]] = {
    "llama": {}, "llama-biases": {}, "llama-llama3-rope": {}, "llama-linear-rope": {}, "llama-yarn-rope": {},
    "qwen2": {}, "qwen3": {}, "gemma2": {"query_pre_attn_scalar": 16},
    "gemma3": {"num_hidden_layers": 6, "layer_types": None, "rope_local_base_freq": 10000.0},
    "phi3": {}, "phi3-longrope": {},
}
PROMPT = 200  # past every window (16), below the longrope switch (256)
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def kernel_ready() -> None:
    problem = fused_decode.load_problem()
    if problem is not None:
        missing(f"the decode kernels: {problem}")


@pytest.fixture(scope="module", params=sorted(CASES))
def served(request: pytest.FixtureRequest, default_gguf: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, Any, Any]:
    name = request.param
    model = build(name, **CASES[name])
    path = write_gguf(model, default_gguf, tmp_path_factory.mktemp("gguf") / f"{name}.gguf")
    return name, model, tiny_loaded_from_gguf(path)


def prompt(seed: int, length: int = PROMPT) -> list[int]:
    return torch.randint(0, 1000, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_the_file_describes_the_same_family(served: tuple[str, Any, Any]) -> None:
    name, model, skeleton = served
    original, loaded = describe(model.config), describe(skeleton.config)
    differing = {field for field in original.__dataclass_fields__ if getattr(original, field) != getattr(loaded, field)}
    # GGUF stores eps as float32; Llama 3's rope comes back as its frequency divisors (the same tables)
    assert differing <= {"eps", "rope_type", "rope_original_length"}, (name, differing)


def test_logits_are_transformers_logits(served: tuple[str, Any, Any]) -> None:
    name, model, skeleton = served
    ids = prompt(1)
    with torch.inference_mode():
        reference = model(torch.tensor([ids])).logits[0].float()
        # the file's blocks through PyTorch's operations, keys and values in float32: every prompt position
        logits = feed_prompt(SlotForward(skeleton, 1, CPU, "gguf", products="library"), 0, ids, every_position=True)
        following = int(reference[-1].argmax())
        reference_next = model(torch.tensor([[*ids, following]])).logits[0, -1].float()
        kernels = SlotForward(skeleton, 1, CPU, "gguf")  # the C++ layer step, its float16 cache
        feed_prompt(kernels, 0, ids)
        decoded = feed_step(kernels, [following])[0]
    assert (logits - reference).abs().max() < 1e-4, name
    assert (decoded - reference_next).abs().max() < 5e-3, name


def test_a_row_is_the_same_bits_alone_and_in_a_batch(served: tuple[str, Any, Any]) -> None:
    name, _, skeleton = served
    prompts = [prompt(2, 30), prompt(3, 90), prompt(4, 7)]
    with torch.inference_mode():
        alone = []
        for ids in prompts:
            solo = SlotForward(skeleton, 1, CPU, "gguf")
            first = feed_prompt(solo, 0, ids)
            alone.append(torch.cat([first, feed_step(solo, [5]), feed_step(solo, [9])]))
        batch = SlotForward(skeleton, len(prompts), CPU, "gguf")
        firsts = feed_prompts(batch, prompts)
        second, third = feed_step(batch, [5] * len(prompts)), feed_step(batch, [9] * len(prompts))
    for index in range(len(prompts)):
        together = torch.stack([firsts[index], second[index], third[index]])
        assert torch.equal(alone[index], together), (name, index)


def test_an_extend_gives_each_position_the_bits_of_a_decode_step(served: tuple[str, Any, Any]) -> None:
    """Jump-forward and speculation (engine/drafting.py) feed several tokens of a row in one forward: every
    family's windows, soft-capping and norms must give each position what one step per token gives."""
    name, _, skeleton = served
    prompts, feeds = [prompt(2, 30), prompt(3, 90)], [[5, 9, 11, 13], [6]]
    with torch.inference_mode():
        alone = []
        for ids, feed in zip(prompts, feeds, strict=True):
            solo = SlotForward(skeleton, 1, CPU, "gguf")
            feed_prompt(solo, 0, ids)
            alone.append(torch.cat([feed_step(solo, [token]) for token in feed]))
        batch = SlotForward(skeleton, len(prompts), CPU, "gguf")
        feed_prompts(batch, prompts)
        extended = batch.forward([Feed(slot, feed, len(feed)) for slot, feed in enumerate(feeds)])
    assert torch.equal(extended[:4], alone[0]), name
    assert torch.equal(extended[4:], alone[1]), name


def test_quantized_blocks_stay_close_to_the_model(default_gguf: Path, tmp_path: Path) -> None:
    model = build("qwen3")
    with torch.inference_mode():
        reference = model(torch.tensor([prompt(5, 40)])).logits[0, -1].float()
        for matrix_type, tolerance in (("F16", 0.01), ("Q8_0", 0.1), ("Q5_1", 0.5)):
            skeleton = tiny_loaded_from_gguf(write_gguf(model, default_gguf, tmp_path / f"{matrix_type}.gguf",
                                                        matrix_type))
            got = feed_prompt(SlotForward(skeleton, 1, CPU, "gguf"), 0, prompt(5, 40))[0]
            assert (got - reference).abs().max() < tolerance * reference.abs().max(), matrix_type


def test_a_block_type_without_a_kernel_is_refused_by_name(default_gguf: Path, tmp_path: Path) -> None:
    path = write_raw_tensor_gguf(default_gguf, tmp_path / "q2k.gguf", 10, (256, 256))  # Q2_K
    with pytest.raises(ModelError, match=r"Q2_K \(e\.g\. blk\.0\.attn_q\.weight\).*no kernel here"):
        GgufFile(path)


def test_an_architecture_the_slot_forward_lacks_is_a_start_up_error_on_gguf() -> None:
    import transformers

    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2))
    problem = executor_plan(model, CPU, "gguf", asked_weights="gguf").problem
    assert problem is not None and "'gpt2'" in problem and "slot forward only" in problem


def test_gguf_weights_need_a_gguf_file() -> None:
    with pytest.raises(ModelError, match=r"pass --model FILE\.gguf"):
        resolve_weights("gguf", torch.device("cpu"), torch.float32, gguf_file=False)
    assert resolve_weights("auto", torch.device("cpu"), torch.float32, gguf_file=True) == "gguf"


def test_the_blocks_served_are_the_files_bytes(default_gguf: Path, tmp_path: Path) -> None:
    """Byte for byte: a matrix is the file's rows as stored, and Llama's q/k rows, unpermuted for the slot
    forward, permute back to exactly the file's bytes."""
    import numpy as np
    from gguf import GGUFReader
    from helpers.gguf_writer import permute

    model = build("llama")
    path = write_gguf(model, default_gguf, tmp_path / "q8.gguf", "Q8_0")
    file, stored = GgufFile(path), {t.name: np.asarray(t.data) for t in GGUFReader(path).tensors}
    down = file.matrix("blk.0.ffn_down.weight")
    assert down.blocks.numpy().tobytes() == stored["blk.0.ffn_down.weight"].tobytes()
    heads = model.config.num_attention_heads
    q = file.matrix("blk.0.attn_q.weight", heads).blocks.numpy()
    assert permute(q, heads).tobytes() == stored["blk.0.attn_q.weight"].tobytes()
    assert q.tobytes() != stored["blk.0.attn_q.weight"].tobytes()


def test_the_header_reads_what_gguf_py_reads_without_parsing_the_vocabulary(default_gguf: Path) -> None:
    """models/gguf_header.py walks the header itself (no numpy view per token: ~110 MB and 1.5-3 s at 152k
    tokens); every tensor and field must be what gguf-py's reader, llama.cpp's own, gives."""
    from gguf import GGUFReader

    from proctor.models.gguf_header import ArrayField, read_header

    reader = GGUFReader(default_gguf, "r")
    file = GgufFile(default_gguf)
    header = read_header(default_gguf)
    assert file.metadata_bytes == reader.data_offset == header.data_offset
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for tensor in reader.tensors:
        ours = file._tensor(tensor.name)
        assert (ours.tensor_type, list(ours.shape)) == (int(tensor.tensor_type), [int(d) for d in tensor.shape])
        assert ours.data.shape == tensor.data.shape and ours.data.dtype == tensor.data.dtype, tensor.name
        assert ours.data.tobytes() == np.asarray(tensor.data).tobytes(), tensor.name
    assert set(header.fields) == set(reader.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    assert isinstance(header.fields["tokenizer.ggml.tokens"], ArrayField)  # left in the file until asked for
    tokens = file.field("tokenizer.ggml.tokens")
    field = reader.fields["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list) and len(tokens) == 49152
    assert tokens == [bytes(field.parts[i]).decode() for i in field.data]
    assert file.field("general.architecture") == "llama" and file.field("llama.block_count") == 30
    assert file.field("llama.rope.freq_base") == float(reader.fields["llama.rope.freq_base"].parts[-1][0])
    assert file.field("no.such.key") is None

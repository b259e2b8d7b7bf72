"""Loading models: a `.gguf` file through `--agent.model`, the ids that end a sample, and errors that say
why a model cannot be loaded and what to do."""

import importlib.util

import numpy as np
import pytest
import torch

from textzoo.config import AgentConfig
from textzoo.decoding.generation import GenerationConfig
from textzoo.errors import ModelError
from textzoo.models.build import build_policy, prompt_format
from textzoo.models.loading import END_TOKENS, end_token_ids, load_pretrained
from textzoo.models.policy import Policy
from textzoo.models.tokenizer import byte_tokenizer

torch.set_num_threads(1)


def test_a_gguf_file_is_an_agent_model_with_its_chat_template_and_end_tokens(smollm2, smollm2_file, monkeypatch):
    """`--agent.model path/to/model.gguf`: dequantized float weights (those of the cached folder), the file
    parsed once and gguf's tensor-name map built once (transformers asks three times and once per submodule)."""
    import gguf as gguf_py

    readers, maps = [], []
    real_reader, real_map = gguf_py.GGUFReader, gguf_py.get_tensor_name_map

    def counted_reader(*args, **kwargs):
        readers.append(real_reader(*args, **kwargs))
        return readers[-1]

    def counted_map(*args):
        maps.append(args)
        return real_map(*args)

    monkeypatch.setattr(gguf_py, "GGUFReader", counted_reader)
    monkeypatch.setattr(gguf_py, "get_tensor_name_map", counted_map)
    gguf = smollm2_file
    agent = AgentConfig(model=str(gguf))
    policy = build_policy(agent, seed=0, device=torch.device("cpu"))  # what build_actors does per agent
    assert len(readers) == 1 and len(maps) == 1, (readers, maps)
    assert (gguf_py.GGUFReader, gguf_py.get_tensor_name_map) == (counted_reader, counted_map)  # put back
    embedding = next(t for t in readers[0].tensors if t.name == "token_embd.weight")  # straight from the file
    want = torch.from_numpy(gguf_py.dequantize(embedding.data, embedding.tensor_type).copy())
    assert torch.equal(policy.model.get_input_embeddings().weight.detach(), want)
    assert prompt_format(agent, policy).chat and policy.tokenizer.chat_template
    assert all(type(m) is torch.nn.Linear for m in policy.model.model.layers[0].mlp.children() if hasattr(m, "weight"))
    assert getattr(policy.model, "hf_quantizer", None) is None and not policy.model.is_quantized
    folder = Policy.from_pretrained(smollm2)
    want = folder.model.state_dict()
    assert all(torch.equal(p, want[n]) for n, p in policy.model.state_dict().items())
    # <|im_end|> (EOS, also the pad token) and <|endoftext|> both end a sample
    assert policy.eos_ids == folder.eos_ids == (2, 0) and policy.pad_id == policy.eos_id == 2


def test_every_end_token_ends_a_sample():
    tokenizer = byte_tokenizer()
    policy = Policy.tiny("llama", seed=0, tokenizer=tokenizer, generation=GenerationConfig(max_new_tokens=5))
    policy.model.generation_config.eos_token_id = [tokenizer.eos_token_id, 100]
    policy = Policy(policy.model, tokenizer, GenerationConfig(max_new_tokens=5, allowed_tokens=(100,)))
    assert policy.eos_ids == (2, 100)
    gen = policy.generate(["a", "bb", "ccc"])  # every allowed token (100 or EOS) ends the row at once
    assert gen.completion_mask.tolist() == [[1], [1], [1]] and gen.texts == ["", "", ""]


def test_end_tokens_come_from_the_tokenizers_special_tokens():
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_end|>", "<|im_start|>"]})
    model = Policy.tiny(seed=0).model
    ids = end_token_ids(model, tokenizer)
    assert ids == (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert "<|im_start|>" not in END_TOKENS


def test_models_that_cannot_be_loaded_say_why_and_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(ModelError, match="does not exist"):
        load_pretrained(tmp_path / "missing.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        load_pretrained(tmp_path / "empty")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        load_pretrained(garbage)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else object())
    with pytest.raises(ModelError, match=r"pip install 'textzoo\[gguf\]'"):
        load_pretrained(garbage)


def test_a_gguf_of_an_architecture_transformers_cannot_read_names_it(tmp_path):
    import gguf

    path = tmp_path / "rwkv.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv6")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match="'rwkv6' model.*Hugging Face folder"):
        load_pretrained(path)


def test_a_truncated_gguf_file_is_a_model_error(tmp_path, smollm2_file):
    import gguf

    source = smollm2_file
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(source.read_bytes()[: 1 << 20])  # the header and the first tensors only
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(ModelError, match="cut.gguf"):
        load_pretrained(cut)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)  # the one-parse patch is undone

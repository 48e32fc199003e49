"""LoRA against peft, both ways, on random GPT-2, Llama and BERT configs: an adapter trained
(here: given random weights) on one side loads on the other with the same logits, and the
trainable-parameter counts agree."""

import json

import pytest
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model

from attnlab import from_pretrained
from attnlab.errors import BadInput
from attnlab.interop.peft import adapt, adapter_spec, load_adapter, save_adapter
from attnlab.nn.adapters import trainable_state

CONFIGS = {
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config(
        vocab_size=120, n_embd=32, n_head=4, n_layer=2, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=119, eos_token_id=119)),
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig(
        vocab_size=120, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, num_hidden_layers=2, max_position_embeddings=64,
        tie_word_embeddings=False)),
    "bert": (transformers.BertForTokenClassification, transformers.BertConfig(
        vocab_size=120, hidden_size=32, num_attention_heads=4, intermediate_size=48,
        num_hidden_layers=2, max_position_embeddings=64, num_labels=5, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)),
}
# each family's own names for the layers, and one target set in attnlab's names
PEFT_TARGETS = {"gpt2": ["c_attn", "c_fc"], "llama": ["q_proj", "v_proj", "down_proj"],
                "bert": ["query", "value", "intermediate.dense"]}
OURS_TARGETS = {"gpt2": ["qkv", "w1"], "llama": ["q", "v", "w2"], "bert": ["q", "v", "w1"]}
IDS = torch.randint(0, 120, (2, 11), generator=torch.Generator().manual_seed(3))


def _logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return getattr(out, "logits", out)


@pytest.fixture(scope="module", params=list(CONFIGS))
def base(request, tmp_path_factory):
    cls, config = CONFIGS[request.param]
    torch.manual_seed(0)
    theirs = cls(config).eval()
    folder = tmp_path_factory.mktemp(request.param)
    theirs.save_pretrained(folder)
    return request.param, folder


def _randomise(parameters):
    """LoRA's B starts at zero; random values make the update count in the comparison."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in parameters:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def _peft_model(kind, folder):
    cls, _ = CONFIGS[kind]
    return cls.from_pretrained(folder).eval()


def test_peft_adapter_loads_in_attnlab_with_the_same_logits(base, tmp_path):
    kind, folder = base
    theirs = get_peft_model(_peft_model(kind, folder), LoraConfig(
        r=4, lora_alpha=12, target_modules=PEFT_TARGETS[kind], fan_in_fan_out=kind == "gpt2",
        modules_to_save=["classifier"] if kind == "bert" else None))
    _randomise(p for n, p in theirs.named_parameters() if "lora_" in n or "modules_to_save" in n)
    theirs.save_pretrained(tmp_path)
    plain = _logits(from_pretrained(folder), IDS)
    ours = load_adapter(from_pretrained(folder), tmp_path)
    assert (_logits(ours, IDS) - _logits(theirs.eval(), IDS)).abs().max() <= 1e-4
    assert (_logits(ours, IDS) - plain).abs().max() > 1e-2  # the adapter did change them
    n_ours = sum(p.numel() for p in trainable_state(ours).values())
    assert n_ours == theirs.get_nb_trainable_parameters()[0]


def test_attnlab_adapter_loads_in_peft_with_the_same_logits(base, tmp_path):
    kind, folder = base
    ours = from_pretrained(folder)
    adapt(ours, adapter_spec(ours, r=4, alpha=6, targets=OURS_TARGETS[kind]))
    _randomise(trainable_state(ours).values())
    save_adapter(ours, tmp_path, base=str(folder))
    theirs = PeftModel.from_pretrained(_peft_model(kind, folder), tmp_path).eval()
    assert (_logits(ours, IDS) - _logits(theirs, IDS)).abs().max() <= 1e-4
    assert json.loads((tmp_path / "adapter_config.json").read_text())["peft_type"] == "LORA"
    # the same layers as peft's own names choose, so the same number of trained parameters
    made = get_peft_model(_peft_model(kind, folder), LoraConfig(
        r=4, target_modules=PEFT_TARGETS[kind],
        modules_to_save=["classifier"] if kind == "bert" else None))
    assert sum(p.numel() for p in trainable_state(ours).values()) \
        == made.get_nb_trainable_parameters()[0]


def test_an_adapter_for_another_base_model_is_one_clear_error(base, tmp_path):
    kind, folder = base
    ours = from_pretrained(folder)
    adapt(ours, adapter_spec(ours, r=4, targets=OURS_TARGETS[kind]))
    save_adapter(ours, tmp_path)
    other_kind = {"gpt2": "llama", "llama": "bert", "bert": "gpt2"}[kind]
    cls, config = CONFIGS[other_kind]
    other_folder = tmp_path / "other"
    cls(config).save_pretrained(other_folder)
    with pytest.raises(BadInput, match="made for a different base model"):
        load_adapter(from_pretrained(other_folder), tmp_path)


def _tamper(folder, config=None, drop=(), add=None):
    """Rewrite an adapter folder: config fields changed, tensors dropped or added."""
    from safetensors.torch import load_file, save_file

    if config:
        cfg = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**cfg, **config}))
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    tensors = {k: v for k, v in tensors.items() if not k.endswith(drop or ("\0",))}
    tensors.update(add or {})
    save_file(tensors, str(folder / "adapter_model.safetensors"))


@pytest.mark.parametrize("change, says", [
    ({"drop": ("lora_B.weight",)}, "lacks lora_B.weight"),
    ({"add": {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.bias": torch.zeros(4)}},
     "has unexpected lora_A.bias"),
    ({"config": {"r": 65536}}, "made for a different base model"),
])
def test_a_damaged_adapter_is_named_before_anything_is_made(tmp_path, change, says):
    """A tensor missing (B would stay zero: an adapter that silently does nothing), one more
    than LoRA has, or a rank the tensors do not have (checked before any layer of that rank
    is allocated): each one line, and the model is left as it was."""
    cls, config = CONFIGS["llama"]
    torch.manual_seed(0)
    cls(config).save_pretrained(tmp_path / "base")
    ours = from_pretrained(tmp_path / "base")
    adapt(ours, adapter_spec(ours, r=4, targets=["q", "v"]))
    save_adapter(ours, tmp_path / "adapter")
    _tamper(tmp_path / "adapter", **change)
    model = from_pretrained(tmp_path / "base")
    with pytest.raises(BadInput, match=says):
        load_adapter(model, tmp_path / "adapter")
    assert not model.config.adapter and not any("lora" in n for n, _ in model.named_modules())


def test_a_bottleneck_adapter_folder_reads_back_with_the_same_outputs(tmp_path):
    """attnlab's own adapter type (peft has no Houlsby adapters) through the same folder
    format: written, read onto a fresh base, the same logits."""
    cls, config = CONFIGS["bert"]
    torch.manual_seed(0)
    cls(config).save_pretrained(tmp_path / "base")
    ours = from_pretrained(tmp_path / "base").eval()
    adapt(ours, adapter_spec(ours, method="bottleneck", size=8))
    _randomise(trainable_state(ours).values())
    save_adapter(ours, tmp_path / "adapter")
    loaded = load_adapter(from_pretrained(tmp_path / "base"), tmp_path / "adapter").eval()
    assert loaded.config.adapter["method"] == "bottleneck"
    assert trainable_state(loaded).keys() == trainable_state(ours).keys()
    torch.testing.assert_close(_logits(loaded, IDS), _logits(ours, IDS), atol=1e-6, rtol=0)
    assert (_logits(loaded, IDS) - _logits(from_pretrained(tmp_path / "base"), IDS)).abs().max() \
        > 1e-3

"""Fine-tuning as the course teaches it, through ``attnlab train classify``: LoRA and bottleneck
adapters over a frozen encoder (written in peft's format), discriminative learning rates,
progressive unfreezing, a warmup ratio, and early stopping that keeps the best model."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from attnlab import BERT, ModelConfig, load, save_pretrained
from attnlab.cli import main
from attnlab.storage import load_state
from attnlab.tokenizers import WordPieceTokenizer
from attnlab.training.checkpoint import load_trainer_state
from attnlab.training.schedule import LinearSchedule
from attnlab.training.train_config import TrainConfig, build_optimizer, layer_depths

WORDS = {"pos": ["great", "lovely", "superb"], "neg": ["awful", "dreadful", "poor"]}
FILLER = ["the", "film", "was", "really", "a", "story", "plot", "and", "music"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Reviews whose label is the one sentiment word among filler, and a bert-tiny with a
    WordPiece vocabulary as a HF folder (random weights) to start from."""
    folder = tmp_path_factory.mktemp("finetune")
    rng = random.Random(0)
    rows = []
    for i in range(200):
        label = rng.choice(["pos", "neg"])
        words = rng.choices(FILLER, k=5) + [rng.choice(WORDS[label])]
        rows.append({"id": f"r{i}", "text": " ".join(words), "label": label})
    (folder / "reviews.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "corpus.txt").write_text("\n".join(r["text"] for r in rows))
    tok = WordPieceTokenizer.train([folder / "corpus.txt"], vocab_size=60)
    torch.manual_seed(0)
    model = BERT(ModelConfig.from_preset("bert-tiny", vocab_size=tok.vocab_size, max_len=32))
    save_pretrained(model, folder / "encoder")
    tok.backend.save(str(folder / "encoder" / "tokenizer.json"))
    return folder


def classify(data, out, *flags):
    code = main(["train", "classify", "--data", str(data / "reviews.jsonl"), "--text-field",
                 "text", "--label-field", "label", "--init", str(data / "encoder"), "--out",
                 str(out), "--batch", "16", "--max-len", "16", "--no-progress", "--device",
                 "cpu", "--precision", "fp32", *map(str, flags)])
    assert code == 0


def test_a_lora_run_trains_only_its_adapters_and_writes_them_as_peft_does(data, tmp_path,
                                                                         capsys):
    run = tmp_path / "run"
    classify(data, run, "--lora", 4, "--lora-alpha", 8, "--steps", 3, "--save-every", 3,
             "--lr", "1e-2", "--eval-every", 0)
    out = capsys.readouterr().out
    assert "adapters: LoRA r=4 alpha=8 on 4 layers and classifier in full" in out
    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0)
    assert config["target_modules"] == ["query", "value"]  # BERT's names for q_proj, v_proj
    assert config["modules_to_save"] == ["classifier"] and config["task_type"] == "SEQ_CLS"
    adapter = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    # the optimizer held state for the LoRA matrices and the head alone
    state = load_trainer_state(run / "checkpoints" / "step-00000003")["optimizer"]["state"]
    assert len(state) == len(adapter) == 2 * 2 * 2 + 2  # 2 layers x (q, v) x (A, B) + head
    # every base weight is where it started; q and v moved by exactly (α/r)·B A
    base, final = load_state(data / "encoder" / "model.safetensors"), load(run).model.state_dict()
    for layer in range(2):
        ours = f"encoder.layers.{layer}.self_attn"
        theirs = f"base_model.model.bert.encoder.layer.{layer}.attention.self"
        for o, t in (("q_proj", "query"), ("v_proj", "value")):
            delta = 2.0 * adapter[f"{theirs}.{t}.lora_B.weight"] \
                @ adapter[f"{theirs}.{t}.lora_A.weight"]
            assert delta.abs().max() > 0
            torch.testing.assert_close(final[f"{ours}.{o}.weight"],
                                       base[f"encoder.layer.{layer}.attention.self."
                                            f"{t}.weight"] + delta, atol=1e-6, rtol=0)
        assert torch.equal(final[f"{ours}.k_proj.weight"],
                           base[f"encoder.layer.{layer}.attention.self.key.weight"])
    assert torch.equal(final["embed.weight"], base["embeddings.word_embeddings.weight"])


def test_a_bottleneck_run_keeps_its_adapters_as_layers(data, tmp_path):
    run = tmp_path / "run"
    classify(data, run, "--bottleneck", 8, "--steps", 2, "--eval-every", 0)
    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "ATTNLAB_BOTTLENECK" and config["size"] == 8
    model = load(run).model
    assert type(model.encoder.layers[0].ffn.w2).__name__ == "BottleneckAdapter"


def test_layer_decay_gives_each_depth_its_rate(data):
    model = load(data / "encoder").model
    depths = layer_depths(model)
    assert depths["embed.weight"] == 0 and depths["pooler.weight"] == 3
    assert depths["encoder.layers.0.ffn.w1.weight"] == 1
    assert depths["encoder.layers.1.self_attn.q_proj.weight"] == 2
    optimizer = build_optimizer(model, TrainConfig(optimizer="adamw", layer_decay=0.5), 1.0)
    scales = {g["depth"]: g["lr_scale"] for g in optimizer.param_groups}
    assert scales == {0: 0.125, 1: 0.25, 2: 0.5, 3: 1.0}
    assert sum(len(g["params"]) for g in optimizer.param_groups) \
        == len(list(model.parameters()))


def test_layer_decay_and_unfreezing_in_a_run(data, tmp_path):
    run = tmp_path / "run"
    classify(data, run, "--layer-decay", 0.5, "--unfreeze-every", 2, "--steps", 4,
             "--save-every", 2, "--eval-every", 0, "--warmup-ratio", 0.5, "--lr", "1e-2")
    groups = load_trainer_state(run / "checkpoints" / "step-00000004")["optimizer"]["param_groups"]
    top = max(g["depth"] for g in groups)
    lr_top = next(g["lr"] for g in groups if g["depth"] == top)
    for g in groups:  # the rate of the last step: the schedule's times 0.5 per depth below
        assert g["lr"] == pytest.approx(lr_top * 0.5 ** (top - g["depth"]))
    # --warmup-ratio 0.5 of 4 steps: 2 warmup steps (not --warmup's 60), then linear decay;
    # step k takes λ(k − 1) as transformers counts: step 2 half the peak
    at_two = load_trainer_state(run / "checkpoints" / "step-00000002")["optimizer"]
    lr_two = max(g["lr"] for g in at_two["param_groups"])
    assert lr_two == pytest.approx(LinearSchedule(1e-2, 2, 4)(2)) == pytest.approx(5e-3)
    assert lr_top == pytest.approx(LinearSchedule(1e-2, 2, 4)(4))
    base = load_state(data / "encoder" / "model.safetensors")
    two = load_state(run / "checkpoints" / "step-00000002" / "model.safetensors")
    four = load_state(run / "checkpoints" / "step-00000004" / "model.safetensors")
    q = "encoder.layers.{}.self_attn.q_proj.weight"
    theirs = "encoder.layer.{}.attention.self.query.weight"
    # steps 1-2: only the head (and the pooler) trained; steps 3-4: the top layer too
    for layer in (0, 1):
        assert torch.equal(two[q.format(layer)], base[theirs.format(layer)])
    assert torch.equal(four[q.format(0)], base[theirs.format(0)])
    assert not torch.equal(four[q.format(1)], base[theirs.format(1)])


def test_early_stopping_keeps_the_best_model(data, tmp_path):
    run = tmp_path / "run"
    classify(data, run, "--steps", 12, "--eval-every", 2, "--patience", 2, "--lr", "3e-2",
             "--save-every", 100)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = {row["step"]: row["val_loss"] for row in rows if "val_loss" in row}
    best_step = min(val, key=val.get)
    assert json.loads((run / "best" / "step.json").read_text())["step"] == best_step
    # training stopped after --patience passes without a better loss, or at the last step
    after = sum(step > best_step for step in val)
    assert after <= 2 and (max(val) == 12 or after == 2)
    _assert_final_is_best(run)


def _assert_final_is_best(run):
    """The run ends with the model early stopping kept: ``final/`` (what the run folder
    means) holds ``best/``'s weights."""
    best = load_state(run / "best" / "model.safetensors")
    final = load_state(run / "final" / "model.safetensors")
    assert best.keys() == final.keys()
    assert all(torch.equal(best[k], final[k]) for k in best)
    assert load(run).path == run / "final"


def test_early_stopping_ends_a_language_model_run_with_its_best_model(data, tmp_path):
    """Not only the recipes that score a kept model: ``train lm --patience`` too."""
    run = tmp_path / "lm"
    code = main(["train", "lm", "--text", str(data / "corpus.txt"), "--preset", "gpt-mini",
                 "--block", "16", "--batch", "8", "--steps", "12", "--eval-every", "2",
                 "--patience", "1", "--lr", "3e-2", "--out", str(run), "--no-progress",
                 "--device", "cpu", "--precision", "fp32"])
    assert code == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = {row["step"]: row["val_loss"] for row in rows if "val_loss" in row}
    best_step = min(val, key=val.get)
    assert json.loads((run / "best" / "step.json").read_text())["step"] == best_step
    _assert_final_is_best(run)


def test_adapter_flags_without_an_adapter_are_one_line_errors(data, tmp_path, capsys):
    code = main(["train", "classify", "--data", str(data / "reviews.jsonl"), "--text-field",
                 "text", "--label-field", "label", "--init", str(data / "encoder"), "--out",
                 str(tmp_path / "run"), "--lora-targets", "q", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "--lora-targets and --lora-alpha need --lora R" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag, says", [("--lora", "--lora must be a rank >= 1, got 0"),
                                        ("--bottleneck", "--bottleneck must be a size >= 1")])
def test_a_zero_adapter_size_is_refused_not_a_full_fine_tune(data, tmp_path, capsys, flag,
                                                             says):
    code = main(["train", "classify", "--data", str(data / "reviews.jsonl"), "--text-field",
                 "text", "--label-field", "label", "--init", str(data / "encoder"), "--out",
                 str(tmp_path / "run"), flag, "0", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "checkpoints").exists()

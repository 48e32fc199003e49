"""The trainer's validation accuracy and ``stop_at_accuracy``, on a tiny ViT whose validation
results are scripted (what is tested is the loop's logic, not learning: the digits run in
tests/cli/test_train_image.py learns), and the image task's loss."""

import json
import math

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.data.images import ImageBatches, ImageSet
from attnlab.data.stream import ImageBatch
from attnlab.errors import BadInput
from attnlab.models import ViT
from attnlab.storage import load_state
from attnlab.training import trainer as trainer_module
from attnlab.training.objectives import CausalLM, ImageClassify, classification_metrics
from attnlab.training.trainer import TrainConfig, Trainer


def tiny_config() -> ModelConfig:
    return ModelConfig.from_preset("vit-tiny", d_model=16, n_heads=2, d_ff=32,
                                   n_encoder_layers=1, image_size=4, patch_size=2)


def random_set(n: int = 16) -> ImageSet:
    g = torch.Generator().manual_seed(0)
    return ImageSet(torch.rand(n, 1, 4, 4, generator=g), torch.randint(0, 10, (n,), generator=g))


def scripted_trainer(tmp_path, monkeypatch, losses, accuracies, task=None, val=True,
                     validated=None, **fields):
    """A Trainer validating every 2 steps, whose passes give ``losses`` and ``accuracies``
    in turn; its log lines go to the returned list. With ``validated`` (a list), each pass
    appends a copy of the weights it validated."""
    losses, accuracies = iter(losses), iter(accuracies)

    def evaluate(model, *args, **kwargs):
        if validated is not None:
            validated.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return next(losses)

    monkeypatch.setattr(trainer_module, "evaluate", evaluate)
    monkeypatch.setattr(trainer_module, "classification_metrics",
                        lambda *args, **kwargs: {"accuracy": next(accuracies)})
    config, data = tiny_config(), random_set()
    torch.manual_seed(0)
    settings = dict(steps=20, eval_every=2, save_every=100, progress=False) | fields
    logs: list[str] = []
    trainer = Trainer(ViT(config), ImageBatches(data, 4), TrainConfig(**settings),
                      tmp_path / "run", {}, config, task or ImageClassify(),
                      data.batches(8) if val else None, logs.append)
    return trainer, logs


def test_training_stops_at_the_first_pass_reaching_the_accuracy_and_keeps_that_model(
        tmp_path, monkeypatch):
    """Accuracy 0.9 is reached at step 6, by a model whose loss is not the best so far: it
    stops there, and best/ (what the recipes' final/ is made from) holds that model."""
    trainer, logs = scripted_trainer(tmp_path, monkeypatch, losses=[1.0, 0.8, 0.85, 0.5],
                                     accuracies=[0.5, 0.7, 0.9, 0.95], stop_at_accuracy=0.9,
                                     patience=5)
    history = trainer.fit()
    assert history[-1]["step"] == 6
    assert [r.get("val_accuracy") for r in history if "val_loss" in r] == [0.5, 0.7, 0.9]
    assert logs == ["step 2: val loss 1.0000 (best 1.0000), accuracy 0.5000",
                    "step 4: val loss 0.8000 (best 0.8000), accuracy 0.7000",
                    "step 6: val loss 0.8500 (best 0.8000), accuracy 0.9000",
                    "step 6: validation accuracy 0.9000 >= 0.9: stopping"]
    run = tmp_path / "run"
    assert json.loads((run / "best" / "step.json").read_text()) == {"step": 6}
    assert (run / "checkpoints" / "step-00000006").is_dir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["val_accuracy"] == 0.9


def test_early_stopping_stops_after_patience_passes_and_keeps_the_best_step(tmp_path,
                                                                          monkeypatch):
    """Validation losses 1.0, 0.8, 0.85, 0.9 at steps 2, 4, 6, 8 with patience 2: the best is
    step 4's, and the second pass without a better loss (step 8) ends training, 12 steps
    before ``steps``. ``best/`` holds step 4's weights, the model that pass validated, not
    the last step's: a trainer that never stops, or that keeps the last model, fails here."""
    validated: list[dict[str, torch.Tensor]] = []
    never_reached = [0.95] * 6  # steps 10-20: what a trainer that does not stop would see
    trainer, logs = scripted_trainer(tmp_path, monkeypatch,
                                     losses=[1.0, 0.8, 0.85, 0.9, *never_reached],
                                     accuracies=[0.5] * 10, patience=2, validated=validated)
    history = trainer.fit()
    assert [r["step"] for r in history if "val_loss" in r] == [2, 4, 6, 8]
    assert history[-1]["step"] == trainer.step == 8 < trainer.cfg.steps
    assert logs[-1] == "step 8: val loss 0.9000 (best 0.8000), accuracy 0.5000"
    best = tmp_path / "run" / "best"
    assert json.loads((best / "step.json").read_text()) == {"step": 4}
    kept = load_state(best / "model.safetensors")
    step4, step8 = validated[1], validated[3]
    assert kept.keys() == step4.keys()
    assert all(torch.equal(kept[k], step4[k]) for k in kept)
    assert any(not torch.equal(step4[k], step8[k]) for k in step4)  # training moved on
    # the stop was saved: a resumed run continues from step 8, not from a stale checkpoint
    assert (tmp_path / "run" / "checkpoints" / "step-00000008").is_dir()


def test_without_a_target_the_accuracy_is_reported_and_training_goes_on(tmp_path,
                                                                       monkeypatch):
    trainer, logs = scripted_trainer(tmp_path, monkeypatch, losses=[1.0, 0.9, 0.8],
                                     accuracies=[0.99, 1.0, 1.0], steps=6)
    history = trainer.fit()
    assert history[-1]["step"] == 6 and len(logs) == 3
    assert logs[-1] == "step 6: val loss 0.8000 (best 0.8000), accuracy 1.0000"
    assert not (tmp_path / "run" / "best").exists()  # no early stopping: no best/


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5, math.nan])
def test_stop_at_accuracy_must_be_a_fraction(value):
    with pytest.raises(BadInput, match="stop_at_accuracy must be in"):
        TrainConfig(stop_at_accuracy=value)


@pytest.mark.parametrize("task, val, eval_every", [(CausalLM(), True, 2),
                                                   (ImageClassify(), False, 2),
                                                   (ImageClassify(), True, 0)])
def test_stop_at_accuracy_needs_a_classifier_validated_during_training(
        tmp_path, monkeypatch, task, val, eval_every):
    with pytest.raises(BadInput, match="stop_at_accuracy needs a task that classifies"):
        scripted_trainer(tmp_path, monkeypatch, [], [], task=task, val=val,
                         eval_every=eval_every, stop_at_accuracy=0.5)


def test_image_classify_is_the_smoothed_cross_entropy_of_the_images_logits():
    config = tiny_config()
    torch.manual_seed(0)
    model = ViT(config).eval()
    data = random_set(8)
    batch = ImageBatch(data.images, data.labels)
    task = ImageClassify(label_smoothing=0.1)
    assert (task.target_tokens(batch), task.source_tokens(batch)) == (8, 0)
    logits = model(data.images)
    sums = task.loss(model, batch)
    expected = torch.nn.functional.cross_entropy(logits, data.labels, label_smoothing=0.1,
                                                 reduction="sum")
    torch.testing.assert_close(sums.loss, expected)
    got = classification_metrics(model, data.batches(3), torch.device("cpu"), 10, task)
    assert got["accuracy"] == float((logits.argmax(-1) == data.labels).float().mean())

"""A run folder's rules (attnlab.storage): checkpoint names, listing and pruning, the step a
folder holds, and which weights the run folder means. Folders are made by hand (an empty
``model.safetensors`` marks weights): no training."""

import json

import pytest

from attnlab.errors import MissingFile
from attnlab.storage import (
    CHECKPOINTS,
    FINAL,
    STEP_FILE,
    checkpoint_dir,
    checkpoint_step,
    list_checkpoints,
    prune_checkpoints,
    resolve_model_dir,
)


def _weights(folder, step=None):
    folder.mkdir(parents=True)
    (folder / "model.safetensors").touch()
    if step is not None:
        (folder / STEP_FILE).write_text(json.dumps({"step": step}))
    return folder


def test_checkpoints_are_named_listed_oldest_first_and_pruned(tmp_path):
    root = tmp_path / CHECKPOINTS
    assert checkpoint_dir(root, 12) == root / "step-00000012"
    for step in (12, 4, 8):
        _weights(checkpoint_dir(root, step))
    (root / ".tmp-step-00000016-123").mkdir()  # an interrupted write
    (root / "notes").mkdir()
    assert [p.name for p in list_checkpoints(root)] == ["step-00000004", "step-00000008",
                                                        "step-00000012"]
    assert list_checkpoints(tmp_path / "nothing") == []
    prune_checkpoints(root, None)
    assert len(list_checkpoints(root)) == 3
    prune_checkpoints(root, 2)
    assert [p.name for p in list_checkpoints(root)] == ["step-00000008", "step-00000012"]


def test_the_step_a_folder_holds(tmp_path):
    assert checkpoint_step(tmp_path / "step-00000042") == 42
    assert checkpoint_step(_weights(tmp_path / FINAL, step=7)) == 7
    assert checkpoint_step(_weights(tmp_path / "by-hand")) is None
    for bad in ("{", "[7]", '{"step": true}', '{"step": "7"}'):
        (tmp_path / "by-hand" / STEP_FILE).write_text(bad)
        assert checkpoint_step(tmp_path / "by-hand") is None


def test_a_run_folder_means_final_unless_a_checkpoint_is_newer(tmp_path):
    run = tmp_path / "run"
    newest = _weights(checkpoint_dir(run / CHECKPOINTS, 8))
    assert resolve_model_dir(run) == newest  # no final/ yet
    final = _weights(run / FINAL, step=8)
    assert resolve_model_dir(run) == final
    assert resolve_model_dir(newest) == newest  # a checkpoint folder means itself
    later = _weights(checkpoint_dir(run / CHECKPOINTS, 12))  # training resumed past final/
    with pytest.warns(UserWarning, match="made at step 8, but training went on to step-00000012"):
        assert resolve_model_dir(run) == later
    with pytest.raises(MissingFile, match="model folder not found"):
        resolve_model_dir(tmp_path / "missing")
    with pytest.raises(MissingFile, match="no model.safetensors in"):
        resolve_model_dir(tmp_path)

"""attnlab.training: training only: schedules, label-smoothed loss, checkpoints, the training
loop, DDP, and the recipes that put them together. Loading and running a model lives in
:mod:`attnlab.storage` and :mod:`attnlab.generation`."""

from attnlab.training.checkpoint import (
    CheckpointError,
    average_checkpoints,
    list_checkpoints,
    save_checkpoint,
)
from attnlab.training.loss import label_smoothed_loss, smoothed_target
from attnlab.training.schedule import CosineSchedule, NoamSchedule
from attnlab.training.trainer import TrainConfig, Trainer, TrainingDiverged

__all__ = ["CheckpointError", "average_checkpoints", "list_checkpoints", "save_checkpoint",
           "label_smoothed_loss", "smoothed_target", "CosineSchedule", "NoamSchedule",
           "TrainConfig", "Trainer", "TrainingDiverged"]

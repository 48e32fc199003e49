"""attnlab.training: schedules, label-smoothed loss, checkpoints, the training loop, DDP."""

from attnlab.training.checkpoint import (
    CheckpointError,
    average_checkpoints,
    list_checkpoints,
    load_model_dir,
    save_checkpoint,
)
from attnlab.training.loss import label_smoothed_loss, smoothed_target
from attnlab.training.schedule import CosineSchedule, NoamSchedule
from attnlab.training.trainer import TrainConfig, Trainer, TrainingDiverged, plot_loss_curve

__all__ = ["CheckpointError", "average_checkpoints", "list_checkpoints", "load_model_dir",
           "save_checkpoint", "label_smoothed_loss", "smoothed_target", "CosineSchedule",
           "NoamSchedule", "TrainConfig", "Trainer", "TrainingDiverged", "plot_loss_curve"]

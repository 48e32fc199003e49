"""Smaller and faster models: post-training quantisation (the integer layers themselves live in
:mod:`attnlab.nn.quantized`) and pruning. Distillation trains, so it lives in ``training/``."""

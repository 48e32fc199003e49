"""``attnlab info``: a preset's architecture and parameter table, or the detected hardware."""

from __future__ import annotations

import argparse

from attnlab.cli.common import add_preset_args, preset_config


def cmd_info(args: argparse.Namespace) -> None:
    import torch

    from attnlab import hardware
    from attnlab.build import build_model
    from attnlab.params import parameter_breakdown

    if args.hardware:
        print("\n".join(hardware.describe(args.device)))
        return
    config = preset_config(args)
    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        model = build_model(config)
    layers = {"encoder-decoder": f"{config.n_encoder_layers} encoder + "
                                 f"{config.n_decoder_layers} decoder",
              "decoder": f"{config.n_decoder_layers} (causal)",
              "encoder": f"{config.n_encoder_layers} (bidirectional)",
              "vision": f"{config.n_encoder_layers} (bidirectional)"}[config.arch]
    placement = {"post": "post-LN  x ← Norm(x + Sublayer(x))",
                 "pre": "pre-LN  x ← x + Sublayer(Norm(x))"}[config.norm_placement]
    rows = [
        ("architecture", config.arch),
        ("layers", layers),
        ("d_model", config.d_model),
        ("heads", f"{config.n_heads} (kv heads {config.kv_heads})"),
        ("d_k = d_v", config.d_k),
        ("d_ff", config.d_ff),
        ("dropout", f"{config.dropout} (attention {config.attention_dropout})"),
        ("positional encoding", config.positional),
        ("norm", f"{config.norm}, {placement}"),
        ("activation", config.activation),
        ("vocabulary", f"{config.vocab_size}" + (" shared" if config.tgt_vocab_size is None
                                                  else f" / {config.tgt_vocab_size}")),
        ("tied embeddings", config.tie_embeddings),
        ("max length", config.max_len),
    ]
    if config.share_layers:  # ALBERT: the parameter table counts the one layer once
        layers += ", one layer's weights shared by all"
        rows[1] = ("layers", layers)
    if config.rope_scaling:
        rows.insert(8, ("rope scaling", ", ".join(f"{k} {v}" for k, v in
                                                  config.rope_scaling.items())))
    if config.sliding_window is not None:  # Mistral
        rows.insert(8, ("sliding window", f"{config.sliding_window} (query i sees keys "
                                          f"i - {config.sliding_window} < j <= i)"))
    if config.arch == "encoder":
        rows += [("segment types", config.type_vocab_size), ("pooler", config.pooler),
                 ("head", config.head)]
        if config.embedding_size:
            rows.append(("embedding size", f"{config.embedding_size} (projected to "
                                           f"{config.d_model})"))
        if config.position_offset:  # RoBERTa
            rows.append(("first position", f"{config.position_offset} (pads take "
                                           f"{config.pad_id})"))
    if config.arch == "vision":  # pixels, not a vocabulary: the image and its patches instead
        side, p = config.image_size, config.patch_size
        rows = [r for r in rows if r[0] not in ("vocabulary", "tied embeddings", "max length")]
        rows += [("image", f"{config.num_channels} x {side} x {side}"),
                 ("patches", f"{config.n_patches} of {p} x {p} (+ [CLS])"),
                 ("head", f"{config.head} ({config.num_labels} labels)")]
    print(f"preset {args.preset}")
    for key, value in rows:
        print(f"  {key:<20} {value}")
    print("\nparameters")
    for name, count in parameter_breakdown(model).items():
        print(f"  {name:<20} {count:>13,}  ({count / 1e6:.2f}M)")


def add_commands(sub) -> None:
    info = sub.add_parser("info", help="print a preset's architecture and parameter counts",
                          description="Print a preset's architecture and parameter table.")
    add_preset_args(info, "base", any_arch=True)
    info.add_argument("--hardware", action="store_true",
                      help="print the detected hardware and what --precision auto chooses")
    info.add_argument("--device", default="auto", help="with --hardware: the device to decide for")
    info.set_defaults(func=cmd_info)

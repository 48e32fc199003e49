"""Translation with an encoder–decoder: batched greedy decoding and sampling, ``translate``
(greedy, sampled or beam search, batched by length), exact match, and the cross-attention of
one translation.

    greedy:   y_t = argmax_v p(v | y_<t, x)
    sampled:  y_t ~ softmax(filter(logits) / T)    (the sampling step of ``generate``,
                                                    :func:`attnlab.generation.decode.next_tokens`)

The encoder runs once; with ``use_cache`` each step feeds only the newest token and the
decoder's KV cache supplies the rest (cross-attention keys/values are computed at the first
step and reused). A sentence stops at eos; the batch stops when all have, or at ``max_len``
(default: source length + 50, as in the paper).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnlab.cpu.prepare import decoding_kernels_
from attnlab.errors import BadInput
from attnlab.models import Transformer
from attnlab.tokenizers import Tokenizer, pad

if TYPE_CHECKING:  # (the compiled step's module is imported only when one is given)
    from attnlab.generation.compiled import CompiledStep

SOURCE_BUCKET = 32  # compiled translation pads source lengths to a multiple of this


@torch.no_grad()
def greedy_decode(model: Transformer, src_ids: Tensor, max_len: int | None = None,
                  use_cache: bool = True, return_logits: bool = False,
                  compiled: CompiledStep | None = None):
    """``src_ids (batch, src_len)`` -> ``tokens (batch, out_len)`` starting with bos.

    Finished rows are filled with pad after their eos. With ``return_logits`` also returns the
    logits of each step ``(batch, out_len - 1, vocab)``. ``compiled``: every step after the
    first runs through that compiled one-token step (``generation/compiled.py``).
    """
    return _decode(model, src_ids, max_len, use_cache, return_logits, compiled,
                   lambda logits: logits.argmax(-1))


@torch.no_grad()
def sample_decode(model: Transformer, src_ids: Tensor, temperature: float,
                  top_k: int | None = None, top_p: float | None = None,
                  generator: torch.Generator | None = None, max_len: int | None = None,
                  compiled: CompiledStep | None = None) -> Tensor:
    """:func:`greedy_decode`'s loop with each token drawn by ``generate``'s sampling step
    (:func:`~attnlab.generation.decode.next_tokens`: softmax of the top-k / top-p filtered
    logits over ``temperature``, ``torch.multinomial`` with ``generator``, one draw for every
    row of the batch a step); ``temperature`` 0 is greedy decoding. Pad is never drawn."""
    from attnlab.generation.decode import check_sampling, next_tokens

    check_sampling(temperature, top_k, top_p)
    return _decode(model, src_ids, max_len, True, False, compiled,
                   lambda logits: next_tokens(logits.float(), temperature, top_k, top_p,
                                              generator))


def _decode(model: Transformer, src_ids: Tensor, max_len: int | None, use_cache: bool,
            return_logits: bool, compiled: CompiledStep | None, choose):
    """The loop of :func:`greedy_decode` and :func:`sample_decode`; ``choose(logits)`` picks
    each row's next token from logits in which pad is −inf."""
    decoding_kernels_(model)  # integer layers and one-query steps on the CPU kernels
    if compiled is not None and not use_cache:
        raise ValueError("a compiled step decodes with the cache (use_cache=True)")
    cfg = model.config
    batch = src_ids.shape[0]
    if max_len is None:
        max_len = src_ids.shape[1] + 50
    max_len = min(max_len, cfg.max_len)
    memory, src_mask = model.encode(src_ids)
    tokens = torch.full((batch, 1), cfg.bos_id, dtype=torch.long, device=src_ids.device)
    done = torch.zeros(batch, dtype=torch.bool, device=src_ids.device)
    cache = model.new_cache(capacity=max_len) if use_cache and compiled is None else None
    steps = None
    if compiled is not None:  # the first step eager, the others compiled
        from attnlab.generation.compiled import DecoderSteps

        steps = DecoderSteps(model, memory, src_mask, max_len, compiled)
    all_logits = []
    pad_column = torch.zeros(cfg.target_vocab_size, dtype=torch.bool, device=src_ids.device)
    pad_column[cfg.pad_id] = True  # padding is never a word of the output
    for _ in range(max_len - 1):
        if steps is not None:
            logits = steps(tokens[:, -1:])
        else:
            step_input = tokens[:, -1:] if use_cache else tokens
            logits = model.decode(step_input, memory, src_mask, cache=cache)[:, -1]
        if return_logits:
            all_logits.append(logits)
        next_token = choose(logits.masked_fill(pad_column, float("-inf")))
        next_token = next_token.masked_fill(done, cfg.pad_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        done |= next_token == cfg.eos_id
        if done.all():
            break
    if return_logits:
        return tokens, torch.stack(all_logits, dim=1)
    return tokens


@torch.no_grad()
def translate(model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer, sentences: list[str],
              batch_size: int = 256, max_len: int | None = None, beam_size: int = 1,
              alpha: float = 0.6, compiled: CompiledStep | None = None,
              temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
              generator: torch.Generator | None = None) -> list[str]:
    """Translations of ``sentences``: greedy (``beam_size=1``), beam search with the GNMT
    length penalty α, or, with ``temperature`` > 0, one sampled translation each
    (:func:`sample_decode`: ``top_k``, ``top_p`` and ``generator`` as ``generate`` takes
    them). Sentences are batched by length (less padding), answers keep the input order.
    ``compiled``: decode with that compiled step; each batch's source is then padded to a
    multiple of ``SOURCE_BUCKET`` tokens, so that few source lengths compile a graph."""
    sampling = temperature != 0  # (sample_decode refuses a negative or NaN one)
    if sampling and beam_size != 1:
        raise BadInput(f"sampling (temperature {temperature}) draws one translation; beam "
                       f"search of beam size {beam_size} does not sample: use one of them")
    model.eval()
    ids = [src_tok.encode(s, add_eos=True) for s in sentences]
    model.config.check_length(max(map(len, ids), default=0), "input")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    device = next(model.parameters()).device
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = pad([ids[i] for i in chunk], model.config.pad_id).to(device)
        limit = src.shape[1] + 50 if max_len is None else max_len  # before any padding
        if compiled is not None:  # pad to the bucket (never past the model's length)
            width = min(-(-src.shape[1] // SOURCE_BUCKET) * SOURCE_BUCKET, model.config.max_len)
            src = torch.nn.functional.pad(src, (0, width - src.shape[1]),
                                          value=model.config.pad_id)
        if sampling:
            tokens = sample_decode(model, src, temperature, top_k, top_p, generator,
                                   max_len=limit, compiled=compiled)
        elif beam_size == 1:
            tokens = greedy_decode(model, src, max_len=limit, compiled=compiled)
        else:
            from attnlab.generation.beam import beam_search

            tokens = beam_search(model, src, beam_size, alpha, max_len=limit,
                                 compiled=compiled)
        for i, row in zip(chunk, tokens.tolist(), strict=True):
            out[i] = tgt_tok.decode(row)
    return out


def exact_match(model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer,
                pairs: list[tuple[str, str]]) -> tuple[float, list[str]]:
    """The fraction of ``(source, reference)`` pairs translated exactly, and the hypotheses."""
    hyps = translate(model, src_tok, tgt_tok, [s for s, _ in pairs])
    correct = sum(h == t for h, (_, t) in zip(hyps, pairs, strict=True))
    return correct / max(1, len(pairs)), hyps


@torch.no_grad()
def cross_attention(model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer,
                    sentence: str) -> tuple[Tensor, list[str], list[str]]:
    """The last decoder layer's cross-attention, averaged over heads, for the greedy
    translation of ``sentence``: ``weights (tgt_len, src_len)``, the source pieces and the
    output pieces (what each step produced)."""
    if model.config.arch != "encoder-decoder":
        raise BadInput(f"arch={model.config.arch!r} has no cross-attention")
    src = pad([src_tok.encode(sentence, add_eos=True)]).to(next(model.parameters()).device)
    out = greedy_decode(model, src)
    out = out[:, : int((out[0] != model.config.pad_id).sum())]
    model(src, out[:, :-1], need_weights=True)
    weights = model.decoder.layers[-1].cross_weights[0].mean(0)
    return (weights, [src_tok.vocab[i] for i in src[0].tolist()],
            [tgt_tok.vocab[i] for i in out[0, 1:].tolist()])

"""Router kernels for tests/test_router.py's --impl runs: a correct one and
planted bugs, with router --impl's signature (experiments/router_cases.py)."""

import torch


def _select(logits, bias, top_k, n_group, topk_group, scoring):
    scores = torch.softmax(logits, dim=1) if scoring == "softmax" else torch.sigmoid(logits)
    # softmax is monotone: choosing on the logits keeps the order a rounded exp may lose
    choice = (logits if scoring == "softmax" and bias is None else scores + (0 if bias is None else bias)).clone()
    t, e = choice.shape
    if n_group > 1:
        g = choice.view(t, n_group, e // n_group)
        gs = g.topk(min(2, e // n_group), dim=2).values.sum(dim=2)
        keep = _topk_lowest(gs, topk_group)
        mask = torch.ones(t, n_group, dtype=torch.bool).scatter(1, keep, False)
        choice = choice.masked_fill(mask.repeat_interleave(e // n_group, dim=1), float("-inf"))
    return scores, _topk_lowest(choice, top_k)


def _topk_lowest(x, k):
    return torch.sort(-x, dim=1, stable=True).indices[:, :k]  # an exact tie: the lowest index first


def correct(logits, bias, *, top_k, n_group, topk_group, scoring, normalize):
    scores, ids = _select(logits, bias, top_k, n_group, topk_group, scoring)
    w = scores.gather(1, ids)
    return (w / w.sum(dim=1, keepdim=True) if normalize else w), ids


def fused_max_from_zero(logits, bias, *, top_k, n_group, topk_group, scoring, normalize):
    """A fused top-k whose running max starts at 0 (flashinfer #2822's failure): with every logit negative
    no expert beats the start, and each slot keeps expert 0."""
    t, e = logits.shape
    work = logits.clone()
    ids = torch.zeros(t, top_k, dtype=torch.int64)
    for j in range(top_k):
        best = torch.zeros(t, dtype=logits.dtype)
        arg = torch.zeros(t, dtype=torch.int64)
        for i in range(e):
            better = work[:, i] > best
            best = torch.where(better, work[:, i], best)
            arg = torch.where(better, torch.full_like(arg, i), arg)
        ids[:, j] = arg
        work[torch.arange(t), arg] = float("-inf")
    scores = torch.softmax(logits, dim=1) if scoring == "softmax" else torch.sigmoid(logits)
    w = scores.gather(1, ids)
    return (w / w.sum(dim=1, keepdim=True) if normalize else w), ids


def weights_with_bias(logits, bias, *, top_k, n_group, topk_group, scoring, normalize):
    """Weights taken from the biased choice scores rather than the scores."""
    scores, ids = _select(logits, bias, top_k, n_group, topk_group, scoring)
    w = (scores + (0 if bias is None else bias)).gather(1, ids)
    return (w / w.sum(dim=1, keepdim=True) if normalize else w), ids


def raises(logits, bias, **kw):
    raise ValueError("router exploded")


def exits(logits, bias, **kw):
    import sys

    sys.exit(3)


def wrong_shape(logits, bias, *, top_k, **kw):
    return logits[:, :1], torch.zeros(logits.shape[0], 1, dtype=torch.int64)

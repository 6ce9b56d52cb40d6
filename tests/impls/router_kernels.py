"""Router kernels for the --impl runs of tests/test_router.py and test_router_options.py: a correct one and
planted bugs, with router --impl's signature (experiments/router_cases.py)."""

import torch


def _top2_sum(g):
    """A group's score (DeepSeek-V3's noaux_tc): the sum of its two best choices."""
    return g.topk(min(2, g.shape[2]), dim=2).values.sum(dim=2)


def _select(logits, bias, top_k, n_group, topk_group, scoring, *, group_score=_top2_sum, masked=True,
            pick=None):
    """The scores and the chosen ids. The planted kernels below swap one piece: the group statistic, which
    groups are masked (masked=False: the kept ones), or the top-k's tie rule (pick)."""
    pick = pick or _topk_lowest
    scores = torch.softmax(logits, dim=1) if scoring == "softmax" else torch.sigmoid(logits)
    # softmax is monotone: choosing on the logits keeps the order a rounded exp may lose
    choice = (logits if scoring == "softmax" and bias is None else scores + (0 if bias is None else bias)).clone()
    t, e = choice.shape
    if n_group > 1:
        keep = pick(group_score(choice.view(t, n_group, e // n_group)), topk_group)
        mask = torch.full((t, n_group), masked).scatter(1, keep, not masked)
        choice = choice.masked_fill(mask.repeat_interleave(e // n_group, dim=1), float("-inf"))
    return scores, pick(choice, top_k)


def _topk_lowest(x, k):
    return torch.sort(-x, dim=1, stable=True).indices[:, :k]  # an exact tie: the lowest index first


def _topk_highest(x, k):
    # a stable sort of the columns reversed: an exact tie goes to the highest index
    return (x.shape[1] - 1 - torch.sort(-x.flip(1), dim=1, stable=True).indices)[:, :k]


def _weights(scores, ids, normalize):
    w = scores.gather(1, ids)
    return w / w.sum(dim=1, keepdim=True) if normalize else w


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


def ties_to_highest(logits, bias, *, top_k, n_group, topk_group, scoring, normalize):
    """Right but for the tie rule: an exact tie goes to the highest expert index (router --ties highest)."""
    scores, ids = _select(logits, bias, top_k, n_group, topk_group, scoring, pick=_topk_highest)
    return _weights(scores, ids, normalize), ids


def always_normalized(logits, bias, *, top_k, n_group, topk_group, scoring, normalize):
    """Divides the weights by their sum even when the model says not to (norm_topk_prob false)."""
    scores, ids = _select(logits, bias, top_k, n_group, topk_group, scoring)
    return _weights(scores, ids, True), ids


def drops_bias(logits, bias, *, top_k, n_group, topk_group, scoring, normalize):
    """Chooses on the scores alone: the correction bias never reaches the top-k."""
    scores, ids = _select(logits, None, top_k, n_group, topk_group, scoring)
    return _weights(scores, ids, normalize), ids


def groups_by_max(logits, bias, *, top_k, n_group, topk_group, scoring, normalize):
    """Ranks the groups by their best choice (DeepSeek-V2's group_limited_greedy) where the model's
    noaux_tc ranks them by the sum of their two best."""
    scores, ids = _select(logits, bias, top_k, n_group, topk_group, scoring,
                          group_score=lambda g: g.max(dim=2).values)
    return _weights(scores, ids, normalize), ids


def masks_kept_groups(logits, bias, *, top_k, n_group, topk_group, scoring, normalize):
    """The group mask inverted: the best groups are masked and the top-k is taken from the rest."""
    scores, ids = _select(logits, bias, top_k, n_group, topk_group, scoring, masked=False)
    return _weights(scores, ids, normalize), ids

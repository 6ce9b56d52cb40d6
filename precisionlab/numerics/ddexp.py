"""Double-double arithmetic for references that must be right past float64:
softmax's probabilities and log-sum-exp (an fp32 kernel's output can be within
2^-53 of the truth, where a float64 reference is as wrong as the kernel).
A value is a pair (hi, lo) of float64 arrays with |lo| <= ulp(hi) / 2;
exp_dd and softmax_dd are accurate to about 2^-100 relative."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fast_two_sum(a, b):  # |a| >= |b| (or a == 0)
    s = a + b
    return s, b - (s - a)


def _split(a):
    t = 134217729.0 * a  # 2^27 + 1
    hi = t - (t - a)
    return hi, a - hi


def two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def dd_add(ah, al, bh, bl):
    s, e = two_sum(ah, bh)
    e = e + (al + bl)
    return fast_two_sum(s, e)


def dd_mul(ah, al, bh, bl):
    p, e = two_prod(ah, bh)
    e = e + (ah * bl + al * bh)
    return fast_two_sum(p, e)


def dd_div(ah, al, bh, bl):
    q1 = ah / bh
    ph, pl = dd_mul(bh, bl, q1, np.zeros_like(q1))
    rh, rl = dd_add(ah, al, -ph, -pl)
    q2 = rh / bh
    return fast_two_sum(q1, q2)


def _dd_const(q: Fraction) -> tuple[float, float]:
    hi = float(q)
    return hi, float(q - Fraction(hi))


_LN2 = Fraction(  # ln 2 to 120 bits
    int("b17217f7d1cf79abc9e3b39803f2f6af", 16), 1 << 128)
LN2_HI, LN2_LO = _dd_const(_LN2)
_INV_FACT = [_dd_const(Fraction(1, math.factorial(k))) for k in range(0, 12)]
_HALVINGS = 10


def exp_dd(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """exp(z) for float64 z <= 0 (-inf gives 0), as a double-double."""
    z = np.asarray(z, dtype=np.float64)
    zero = z < -745.2  # below the smallest subnormal's half: exp rounds to 0
    zz = np.where(zero, 0.0, z)
    k = np.rint(zz / LN2_HI)
    # r = z - k ln2, in double-double: k * LN2_HI exactly (two_prod), then the rest
    ph, pl = two_prod(k, np.full_like(k, LN2_HI))
    rh, rl = two_sum(zz, -ph)
    rl = rl - pl - k * LN2_LO
    rh, rl = fast_two_sum(rh, rl)
    rh, rl = np.ldexp(rh, -_HALVINGS), np.ldexp(rl, -_HALVINGS)  # |r| <= 0.35 / 1024
    # exp(r) - 1 by Horner through r^11/11!
    sh, sl = np.full_like(rh, _INV_FACT[11][0]), np.full_like(rh, _INV_FACT[11][1])
    for c_hi, c_lo in reversed(_INV_FACT[1:11]):
        sh, sl = dd_mul(sh, sl, rh, rl)
        sh, sl = dd_add(sh, sl, np.full_like(rh, c_hi), np.full_like(rh, c_lo))
    sh, sl = dd_mul(sh, sl, rh, rl)  # expm1(r)
    # (1 + m)^2 = 1 + (2m + m^2): square the expm1 form, no 1 + tiny loss
    for _ in range(_HALVINGS):
        qh, ql = dd_mul(sh, sl, sh, sl)
        sh, sl = dd_add(2 * sh, 2 * sl, qh, ql)
    eh, el = dd_add(np.ones_like(sh), np.zeros_like(sh), sh, sl)
    ki = k.astype(np.int64)
    eh, el = np.ldexp(eh, ki), np.ldexp(el, ki)
    eh[zero] = 0.0
    el[zero] = 0.0
    return eh, el


def softmax_dd(x: np.ndarray):
    """Softmax and log-sum-exp of each row of x, every row with a finite max
    (entries finite or -inf), as double-doubles: (p_hi, p_lo, lse_hi, lse_lo)."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        z = x - m  # not exact in general: the difference in double-double
    zh, zl = two_sum(x, -m)
    zh, zl = np.where(np.isneginf(x), -np.inf, zh), np.where(np.isneginf(x), 0.0, zl)
    eh, el = exp_dd(zh)
    # exp(zh + zl) = exp(zh) (1 + zl + ...), |zl| <= 2^-53 |z|
    with np.errstate(invalid="ignore"):
        ch, cl = dd_mul(eh, el, np.where(np.isfinite(zl), zl, 0.0), np.zeros_like(zl))
    eh, el = dd_add(eh, el, ch, cl)
    eh, el = np.where(np.isneginf(x), 0.0, eh), np.where(np.isneginf(x), 0.0, el)
    del z
    rows = x.shape[0]
    ph, pl = np.empty_like(eh), np.empty_like(el)
    lh, ll = np.empty(rows), np.empty(rows)
    for i in range(rows):
        terms = np.concatenate([eh[i], el[i]]).tolist()
        s_hi = math.fsum(terms)
        s_lo = math.fsum(terms + [-s_hi])
        sh, sl = np.full(x.shape[1], s_hi), np.full(x.shape[1], s_lo)
        ph[i], pl[i] = dd_div(eh[i], el[i], sh, sl)
        # log(s) by one Newton step from float64's: y + (s exp(-y) - 1)
        y = math.log(s_hi)
        gh, gl = exp_dd(np.array([-y]))
        th, tl = dd_mul(gh, gl, np.array([s_hi]), np.array([s_lo]))
        th, tl = dd_add(th, tl, np.array([-1.0]), np.array([0.0]))
        yh, yl = dd_add(np.array([y]), np.array([0.0]), th, tl)
        lh_, ll_ = dd_add(np.array([float(m[i, 0])]), np.array([0.0]), yh, yl)
        lh[i], ll[i] = lh_[0], ll_[0]
    return ph, pl, lh, ll

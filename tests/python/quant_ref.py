"""An independent numpy reference for ggml's block decoders, written from the
layouts in the project's GGUF/ggml spec (§3: block structs, scale packing,
element order, float operation order) and nothing of k3pack's C++.

Every function takes the raw bytes of `nblocks` whole blocks as a uint8 array
of shape (nblocks, type_size) and returns float32 values of shape
(nblocks, block_size). All arithmetic that ggml does in float32 is done in
numpy float32, in ggml's order (`d * sc` first, then times the quant), so the
results are bit-exact except for NaN payloads, which the tests compare only
as "is a NaN". Numbers whose exact value is known (fp16 and E8M0/UE4M3
scales) are built from that value in float64 and rounded once.

The IQ grids are read from src/quant/iq_grid_hex.h (the compact packed form
gguf-py uses) with a parser of our own; the entries themselves are pinned
against ggml-common.h by tests/quant/tables_test.cpp.
"""

import os
import re

import numpy as np

F32 = np.float32
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------- scalars

def f16_to_f32(h):
    """IEEE binary16 bits -> float32, exact; NaNs keep their payload, quieted
    (spec §3.1: what vcvtph2ps gives)."""
    h = np.asarray(h, dtype=np.uint16).astype(np.uint32)
    sign = (h >> 15).astype(bool)
    exp = ((h >> 10) & 0x1F).astype(np.int64)
    man = (h & 0x3FF).astype(np.float64)
    val = np.where(exp == 0, man * 2.0 ** -24, (1.0 + man / 1024.0) * np.exp2(exp - 15.0))
    val = np.where(sign, -val, val).astype(F32)
    special = exp == 31
    bits = val.view(np.uint32).copy()
    nan_bits = ((h & 0x8000) << 16) | 0x7F800000 | ((h & 0x3FF) << 13)
    nan_bits = np.where((h & 0x3FF) != 0, nan_bits | 0x00400000, nan_bits)
    bits[special] = nan_bits[special]
    return bits.view(F32)


def bf16_to_f32(h):
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(F32)


def e8m0_half(x):
    """ggml_e8m0_to_fp32_half: 2^(x - 128), finite for every byte."""
    return np.ldexp(1.0, np.asarray(x, dtype=np.int64) - 128).astype(F32)


def ue4m3(x):
    """ggml_ue4m3_to_fp32, with its factor 0.5; 0x00 and 0x7F give 0."""
    x = np.asarray(x, dtype=np.int64)
    exp = (x >> 3) & 0xF
    man = (x & 7).astype(np.float64)
    v = np.where(exp == 0, man * 2.0 ** -9, (1.0 + man / 8.0) * np.exp2(exp - 7.0)) * 0.5
    v = np.where((x == 0) | (x == 0x7F), 0.0, v)
    return v.astype(F32)


def _u16(b, off):
    return b[:, off].astype(np.uint32) | (b[:, off + 1].astype(np.uint32) << 8)


def _u32(b, off):
    return _u16(b, off) | (_u16(b, off + 2) << 16)


def _half(b, off):
    return f16_to_f32(_u16(b, off).astype(np.uint16))[:, None]


def _f(a):
    return np.asarray(a).astype(F32)


def _neg_where(v, neg):
    """ggml's `* (sign ? -1 : 1)`: negation where `neg` (a sign flip)."""
    return np.where(neg, np.negative(v), v)


# ---------------------------------------------------------------- tables

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int64)
# E2M1 values doubled: codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 times two; bit 3 is the sign.
_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
KVALUES_FP4 = np.array([int(2 * v) for v in _E2M1] + [-int(2 * v) for v in _E2M1], np.int64)
KSIGNS = np.array([i | ((bin(i).count("1") & 1) << 7) for i in range(128)], np.int64)

_GRID_SPECS = {  # name in iq_grid_hex.h: (entries, bytes per entry, bits per code, code -> byte value)
    "kIq2xxsHex": (256, 8, 2, (0x08, 0x19, 0x2B)),
    "kIq2xsHex": (512, 8, 2, (0x08, 0x19, 0x2B)),
    "kIq2sHex": (1024, 8, 2, (0x08, 0x19, 0x2B)),
    "kIq3xxsHex": (256, 4, 3, (0x04, 0x0C, 0x14, 0x1C, 0x24, 0x2C, 0x34, 0x3E)),
    "kIq3sHex": (512, 4, 3, (0x01, 0x03, 0x05, 0x07, 0x09, 0x0B, 0x0D, 0x0F)),
    "kIq1sHex": (2048, 8, 2, (-1, 0, 1)),
}
_grids = {}


def grid(name):
    """Grid `name` as an int64 array (entries, bytes per entry): byte k of
    ggml's grid word is element k."""
    if not _grids:
        with open(os.path.join(REPO, "src", "quant", "iq_grid_hex.h")) as f:
            text = f.read()
        for var, (entries, width, bits, values) in _GRID_SPECS.items():
            body = re.search(r"%s\[\]\s*=\s*((?:\s*\"[0-9a-f]*\")+);" % var, text).group(1)
            raw = bytes.fromhex("".join(re.findall(r"\"([0-9a-f]*)\"", body)))
            codes = []
            for byte in raw:
                if bits == 2:
                    codes += [(byte >> s) & 3 for s in (0, 2, 4, 6)]
                else:
                    codes += [byte & 0xF, byte >> 4]
            g = np.array([values[c] for c in codes], np.int64).reshape(entries, width)
            _grids[var] = g
    return _grids[name]


# ---------------------------------------------------------------- 32-element blocks (§3.2)

def _nibbles(qs):
    return (qs & 0xF).astype(np.int64), (qs >> 4).astype(np.int64)


def dq_q4_0(b):
    d = _half(b, 0)
    lo, hi = _nibbles(b[:, 2:18])
    return np.concatenate([_f(lo - 8) * d, _f(hi - 8) * d], axis=1)


def dq_q4_1(b):
    d, m = _half(b, 0), _half(b, 2)
    lo, hi = _nibbles(b[:, 4:20])
    return np.concatenate([_f(lo) * d + m, _f(hi) * d + m], axis=1)


def _q5(b, qh_off, qs_off):
    qh = _u32(b, qh_off)[:, None].astype(np.int64)
    j = np.arange(16)
    lo, hi = _nibbles(b[:, qs_off:qs_off + 16])
    return lo | (((qh >> j) & 1) << 4), hi | (((qh >> (j + 16)) & 1) << 4)


def dq_q5_0(b):
    d = _half(b, 0)
    lo, hi = _q5(b, 2, 6)
    return np.concatenate([_f(lo - 16) * d, _f(hi - 16) * d], axis=1)


def dq_q5_1(b):
    d, m = _half(b, 0), _half(b, 2)
    lo, hi = _q5(b, 4, 8)
    return np.concatenate([_f(lo) * d + m, _f(hi) * d + m], axis=1)


def dq_q8_0(b):
    return _f(b[:, 2:34].view(np.int8)) * _half(b, 0)


def dq_iq4_nl(b):
    d = _half(b, 0)
    lo, hi = _nibbles(b[:, 2:18])
    return np.concatenate([d * _f(KVALUES_IQ4NL[lo]), d * _f(KVALUES_IQ4NL[hi])], axis=1)


def dq_mxfp4(b):
    d = e8m0_half(b[:, 0])[:, None]
    lo, hi = _nibbles(b[:, 1:17])
    return np.concatenate([_f(KVALUES_FP4[lo]) * d, _f(KVALUES_FP4[hi]) * d], axis=1)


def dq_nvfp4(b):
    parts = []
    for s in range(4):
        ds = ue4m3(b[:, s])[:, None]
        lo, hi = _nibbles(b[:, 4 + 8 * s:12 + 8 * s])
        parts += [_f(KVALUES_FP4[lo]) * ds, _f(KVALUES_FP4[hi]) * ds]
    return np.concatenate(parts, axis=1)


def dq_q1_0(b):
    d = _half(b, 0)
    j = np.arange(128)
    bit = (b[:, 2 + j // 8] >> (j % 8)) & 1
    return _neg_where(np.broadcast_to(d, bit.shape), bit == 0)


def dq_q2_0(b):
    d = _half(b, 0)
    j = np.arange(64)
    q = (b[:, 2 + j // 4].astype(np.int64) >> (2 * (j % 4))) & 3
    return _f(q - 1) * d


# ---------------------------------------------------------------- K-quants (§3.3)

def _two_bit_walk(qs):
    """Q2_K/Q3_K element order: halves h, shifts j, then two groups of 16.
    Yields (h, j, g, q[nb, 16], l-offset of the group within its half)."""
    for h in range(2):
        for j in range(4):
            for g in range(2):
                q = (qs[:, 32 * h + 16 * g:32 * h + 16 * g + 16].astype(np.int64) >> (2 * j)) & 3
                yield h, j, g, q


def dq_q2_k(b):
    d, dmin = _half(b, 80), _half(b, 82)
    out = []
    for h, j, g, q in _two_bit_walk(b[:, 16:80]):
        sc = b[:, 8 * h + 2 * j + g].astype(np.int64)[:, None]
        dl = d * _f(sc & 0xF)
        ml = dmin * _f(sc >> 4)
        out.append(dl * _f(q) - ml)
    return np.concatenate(out, axis=1)


def q3_k_scales(sb):
    """The 16 signed six-bit Q3_K scales from the 12 scale bytes (spec formula)."""
    sb = sb.astype(np.int64)
    out = []
    for i in range(16):
        low4 = (sb[:, i] & 0xF) if i < 8 else (sb[:, i - 8] >> 4)
        high2 = (sb[:, 8 + i % 4] >> (2 * (i // 4))) & 3
        out.append((low4 | (high2 << 4)) - 32)
    return np.stack(out, axis=1)


def dq_q3_k(b):
    d = _half(b, 108)
    sc = q3_k_scales(b[:, 96:108])
    hmask = b[:, 0:32].astype(np.int64)
    out = []
    for h, j, g, q in _two_bit_walk(b[:, 32:96]):
        dl = d * _f(sc[:, 8 * h + 2 * j + g:8 * h + 2 * j + g + 1])
        hbit = (hmask[:, 16 * g:16 * g + 16] >> (4 * h + j)) & 1
        out.append(dl * _f(q - np.where(hbit == 1, 0, 4)))
    return np.concatenate(out, axis=1)


def scale_min_k4(sb, j):
    sb = sb.astype(np.int64)
    if j < 4:
        return sb[:, j] & 63, sb[:, j + 4] & 63
    return (sb[:, j + 4] & 0xF) | ((sb[:, j - 4] >> 6) << 4), (sb[:, j + 4] >> 4) | ((sb[:, j] >> 6) << 4)


def _q45_k(b, qs_off, qh):
    d, dmin = _half(b, 0), _half(b, 2)
    out = []
    for c in range(4):
        qs = b[:, qs_off + 32 * c:qs_off + 32 * c + 32].astype(np.int64)
        for part in range(2):
            sc, m = scale_min_k4(b[:, 4:16], 2 * c + part)
            q = (qs & 0xF) if part == 0 else (qs >> 4)
            if qh is not None:
                q = q + ((qh >> (2 * c + part)) & 1) * 16
            out.append((d * _f(sc[:, None])) * _f(q) - dmin * _f(m[:, None]))
    return np.concatenate(out, axis=1)


def dq_q4_k(b):
    return _q45_k(b, 16, None)


def dq_q5_k(b):
    return _q45_k(b, 48, b[:, 16:48].astype(np.int64))


def dq_q6_k(b):
    d = _half(b, 208)
    sc = b[:, 192:208].view(np.int8).astype(np.int64)
    y = np.zeros((b.shape[0], 256), F32)
    for h in range(2):
        ql = b[:, 64 * h:64 * h + 64].astype(np.int64)
        qh = b[:, 128 + 32 * h:160 + 32 * h].astype(np.int64)
        for l in range(32):
            is_ = l // 16
            quads = [
                ((ql[:, l] & 0xF) | (((qh[:, l] >> 0) & 3) << 4)) - 32,
                ((ql[:, l + 32] & 0xF) | (((qh[:, l] >> 2) & 3) << 4)) - 32,
                ((ql[:, l] >> 4) | (((qh[:, l] >> 4) & 3) << 4)) - 32,
                ((ql[:, l + 32] >> 4) | (((qh[:, l] >> 6) & 3) << 4)) - 32,
            ]
            for k, q in enumerate(quads):
                y[:, 128 * h + l + 32 * k] = (d[:, 0] * _f(sc[:, 8 * h + is_ + 2 * k])) * _f(q)
    return y


def dq_q8_k(b):
    d = b[:, 0:4].copy().view(F32)
    return d * _f(b[:, 4:260].view(np.int8))


def dq_iq4_xs(b):
    d = _half(b, 0)
    sh = _u16(b, 2).astype(np.int64)
    out = []
    for ib in range(8):
        ls = ((b[:, 4 + ib // 2].astype(np.int64) >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)
        dl = d * _f(ls[:, None] - 32)
        lo, hi = _nibbles(b[:, 8 + 16 * ib:24 + 16 * ib])
        out += [dl * _f(KVALUES_IQ4NL[lo]), dl * _f(KVALUES_IQ4NL[hi])]
    return np.concatenate(out, axis=1)


def dq_tq2_0(b):
    d = _half(b, 64)
    out = []
    for j in (0, 32):
        for l in range(4):
            q = (b[:, j:j + 32].astype(np.int64) >> (2 * l)) & 3
            out.append(_f(q - 1) * d)
    return np.concatenate(out, axis=1)


def dq_tq1_0(b):
    d = _half(b, 52)
    pow3 = [1, 3, 9, 27, 81, 243]
    out = []
    for lo, hi, digits in ((0, 32, 5), (32, 48, 5), (48, 52, 4)):
        for n in range(digits):
            q = (b[:, lo:hi].astype(np.int64) * pow3[n]) & 0xFF  # uint8 arithmetic wraps
            trit = (q * 3) >> 8
            out.append(_f(trit - 1) * d)
    return np.concatenate(out, axis=1)


# ---------------------------------------------------------------- IQ grids (§3.4)

def _signed_grid(db, g, signs):
    """db[nb,1] * grid bytes g[nb,8], negated where bit j of signs[nb] is set."""
    v = db * _f(g)
    neg = ((signs[:, None] >> np.arange(g.shape[1])) & 1) == 1
    return _neg_where(v, neg)


def dq_iq2_xxs(b):
    d = _half(b, 0)
    gr = grid("kIq2xxsHex")
    out = []
    for ib in range(8):
        a0, a1 = _u32(b, 2 + 8 * ib).astype(np.int64), _u32(b, 6 + 8 * ib).astype(np.int64)
        db = d * (F32(0.5) + _f(a1 >> 28)[:, None]) * F32(0.25)
        for l in range(4):
            out.append(_signed_grid(db, gr[(a0 >> (8 * l)) & 0xFF], KSIGNS[(a1 >> (7 * l)) & 127]))
    return np.concatenate(out, axis=1)


def _iq2_scales(b, off, ib):
    s = b[:, off + ib].astype(np.int64)
    return (F32(0.5) + _f(s & 0xF)[:, None]), (F32(0.5) + _f(s >> 4)[:, None])


def dq_iq2_xs(b):
    d = _half(b, 0)
    gr = grid("kIq2xsHex")
    out = []
    for ib in range(8):
        s0, s1 = _iq2_scales(b, 66, ib)
        db = (d * s0 * F32(0.25), d * s1 * F32(0.25))
        for l in range(4):
            w = _u16(b, 2 + 2 * (4 * ib + l)).astype(np.int64)
            out.append(_signed_grid(db[l // 2], gr[w & 511], KSIGNS[w >> 9]))
    return np.concatenate(out, axis=1)


def dq_iq2_s(b):
    d = _half(b, 0)
    gr = grid("kIq2sHex")
    out = []
    for ib in range(8):
        s0, s1 = _iq2_scales(b, 74, ib)
        db = (d * s0 * F32(0.25), d * s1 * F32(0.25))
        qh = b[:, 66 + ib].astype(np.int64)
        for l in range(4):
            idx = b[:, 2 + 4 * ib + l].astype(np.int64) | ((qh << (8 - 2 * l)) & 0x300)
            out.append(_signed_grid(db[l // 2], gr[idx], b[:, 34 + 4 * ib + l].astype(np.int64)))
    return np.concatenate(out, axis=1)


def dq_iq3_xxs(b):
    d = _half(b, 0)
    gr = grid("kIq3xxsHex")
    out = []
    for ib in range(8):
        a = _u32(b, 66 + 4 * ib).astype(np.int64)
        db = d * (F32(0.5) + _f(a >> 28)[:, None]) * F32(0.5)
        for l in range(4):
            g = np.concatenate([gr[b[:, 2 + 8 * ib + 2 * l]], gr[b[:, 2 + 8 * ib + 2 * l + 1]]], axis=1)
            out.append(_signed_grid(db, g, KSIGNS[(a >> (7 * l)) & 127]))
    return np.concatenate(out, axis=1)


def dq_iq3_s(b):
    d = _half(b, 0)
    gr = grid("kIq3sHex")
    out = []
    for p in range(4):
        sc = b[:, 106 + p].astype(np.int64)
        dbs = (d * _f(1 + 2 * (sc & 0xF))[:, None], d * _f(1 + 2 * (sc >> 4))[:, None])
        for half in range(2):
            blk = 2 * p + half
            qh = b[:, 66 + blk].astype(np.int64)
            for l in range(4):
                i1 = b[:, 2 + 8 * blk + 2 * l].astype(np.int64) | ((qh << (8 - 2 * l)) & 256)
                i2 = b[:, 2 + 8 * blk + 2 * l + 1].astype(np.int64) | ((qh << (7 - 2 * l)) & 256)
                g = np.concatenate([gr[i1], gr[i2]], axis=1)
                out.append(_signed_grid(dbs[half], g, b[:, 74 + 4 * blk + l].astype(np.int64)))
    return np.concatenate(out, axis=1)


def dq_iq1_s(b):
    d = _half(b, 0)
    gr = grid("kIq1sHex")
    out = []
    for ib in range(8):
        qh = _u16(b, 34 + 2 * ib).astype(np.int64)
        dl = d * _f(2 * ((qh >> 12) & 7) + 1)[:, None]
        delta = np.where(qh & 0x8000, F32(-0.125), F32(0.125)).astype(F32)[:, None]
        for l in range(4):
            idx = b[:, 2 + 4 * ib + l].astype(np.int64) | (((qh >> (3 * l)) & 7) << 8)
            out.append(dl * (_f(gr[idx]) + delta))
    return np.concatenate(out, axis=1)


def dq_iq1_m(b):
    sc = [_u16(b, 48 + 2 * k).astype(np.int64) for k in range(4)]
    d16 = (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)
    d = f16_to_f32(d16.astype(np.uint16))[:, None]
    gr = grid("kIq1sHex")
    out = []
    for ib in range(8):
        s = sc[ib // 2]
        dl1 = d * _f(2 * ((s >> (6 * (ib % 2))) & 7) + 1)[:, None]
        dl2 = d * _f(2 * ((s >> (6 * (ib % 2) + 3)) & 7) + 1)[:, None]
        qs = b[:, 4 * ib:4 * ib + 4].astype(np.int64)
        qh0, qh1 = b[:, 32 + 2 * ib].astype(np.int64), b[:, 33 + 2 * ib].astype(np.int64)
        idx = [qs[:, 0] | ((qh0 << 8) & 0x700), qs[:, 1] | ((qh0 << 4) & 0x700),
               qs[:, 2] | ((qh1 << 8) & 0x700), qs[:, 3] | ((qh1 << 4) & 0x700)]
        bits = [qh0 & 0x08, qh0 & 0x80, qh1 & 0x08, qh1 & 0x80]
        for k in range(4):
            delta = np.where(bits[k] != 0, F32(-0.125), F32(0.125)).astype(F32)[:, None]
            out.append((dl1 if k < 2 else dl2) * (_f(gr[idx[k]]) + delta))
    return np.concatenate(out, axis=1)


# ---------------------------------------------------------------- plain element types

def _plain(dtype, conv=None):
    def dq(b):
        v = b.copy().view(dtype)
        return conv(v) if conv else v.astype(F32)
    return dq


# name: (block size, type size, decoder)
TYPES = {
    "F32": (1, 4, _plain(np.dtype("<u4"), lambda v: v.view(F32))),
    "F16": (1, 2, _plain(np.dtype("<u2"), f16_to_f32)),
    "BF16": (1, 2, _plain(np.dtype("<u2"), bf16_to_f32)),
    "F64": (1, 8, _plain(np.dtype("<f8"))),
    "I8": (1, 1, _plain(np.int8)),
    "I16": (1, 2, _plain(np.dtype("<i2"))),
    "I32": (1, 4, _plain(np.dtype("<i4"))),
    "I64": (1, 8, _plain(np.dtype("<i8"))),
    "Q4_0": (32, 18, dq_q4_0),
    "Q4_1": (32, 20, dq_q4_1),
    "Q5_0": (32, 22, dq_q5_0),
    "Q5_1": (32, 24, dq_q5_1),
    "Q8_0": (32, 34, dq_q8_0),
    "IQ4_NL": (32, 18, dq_iq4_nl),
    "MXFP4": (32, 17, dq_mxfp4),
    "NVFP4": (64, 36, dq_nvfp4),
    "Q1_0": (128, 18, dq_q1_0),
    "Q2_0": (64, 18, dq_q2_0),
    "Q2_K": (256, 84, dq_q2_k),
    "Q3_K": (256, 110, dq_q3_k),
    "Q4_K": (256, 144, dq_q4_k),
    "Q5_K": (256, 176, dq_q5_k),
    "Q6_K": (256, 210, dq_q6_k),
    "Q8_K": (256, 292, dq_q8_k),
    "IQ4_XS": (256, 136, dq_iq4_xs),
    "TQ1_0": (256, 54, dq_tq1_0),
    "TQ2_0": (256, 66, dq_tq2_0),
    "IQ2_XXS": (256, 66, dq_iq2_xxs),
    "IQ2_XS": (256, 74, dq_iq2_xs),
    "IQ2_S": (256, 82, dq_iq2_s),
    "IQ3_XXS": (256, 98, dq_iq3_xxs),
    "IQ3_S": (256, 110, dq_iq3_s),
    "IQ1_S": (256, 50, dq_iq1_s),
    "IQ1_M": (256, 56, dq_iq1_m),
}

# Byte offsets of each type's fp16 scale fields (IQ1_M's is split; see below).
HALF_SCALES = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,), "Q1_0": (0,),
    "Q2_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,),
    "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
}


def set_iq1_m_scale(block, h):
    """Writes fp16 bits `h` into an IQ1_M block's four split nibbles (the top
    nibble of each uint16 scale word at bytes 48..55)."""
    for k in range(4):
        word = block[48 + 2 * k] | (block[49 + 2 * k] << 8)
        word = (word & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
        block[48 + 2 * k], block[49 + 2 * k] = word & 0xFF, word >> 8


def dequantize(type_name, raw):
    """Decodes a flat uint8 array of whole blocks to a flat float32 array."""
    blck, size, fn = TYPES[type_name]
    b = np.ascontiguousarray(np.asarray(raw, dtype=np.uint8).reshape(-1, size))
    return np.ascontiguousarray(fn(b), dtype=F32).reshape(-1)

"""The fused Triton kernels of the LMN's recurrence (:mod:`linmem.ops.gpu` launches them).

A module of its own because Triton decides when a kernel is defined whether it is compiled or
run by its interpreter (``TRITON_INTERPRET``): :func:`linmem.ops.gpu.kernels` loads this file once
per mode.
"""

import triton
import triton.language as tl

__all__ = ["backward", "forward"]

SELU_SCALE = tl.constexpr(1.0507009873554804934193349852946)
SELU_ALPHA = tl.constexpr(1.6732632423543772848170429916717)

@triton.jit
def activate(a, ACT: tl.constexpr):
    if ACT == 0:  # tanh, from exp for range: 1 - 2 / (exp(2a) + 1)
        out = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    elif ACT == 1:
        out = tl.maximum(a, 0.0)
    else:
        out = tl.where(a > 0, SELU_SCALE * a, (SELU_SCALE * SELU_ALPHA) * (tl.exp(a) - 1.0))
    return out

@triton.jit
def slope(h, ACT: tl.constexpr):
    """sigma'(a) from h = sigma(a) (ops.activation_grad)."""
    if ACT == 0:
        out = 1.0 - h * h
    elif ACT == 1:
        out = tl.where(h > 0, 1.0, 0.0)
    else:
        out = tl.where(h > 0, SELU_SCALE, h + SELU_SCALE * SELU_ALPHA)
    return out

@triton.jit
def rows_times(acc, a_ptr, a_sb, rows, row_ok, K, w_ptr, w_sk, w_sn, n, n_ok,
               BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, USE_DOT: tl.constexpr):
    """acc + A[rows, :K] @ W[:K, n], W's element (k, n) at w_ptr + k w_sk + n w_sn: by
    ``tl.dot`` (a tile of 16 rows or more), or for a few rows by products summed over k
    (``USE_DOT`` False; ``tl.dot`` would pad them to 16)."""
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        a = tl.load(a_ptr + rows[:, None] * a_sb + k[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + k[:, None] * w_sk + n[None, :] * w_sn,
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if USE_DOT:
            acc += tl.dot(a, w, input_precision=PRECISION)
        else:
            acc += tl.sum(a[:, :, None] * w[None, :, :], axis=1)
    return acc


# no specialisation of sizes and strides that equal 1: the branches and loops below assign
# them to one variable, whose type must not depend on the call
_SIZES = ["T", "B", "H", "M"]


@triton.jit(do_not_specialize=[*_SIZES, "sxt", "sxb", "sm0b", "sht", "shb", "smt", "smb"])
def forward(x_ptr, m0_ptr, wmh_ptr, whm_ptr, wmm_ptr, bm_ptr, hs_ptr, ms_ptr,
            T, B, H, M, sxt, sxb, sm0b, sht, shb, smt, smb,
            ACT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, USE_DOT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    prev_ptr = m0_ptr  # m_{t-1}: m0, then the row of ms written one step before
    prev_sb = tl.cast(sm0b, tl.int64)
    for t in range(0, T):
        t64 = tl.cast(t, tl.int64)
        x_t = x_ptr + t64 * sxt
        h_t = hs_ptr + t64 * sht
        m_t = ms_ptr + t64 * smt
        for n0 in range(0, H, BLOCK_N):  # (6): W^mh^T[k, n] = W^mh[n, k], W^mh (H, M)
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < H
            ok = row_ok[:, None] & n_ok[None, :]
            acc = tl.load(x_t + rows[:, None] * sxb + n[None, :], mask=ok, other=0.0)
            acc = rows_times(acc, prev_ptr, prev_sb, rows, row_ok, M, wmh_ptr, 1, M, n, n_ok,
                             BLOCK_K, PRECISION, USE_DOT)
            tl.store(h_t + rows[:, None] * shb + n[None, :], activate(acc, ACT), mask=ok)
        tl.debug_barrier()  # h_t complete before (7) reads it
        for n0 in range(0, M, BLOCK_N):  # (7): W^mm (M, M), W^hm (M, H)
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < M
            ok = row_ok[:, None] & n_ok[None, :]
            bias = tl.load(bm_ptr + n, mask=n_ok, other=0.0)
            acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32) + bias[None, :]
            acc = rows_times(acc, prev_ptr, prev_sb, rows, row_ok, M, wmm_ptr, 1, M, n, n_ok,
                             BLOCK_K, PRECISION, USE_DOT)
            acc = rows_times(acc, h_t, shb, rows, row_ok, H, whm_ptr, 1, H, n, n_ok,
                             BLOCK_K, PRECISION, USE_DOT)
            tl.store(m_t + rows[:, None] * smb + n[None, :], acc, mask=ok)
        tl.debug_barrier()  # m_t complete before the next step reads it
        prev_ptr = m_t
        prev_sb = tl.cast(smb, tl.int64)

@triton.jit(do_not_specialize=[*_SIZES, "sght", "sghb", "sgmt", "sgmb", "sht", "shb", "sgt",
                               "sgb", "sg0b"])
def backward(ghs_ptr, gms_ptr, hs_ptr, wmh_ptr, whm_ptr, wmm_ptr, g_ptr, gm0_ptr,
             T, B, H, M, sght, sghb, sgmt, sgmb, sht, shb, sgt, sgb, sg0b,
             HAS_GH: tl.constexpr, HAS_GM: tl.constexpr, ACT: tl.constexpr,
             BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             PRECISION: tl.constexpr, USE_DOT: tl.constexpr):
    """g (T, B, H + M): [da_t, dm_t] per step; g[T - 1, :, H:] holds dL/dm_{T-1} on entry."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    for i in range(0, T):
        t = T - 1 - i
        t64 = tl.cast(t, tl.int64)
        g_t = g_ptr + t64 * sgt
        dm_t = g_t + H
        for n0 in range(0, H, BLOCK_N):  # da_t = (dL/dh_t + dm_t W^hm) * sigma'
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < H
            ok = row_ok[:, None] & n_ok[None, :]
            if HAS_GH:
                acc = tl.load(ghs_ptr + t64 * sght + rows[:, None] * sghb + n[None, :],
                              mask=ok, other=0.0)
            else:
                acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            acc = rows_times(acc, dm_t, sgb, rows, row_ok, M, whm_ptr, H, 1, n, n_ok,
                             BLOCK_K, PRECISION, USE_DOT)
            h = tl.load(hs_ptr + t64 * sht + rows[:, None] * shb + n[None, :], mask=ok,
                        other=0.0)
            tl.store(g_t + rows[:, None] * sgb + n[None, :], acc * slope(h, ACT), mask=ok)
        tl.debug_barrier()  # da_t complete
        if t > 0:  # dm_{t-1} into g[t - 1, :, H:], else dL/dm0
            out_ptr = g_t - sgt + H
            out_sb = tl.cast(sgb, tl.int64)
            gm_prev = gms_ptr + (t64 - 1) * sgmt
            gm_rows = B
        else:
            out_ptr = gm0_ptr
            out_sb = tl.cast(sg0b, tl.int64)
            gm_prev = gms_ptr
            gm_rows = B - B  # dL/dm0 has no term of its own
        for n0 in range(0, M, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < M
            ok = row_ok[:, None] & n_ok[None, :]
            if HAS_GM:
                acc = tl.load(gm_prev + rows[:, None] * sgmb + n[None, :],
                              mask=ok & (rows < gm_rows)[:, None], other=0.0)
            else:
                acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
            acc = rows_times(acc, g_t, sgb, rows, row_ok, H, wmh_ptr, M, 1, n, n_ok,
                             BLOCK_K, PRECISION, USE_DOT)
            acc = rows_times(acc, dm_t, sgb, rows, row_ok, M, wmm_ptr, M, 1, n, n_ok,
                             BLOCK_K, PRECISION, USE_DOT)
            tl.store(out_ptr + rows[:, None] * out_sb + n[None, :], acc, mask=ok)
        tl.debug_barrier()  # dm_{t-1} complete before the next step reads it

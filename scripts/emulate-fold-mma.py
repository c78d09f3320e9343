#!/usr/bin/env python3
# A CPU check of FoldRelPosMmaKernel's index math (kernels/encoder_fusion.cu), written in the eighth
# session when no GPU could be had to run the kernel: one CTA's loader, ldmatrix addresses, mma
# fragments and write-out transcribed from the kernel and run on the fragment layouts documented in
# kernels/mma_sync.cuh (PTX ISA), in float64, against the direct formula of the terms. It checks that
# transcription's indices, not the compiled kernel: the GPU test (kernels_fusion_gpu_test's
# FoldRelPosQKMatchesTheReference with MASKD_FOLD_MMA=1) does that. Keep the two in step if the kernel
# changes.   .venv/bin/python scripts/emulate-fold-mma.py
import numpy as np
rng = np.random.default_rng(0)

def ldmatrix_x4(smem_flat, addrs):
    # addrs[lane] = flat index of a row start (8 elements); lane l receives, for matrix i, the pair
    # (row l/4, cols 2(l%4), 2(l%4)+1) of matrix i whose rows are given by lanes 8i..8i+7.
    regs = np.zeros((32, 4, 2))
    for i in range(4):
        rows = [smem_flat[addrs[8 * i + r]: addrs[8 * i + r] + 8] for r in range(8)]
        for l in range(32):
            g, t = l // 4, l % 4
            regs[l, i] = rows[g][2 * t: 2 * t + 2]
    return regs

def mma(acc, a, b0, b1):
    # a[lane][4][2], b0/b1[lane][2]; acc[lane][4]
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for l in range(32):
        g, t = l // 4, l % 4
        A[g, 2*t:2*t+2] = a[l, 0]; A[g+8, 2*t:2*t+2] = a[l, 1]
        A[g, 2*t+8:2*t+10] = a[l, 2]; A[g+8, 2*t+8:2*t+10] = a[l, 3]
        B[2*t:2*t+2, g] = b0[l]; B[2*t+8:2*t+10, g] = b1[l]
    C = A @ B
    for l in range(32):
        g, t = l // 4, l % 4
        acc[l, 0] += C[g, 2*t]; acc[l, 1] += C[g, 2*t+1]; acc[l, 2] += C[g+8, 2*t]; acc[l, 3] += C[g+8, 2*t+1]

def run(g, D, y):
    P = D + 8
    q = rng.standard_normal((g, D)); rev = rng.standard_normal((2 * (2 * g - 1), D))
    smem_q = np.zeros((64, P)); smem_tb = np.zeros((192, P))
    for r in range(64 + 192):  # the cp.async loader
        if r < 64:
            if r < g: smem_q[r, :D] = q[r]
        elif r < 128:
            kh = r - 64
            if kh < g: smem_tb[kh, :D] = rev[g - 1 - y + kh]
        else:
            j = r - 128
            if j < 2 * g - 1: smem_tb[64 + j, :D] = rev[2 * g - 1 + j]
    qs = smem_q.ravel(); tb = smem_tb.ravel()
    rel = np.full((g, 2 * g), np.nan); stage = np.full((64, 136), np.nan)
    KS = D // 16
    for warp in range(8):
        m0 = (warp % 4) * 16; nt0 = (warp // 4) * 12
        af = [ldmatrix_x4(qs, [(m0 + (l % 8) + 8 * ((l // 8) % 2)) * P + ks * 16 + 8 * (l // 16) for l in range(32)])
              for ks in range(KS)]
        for p in range(6):
            n0 = (nt0 + 2 * p) * 8
            acc = np.zeros((2, 32, 4))
            for ks in range(KS):
                bf = ldmatrix_x4(tb, [(n0 + 8 * (l // 16) + (l % 8)) * P + ks * 16 + 8 * ((l // 8) % 2) for l in range(32)])
                mma(acc[0], af[ks], bf[:, 0], bf[:, 1])
                mma(acc[1], af[ks], bf[:, 2], bf[:, 3])
            for l in range(32):
                gr, tc = l // 4, 2 * (l % 4)
                for e in range(2):
                    col = n0 + 8 * e + tc
                    for half in range(2):
                        x = m0 + gr + 8 * half
                        v = acc[e, l, 2 * half: 2 * half + 2]
                        if col < 64:
                            if x < g and col < g: rel[x, col:col + 2] = v
                        else:
                            stage[x, col - 64: col - 62] = v
    for x in range(g):
        for kw in range(g):
            rel[x, g + kw] = stage[x, g - 1 - x + kw]
    # Direct: rel_h[x][kh] = q_x . rev[g-1-y+kh]; rel_w[x][kw] = q_x . rev[2g-1 + g-1-x+kw]
    ref = np.zeros((g, 2 * g))
    for x in range(g):
        for k in range(g):
            ref[x, k] = q[x] @ rev[g - 1 - y + k]
            ref[x, g + k] = q[x] @ rev[2 * g - 1 + g - 1 - x + k]
    err = np.nanmax(np.abs(rel - ref)); nans = np.isnan(rel).sum()
    print(f"g {g} D {D} y {y}: max err {err:.2e}, unset {nans}")
    assert err < 1e-9 and nans == 0

for g, D, y in [(64, 64, 0), (64, 64, 37), (64, 80, 63), (16, 64, 5), (40, 80, 39)]:
    run(g, D, y)

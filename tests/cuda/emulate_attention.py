# Lane-level emulation of the attention kernels of src/cuda (no GPU needed): the tensor-core kernels
# (attention_mma.cu, attention_mma_bwd.cu, with mma_bf16.cuh's mma.sync and ldmatrix fragment
# layouts written out from the PTX ISA) and the scalar-tile kernels (attention.cu), each transcribed
# line by line in fp64 without bf16 rounding, against a plain attention: their indexing, masks, loops
# and block bookkeeping give the reference to ~1e-15 (a race or a wrong barrier is not modelled:
# compute-sanitizer racecheck on the GPU checks those). Keep in step with the kernels.
#   /usr/bin/python3 tests/cuda/emulate_attention.py     (about half a minute; one line per shape)
import numpy as np
lane = np.arange(32); G = lane // 4; Tq = lane % 4
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453  # the tensor-core kernels' softmax runs in base 2

def mma(c, a, b0, b1):
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    A[G, 2*Tq] = a[0][:, 0]; A[G, 2*Tq+1] = a[0][:, 1]
    A[G+8, 2*Tq] = a[1][:, 0]; A[G+8, 2*Tq+1] = a[1][:, 1]
    A[G, 2*Tq+8] = a[2][:, 0]; A[G, 2*Tq+9] = a[2][:, 1]
    A[G+8, 2*Tq+8] = a[3][:, 0]; A[G+8, 2*Tq+9] = a[3][:, 1]
    B[2*Tq, G] = b0[:, 0]; B[2*Tq+1, G] = b0[:, 1]
    B[2*Tq+8, G] = b1[:, 0]; B[2*Tq+9, G] = b1[:, 1]
    D = A @ B
    c[:, 0] += D[G, 2*Tq]; c[:, 1] += D[G, 2*Tq+1]; c[:, 2] += D[G+8, 2*Tq]; c[:, 3] += D[G+8, 2*Tq+1]

def pack(lo, hi): return np.stack([lo, hi], axis=1)

def ldmatrix(tile, addr, nmat, trans=False):
    # PTX ldmatrix .m8n8 .b16: lanes 8i..8i+7 give the row start addresses (element indices) of matrix
    # i; lane 4g+t gets in register i row g's elements 2t, 2t+1 (trans: column g's, rows 2t, 2t+1).
    regs = []
    for i in range(nmat):
        rows = addr[8*i:8*i+8]
        Mi = np.array([[tile[rows[r] + c] for c in range(8)] for r in range(8)])
        if trans: Mi = Mi.T
        regs.append(np.stack([Mi[G, 2*Tq], Mi[G, 2*Tq+1]], axis=1))
    return regs

def load_a(tile, ld, row0, col0):
    i = lane // 8
    return ldmatrix(tile, (row0 + lane % 8 + 8*(i & 1))*ld + col0 + 8*(i >> 1), 4)

def a_from_c(c0, c1):
    return [pack(c0[:, 0], c0[:, 1]), pack(c0[:, 2], c0[:, 3]), pack(c1[:, 0], c1[:, 1]), pack(c1[:, 2], c1[:, 3])]

def mma_rows_t(c, a, M, ld, n0, k0):
    b0, b1 = ldmatrix(M, (n0 + lane % 8)*ld + k0 + 8*((lane // 8) & 1), 2)
    mma(c, a, b0, b1)

def mma_rows(c, a, M, ld, k0, n0):
    b0, b1 = ldmatrix(M, (k0 + lane % 8 + 8*((lane // 8) & 1))*ld + n0, 2, trans=True)
    mma(c, a, b0, b1)

def load_tile(src, off, ld, r0, rows, T, HD):
    LD = HD + 8
    dst = np.full(rows * LD, np.nan)  # the padding is never read: NaN would show
    for r in range(rows):
        dst[r*LD:r*LD+HD] = src[off + (r0+r)*ld: off + (r0+r)*ld + HD] if r0 + r < T else 0.0
    return dst

def add_rows(dst, base, ld, row_a, T, scale, acc, HD):
    for i in range(2):
        row = row_a + 8*i
        for nt in range(HD // 8):
            for L in range(32):
                if row[L] >= T: continue
                idx = base + row[L]*ld + 2*Tq[L] + 8*nt
                dst[idx] += scale * acc[nt][L, 2*i]; dst[idx+1] += scale * acc[nt][L, 2*i+1]

def fwd(q, k, v, B, T, H, KV, HD, qs=None, kvs=None):
    LD = HD + 8; kRows = 64; kKeys = 64; scale = 1/np.sqrt(HD)
    out = np.full(B*T*H*HD, np.nan); lse = np.full(B*H*T, np.nan)
    od = H*HD; qd = qs or H*HD; kvd = kvs or KV*HD  # token strides: out packed, q and k / v as given
    nbx = (T + kRows - 1) // kRows
    for b in range(B):
      for h in range(H):
        for bx in range(nbx):
          r0 = (nbx - 1 - bx) * kRows; kvh = h // (H // KV)
          q_off = b*T*qd + h*HD; kv_off = b*T*kvd + kvh*HD
          Qs = load_tile(q, q_off, qd, r0, kRows, T, HD)
          W = []
          for warp in range(4):
            qf = [load_a(Qs, LD, warp*16, 16*kk) for kk in range(HD//16)]
            W.append(dict(qf=qf, o=[np.zeros((32, 4)) for _ in range(HD//8)], m=[np.full(32, -np.inf)]*2, l=[np.zeros(32)]*2))
          last_row = min(r0 + kRows, T) - 1
          c0 = 0
          while c0 <= last_row:
            Ks = load_tile(k, kv_off, kvd, c0, kKeys, T, HD); Vs = load_tile(v, kv_off, kvd, c0, kKeys, T, HD)
            for warp in range(4):
              w = W[warp]; row_a = r0 + warp*16 + G
              s = [np.zeros((32, 4)) for _ in range(kKeys//8)]
              for nt in range(kKeys//8):
                for kk in range(HD//16): mma_rows_t(s[nt], w['qf'][kk], Ks, LD, 8*nt, 16*kk)
              mx = [np.full(32, -np.inf), np.full(32, -np.inf)]
              for nt in range(kKeys//8):
                for e in range(4):
                  key = c0 + 8*nt + 2*Tq + (e & 1); row = row_a + 8*(e >> 1)
                  s[nt][:, e] = np.where((key <= row) & (key < T), s[nt][:, e]*scale*LOG2E, -np.inf)
                  mx[e >> 1] = np.maximum(mx[e >> 1], s[nt][:, e])
              m_new = []; alpha = []
              for i in range(2):
                x = mx[i]; x = np.maximum(x, x[lane ^ 1]); x = np.maximum(x, x[lane ^ 2])
                m_new.append(np.maximum(w['m'][i], x)); alpha.append(np.exp2(w['m'][i] - m_new[i]))
              sm = [np.zeros(32), np.zeros(32)]
              for nt in range(kKeys//8):
                for e in range(4):
                  s[nt][:, e] = np.exp2(s[nt][:, e] - m_new[e >> 1]); sm[e >> 1] = sm[e >> 1] + s[nt][:, e]
              l = []; 
              for i in range(2):
                x = sm[i]; x = x + x[lane ^ 1]; x = x + x[lane ^ 2]
                l.append(w['l'][i]*alpha[i] + x)
              w['l'] = l; w['m'] = m_new
              for nt in range(HD//8):
                w['o'][nt][:, 0] *= alpha[0]; w['o'][nt][:, 1] *= alpha[0]; w['o'][nt][:, 2] *= alpha[1]; w['o'][nt][:, 3] *= alpha[1]
              for kk in range(kKeys//16):
                pa = a_from_c(s[2*kk], s[2*kk+1])
                for nt in range(HD//8): mma_rows(w['o'][nt], pa, Vs, LD, 16*kk, 8*nt)
            c0 += kKeys
          for warp in range(4):
            w = W[warp]; row_a = r0 + warp*16 + G
            for i in range(2):
              row = row_a + 8*i
              for L in range(32):
                if row[L] >= T: continue
                inv = 1/w['l'][i][L]
                for nt in range(HD//8):
                  idx = (b*T + row[L])*od + h*HD + 2*Tq[L] + 8*nt
                  out[idx] = w['o'][nt][L, 2*i]*inv; out[idx+1] = w['o'][nt][L, 2*i+1]*inv
                if Tq[L] == 0: lse[(b*H + h)*T + row[L]] = w['m'][i][L]*LN2 + np.log(w['l'][i][L])
    return out, lse

def score_pair(Ax, Ay, Bx, By, row0, N, HD):
    LD = HD + 8
    x = [np.zeros((32, 4)) for _ in range(N//8)]; y = [np.zeros((32, 4)) for _ in range(N//8)]
    for kk in range(HD//16):
        ax = load_a(Ax, LD, row0, 16*kk); ay = load_a(Ay, LD, row0, 16*kk)
        for nt in range(N//8):
            mma_rows_t(x[nt], ax, Bx, LD, 8*nt, 16*kk); mma_rows_t(y[nt], ay, By, LD, 8*nt, 16*kk)
    return x, y

def accumulate(acc, x, M, N, HD):
    for kk in range(N//16):
        a = a_from_c(x[2*kk], x[2*kk+1])
        for nt in range(HD//8): mma_rows(acc[nt], a, M, HD + 8, 16*kk, 8*nt)

def probs_and_grad(s, dp, valid, scale_log2, lse2, D):
    with np.errstate(invalid='ignore', over='ignore'):
        p = np.where(valid, np.exp2(s*scale_log2 - lse2), 0.0)
        dpn = np.where(valid, p*(dp - D), 0.0)
    return p, dpn

def bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, HD, qs=None, kvs=None):
    scale = 1/np.sqrt(HD); od = H*HD; qd = qs or H*HD; kvd = kvs or KV*HD
    D = np.zeros(B*H*T)
    for b in range(B):
        for t in range(T):
            for h in range(H):
                r = ((b*T + t)*H + h)*HD
                D[(b*H + h)*T + t] = np.dot(dout[r:r+HD], out[r:r+HD])
    # dq kernel
    kQBlock, kKeyTile = 64, 32
    nbx = (T + kQBlock - 1)//kQBlock
    for b in range(B):
      for h in range(H):
        for bx in range(nbx):
          r0 = (nbx - 1 - bx)*kQBlock; kvh = h // (H//KV)
          q_off = b*T*qd + h*HD; kv_off = b*T*kvd + kvh*HD; row_off = (b*H + h)*T
          Qs = load_tile(q, q_off, qd, r0, kQBlock, T, HD); dOs = load_tile(dout, b*T*od + h*HD, od, r0, kQBlock, T, HD)
          accs = [[np.zeros((32, 4)) for _ in range(HD//8)] for _ in range(4)]
          last_row = min(r0 + kQBlock, T) - 1
          c0 = 0
          while c0 <= last_row:
            Ks = load_tile(k, kv_off, kvd, c0, kKeyTile, T, HD); Vs = load_tile(v, kv_off, kvd, c0, kKeyTile, T, HD)
            for warp in range(4):
              row_a = r0 + warp*16 + G
              lse_r = [np.where(row_a + 8*i < T, lse[np.minimum(row_off + row_a + 8*i, len(lse)-1)]*LOG2E, 0) for i in range(2)]
              D_r = [np.where(row_a + 8*i < T, D[np.minimum(row_off + row_a + 8*i, len(D)-1)], 0) for i in range(2)]
              s, dp = score_pair(Qs, dOs, Ks, Vs, warp*16, kKeyTile, HD)
              for nt in range(kKeyTile//8):
                for e in range(4):
                  key = c0 + 8*nt + 2*Tq + (e & 1); row = row_a + 8*(e >> 1)
                  s[nt][:, e], dp[nt][:, e] = probs_and_grad(s[nt][:, e], dp[nt][:, e], (key <= row) & (row < T), scale*LOG2E, lse_r[e >> 1], D_r[e >> 1])
              accumulate(accs[warp], dp, Ks, kKeyTile, HD)
            c0 += kKeyTile
          for warp in range(4): add_rows(dq, q_off, qd, r0 + warp*16 + G, T, scale, accs[warp], HD)
    # dk, dv kernel
    kKeyBlock, kQTile = 64, 32
    for b in range(B):
      for kvh in range(KV):
        for bx in range((T + kKeyBlock - 1)//kKeyBlock):
          c0 = bx*kKeyBlock; group = H // KV; kv_off = b*T*kvd + kvh*HD
          Ks = load_tile(k, kv_off, kvd, c0, kKeyBlock, T, HD); Vs = load_tile(v, kv_off, kvd, c0, kKeyBlock, T, HD)
          acc_k = [[np.zeros((32, 4)) for _ in range(HD//8)] for _ in range(4)]
          acc_v = [[np.zeros((32, 4)) for _ in range(HD//8)] for _ in range(4)]
          for h in range(kvh*group, (kvh+1)*group):
            q_off = b*T*qd + h*HD; row_off = (b*H + h)*T
            r0 = c0
            while r0 < T:
              Qs = load_tile(q, q_off, qd, r0, kQTile, T, HD); dOs = load_tile(dout, b*T*od + h*HD, od, r0, kQTile, T, HD)
              lse_s = np.array([lse[row_off + r0 + i]*LOG2E if r0 + i < T else 0 for i in range(kQTile)])
              D_s = np.array([D[row_off + r0 + i] if r0 + i < T else 0 for i in range(kQTile)])
              for warp in range(4):
                key_a = c0 + warp*16 + G
                st, dpt = score_pair(Ks, Vs, Qs, dOs, warp*16, kQTile, HD)
                for nt in range(kQTile//8):
                  for e in range(4):
                    ql = 8*nt + 2*Tq + (e & 1); query = r0 + ql; key = key_a + 8*(e >> 1)
                    st[nt][:, e], dpt[nt][:, e] = probs_and_grad(st[nt][:, e], dpt[nt][:, e], (query >= key) & (query < T), scale*LOG2E, lse_s[ql], D_s[ql])
                accumulate(acc_v[warp], st, dOs, kQTile, HD); accumulate(acc_k[warp], dpt, Qs, kQTile, HD)
              r0 += kQTile
          for warp in range(4):
            add_rows(dk, kv_off, kvd, c0 + warp*16 + G, T, scale, acc_k[warp], HD)
            add_rows(dv, kv_off, kvd, c0 + warp*16 + G, T, 1.0, acc_v[warp], HD)

def reference(q, k, v, dout, B, T, H, KV, HD):
    q = q.reshape(B, T, H, HD); k = k.reshape(B, T, KV, HD); v = v.reshape(B, T, KV, HD); dO = dout.reshape(B, T, H, HD)
    grp = H // KV; scale = 1/np.sqrt(HD)
    out = np.zeros_like(q); lse = np.zeros((B, H, T)); dq = np.zeros_like(q); dk = np.zeros_like(k); dv = np.zeros_like(v)
    mask = np.tril(np.ones((T, T), bool))
    for b in range(B):
        for h in range(H):
            g = h // grp
            S = q[b, :, h] @ k[b, :, g].T * scale
            S = np.where(mask, S, -np.inf)
            m = S.max(1, keepdims=True); P = np.exp(S - m); l = P.sum(1, keepdims=True)
            lse[b, h] = (m + np.log(l))[:, 0]; P /= l
            out[b, :, h] = P @ v[b, :, g]
            dP = dO[b, :, h] @ v[b, :, g].T
            Dr = (dO[b, :, h] * out[b, :, h]).sum(1, keepdims=True)
            dS = P * (dP - Dr)
            dq[b, :, h] = dS @ k[b, :, g] * scale
            dk[b, :, g] += dS.T @ q[b, :, h] * scale
            dv[b, :, g] += P.T @ dO[b, :, h]
    return out.ravel(), lse.ravel(), dq.ravel(), dk.ravel(), dv.ravel()

# Normalised error; a reference that is zero in exact arithmetic (dq, dk at T 1) counts absolutely.
def rel(a, b): return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1.0)


# ---- the scalar-tile kernels (attention.cu) ----
kTile, kWarps, RPW = 32, 8, 4

def tiles_load_tile(src, off, ld, r0, T, HD, sld):
    dst = np.full(kTile * sld, np.nan)
    for r in range(kTile):
        dst[r*sld:r*sld+HD] = src[off + (r0+r)*ld: off + (r0+r)*ld + HD] if r0 + r < T else 0.0
    return dst

def tiles_warp_dots(A, Bm, warp, HD):
    row0 = warp * RPW
    return [sum(A[(row0+ii)*HD + d] * Bm[lane*(HD+1) + d] for d in range(HD)) for ii in range(RPW)]

def tiles_fwd(q, k, v, B, T, H, KV, HD, qs=None, kvs=None):
    scale = 1/np.sqrt(HD); od = H*HD; qd = qs or H*HD; kvd = kvs or KV*HD
    out = np.full(B*T*H*HD, np.nan); lse = np.full(B*H*T, np.nan)
    nbx = (T + kTile - 1)//kTile
    for b in range(B):
      for h in range(H):
        for bx in range(nbx):
          r0 = (nbx-1-bx)*kTile; g = h // (H//KV)
          Qs = tiles_load_tile(q, b*T*qd + h*HD, qd, r0, T, HD, HD)
          st = [dict(o=np.zeros((RPW, HD//32, 32)), m=np.full(RPW, -np.inf), l=np.zeros(RPW)) for _ in range(kWarps)]
          last_row = min(r0 + kTile, T) - 1
          c0 = 0
          while c0 <= last_row:
            Ks = tiles_load_tile(k, b*T*kvd + g*HD, kvd, c0, T, HD, HD+1); Vs = tiles_load_tile(v, b*T*kvd + g*HD, kvd, c0, T, HD, HD)
            Ps = np.full(kTile*kTile, np.nan)
            for w in range(kWarps):
              S = st[w]; row0 = w*RPW
              s = tiles_warp_dots(Qs, Ks, w, HD)
              for ii in range(RPW):
                s[ii] = np.where(c0 + lane <= r0 + row0 + ii, s[ii]*scale, -np.inf)
                m_new = max(S['m'][ii], s[ii].max())
                p = np.exp(s[ii] - m_new); alpha = np.exp(S['m'][ii] - m_new)
                S['l'][ii] = S['l'][ii]*alpha + p.sum(); S['m'][ii] = m_new
                Ps[(row0+ii)*kTile + lane] = p
                S['o'][ii] *= alpha
              for j in range(kTile):
                for dd in range(HD//32):
                  vj = Vs[j*HD + lane + 32*dd]
                  for ii in range(RPW): S['o'][ii][dd] += Ps[(row0+ii)*kTile + j] * vj
            c0 += kTile
          for w in range(kWarps):
            S = st[w]
            for ii in range(RPW):
              t = r0 + w*RPW + ii
              if t >= T: continue
              base = (b*T + t)*od + h*HD
              for dd in range(HD//32): out[base + lane + 32*dd] = S['o'][ii][dd] / S['l'][ii]
              lse[(b*H + h)*T + t] = S['m'][ii] + np.log(S['l'][ii])
    return out, lse

def tiles_backward_scores(Qs, dOs, Ks, Vs, lse_h, D_h, r0, c0, T, scale, w, HD, Ps, dSs):
    row0 = w*RPW
    s = tiles_warp_dots(Qs, Ks, w, HD); dp = tiles_warp_dots(dOs, Vs, w, HD)
    for ii in range(RPW):
        t = r0 + row0 + ii
        valid = (t < T) & (c0 + lane <= t)
        with np.errstate(over='ignore', invalid='ignore'):
            p = np.where(valid, np.exp(s[ii]*scale - (lse_h[t] if t < T else np.nan)), 0.0)
            Ps[(row0+ii)*kTile + lane] = p
            dSs[(row0+ii)*kTile + lane] = np.where(valid, p*(dp[ii] - (D_h[t] if t < T else np.nan)), 0.0)

def tiles_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, HD, qs=None, kvs=None):
    scale = 1/np.sqrt(HD); od = H*HD; qd = qs or H*HD; kvd = kvs or KV*HD
    D = np.zeros(B*H*T)
    for b in range(B):
        for t in range(T):
            for h in range(H):
                r = ((b*T + t)*H + h)*HD
                D[(b*H + h)*T + t] = np.dot(dout[r:r+HD], out[r:r+HD])
    nb = (T + kTile - 1)//kTile
    for b in range(B):
      for h in range(H):
        for bx in range(nb):
          r0 = (nb-1-bx)*kTile; g = h // (H//KV)
          q_off = b*T*qd + h*HD; kv_off = b*T*kvd + g*HD; row_off = (b*H + h)*T
          Qs = tiles_load_tile(q, q_off, qd, r0, T, HD, HD); dOs = tiles_load_tile(dout, b*T*od + h*HD, od, r0, T, HD, HD)
          acc = np.zeros((kWarps, RPW, HD//32, 32))
          last_row = min(r0 + kTile, T) - 1; c0 = 0
          while c0 <= last_row:
            Ks = tiles_load_tile(k, kv_off, kvd, c0, T, HD, HD+1); Vs = tiles_load_tile(v, kv_off, kvd, c0, T, HD, HD+1)
            Ps = np.full(kTile*kTile, np.nan); dSs = np.full(kTile*kTile, np.nan)
            for w in range(kWarps):
              tiles_backward_scores(Qs, dOs, Ks, Vs, lse[row_off:row_off+T], D[row_off:row_off+T], r0, c0, T, scale, w, HD, Ps, dSs)
              for j in range(kTile):
                for dd in range(HD//32):
                  kj = Ks[j*(HD+1) + lane + 32*dd]
                  for ii in range(RPW): acc[w, ii, dd] += dSs[(w*RPW+ii)*kTile + j] * kj
            c0 += kTile
          for w in range(kWarps):
            for ii in range(RPW):
              t = r0 + w*RPW + ii
              if t >= T: continue
              for dd in range(HD//32): dq[q_off + t*qd + lane + 32*dd] += scale*acc[w, ii, dd]
    for b in range(B):
      for g in range(KV):
        for bx in range(nb):
          c0 = bx*kTile; group = H//KV; kv_off = b*T*kvd + g*HD
          Ks = tiles_load_tile(k, kv_off, kvd, c0, T, HD, HD+1); Vs = tiles_load_tile(v, kv_off, kvd, c0, T, HD, HD+1)
          ak = np.zeros((kWarps, RPW, HD//32, 32)); av = np.zeros_like(ak)
          for h in range(g*group, (g+1)*group):
            q_off = b*T*qd + h*HD; row_off = (b*H + h)*T
            r0 = c0
            while r0 < T:
              Qs = tiles_load_tile(q, q_off, qd, r0, T, HD, HD); dOs = tiles_load_tile(dout, b*T*od + h*HD, od, r0, T, HD, HD)
              Ps = np.full(kTile*kTile, np.nan); dSs = np.full(kTile*kTile, np.nan)
              for w in range(kWarps):
                tiles_backward_scores(Qs, dOs, Ks, Vs, lse[row_off:row_off+T], D[row_off:row_off+T], r0, c0, T, scale, w, HD, Ps, dSs)
              for w in range(kWarps):
                key0 = w*RPW
                for i in range(kTile):
                  for dd in range(HD//32):
                    qi = Qs[i*HD + lane + 32*dd]; doi = dOs[i*HD + lane + 32*dd]
                    for jj in range(RPW):
                      av[w, jj, dd] += Ps[i*kTile + key0 + jj] * doi
                      ak[w, jj, dd] += dSs[i*kTile + key0 + jj] * qi
              r0 += kTile
          for w in range(kWarps):
            for jj in range(RPW):
              j = c0 + w*RPW + jj
              if j >= T: continue
              for dd in range(HD//32):
                dk[kv_off + j*kvd + lane + 32*dd] += scale*ak[w, jj, dd]
                dv[kv_off + j*kvd + lane + 32*dd] += av[w, jj, dd]


# Packed q (B,T,H,HD), k, v (B,T,KV,HD) as the rows of one fused qkv buffer (B,T,(H+2KV)HD), and the
# views the kernels get: q, k, v at offsets 0, H HD, (H+KV) HD of each token row, stride the row.
def fuse(q, k, v, B, T, H, KV, HD):
    W = (H + 2*KV)*HD
    f = np.concatenate([q.reshape(B*T, H*HD), k.reshape(B*T, KV*HD), v.reshape(B*T, KV*HD)], axis=1).ravel()
    return f, (f[0:], f[H*HD:], f[(H+KV)*HD:]), W

def unfuse(f, B, T, H, KV, HD):
    r = f.reshape(B*T, (H + 2*KV)*HD)
    return r[:, :H*HD].ravel(), r[:, H*HD:(H+KV)*HD].ravel(), r[:, (H+KV)*HD:].ravel()

def check(name, fwd_fn, bwd_fn, shapes, seed):
    rng = np.random.default_rng(seed)
    for (B, T, H, KV, HD, fused) in shapes:
        q = rng.standard_normal(B*T*H*HD); k = rng.standard_normal(B*T*KV*HD); v = rng.standard_normal(B*T*KV*HD)
        dout = rng.standard_normal(B*T*H*HD)
        dq0 = rng.standard_normal(q.size); dk0 = rng.standard_normal(k.size); dv0 = rng.standard_normal(v.size)
        ro, rl, rdq, rdk, rdv = reference(q, k, v, dout, B, T, H, KV, HD)
        if fused:  # q, k, v and their gradients inside fused rows
            _, (fq, fk, fv), W = fuse(q, k, v, B, T, H, KV, HD)
            g, (gq, gk, gv), _ = fuse(dq0, dk0, dv0, B, T, H, KV, HD)
            o, l = fwd_fn(fq, fk, fv, B, T, H, KV, HD, W, W)
            bwd_fn(gq, gk, gv, dout, o, l, fq, fk, fv, B, T, H, KV, HD, W, W)
            dq, dk, dv = unfuse(g, B, T, H, KV, HD)
        else:
            o, l = fwd_fn(q, k, v, B, T, H, KV, HD)
            dq, dk, dv = dq0.copy(), dk0.copy(), dv0.copy()
            bwd_fn(dq, dk, dv, dout, o, l, q, k, v, B, T, H, KV, HD)
        errs = [rel(o, ro), rel(l, rl), rel(dq - dq0, rdq), rel(dk - dk0, rdk), rel(dv - dv0, rdv)]
        print(name, (B, T, H, KV, HD), 'fused qkv' if fused else 'packed', 'out %.1e lse %.1e dq %.1e dk %.1e dv %.1e' % tuple(errs), flush=True)
        assert max(errs) < 1e-12, errs


if __name__ == '__main__':
    check('tensor cores', fwd, bwd, [(2, 1, 4, 2, 64, False), (1, 33, 4, 1, 64, False), (1, 70, 4, 2, 64, False),
                                     (1, 130, 2, 2, 64, False), (1, 65, 4, 4, 128, False), (2, 70, 4, 2, 64, True),
                                     (1, 100, 4, 2, 32, False), (1, 45, 4, 1, 32, True)], 0)
    check('scalar tiles', tiles_fwd, tiles_bwd, [(1, 1, 2, 1, 64, False), (2, 33, 4, 2, 64, False), (1, 70, 4, 1, 64, False),
                                                 (1, 40, 2, 2, 128, False), (1, 45, 4, 2, 64, True),
                                                 (1, 70, 4, 2, 32, False), (1, 33, 4, 1, 32, True)], 1)
    print('emulate_attention: every kernel agrees with the reference')

# Lane-level emulation of src/cuda/paged_kv.cu's paged attention (no GPU needed): paged_partial's
# per-lane row layout (kVec elements a lane, kLanes lanes a row, kRows rows a warp), its shuffle
# sums, head batches and scratch indexing, and paged_combine's chunk order, transcribed in fp64
# against a plain softmax attention over each sequence's contiguous cache. Pages are shuffled, the
# sequences' rows of the page tables permuted; scratch, scores and the reduction buffer start as NaN,
# so an entry read before it is written shows. Keep in step with the kernels.
#   /usr/bin/python3 tests/cuda/emulate_paged_kv.py     (a few seconds; one line per shape)
import numpy as np

CHUNK, WARPS, HEAD_BATCH = 256, 4, 4
PT, MAX_PAGES = 16, 40
LENS = [1, 15, 16, 17, 300, 600]
TABLE_ROW = [5, 0, 7, 2, 3, 6]
lane = np.arange(32)


def shfl_xor(x, o):
    return x[lane ^ o]


def slot_offset(table, p, kvd):
    return (table[p // PT] * PT + p % PT) * kvd


def chunk_scores(ps, qs, kpool, g, table, j0, length, hd, kvd, group, scale, vec):
    lanes_per_row = hd // vec
    rows = 32 // lanes_per_row
    sub, slc = lane // lanes_per_row, lane % lanes_per_row
    for warp in range(WARPS):
        jj0 = warp * rows
        while jj0 < length:
            jj = jj0 + sub
            live = jj < length
            kx = np.zeros((32, vec))
            for l in np.nonzero(live)[0]:
                at = g * hd + slot_offset(table, j0 + jj[l], kvd) + slc[l] * vec
                kx[l] = kpool[at:at + vec]
            for hh in range(group):
                s = np.array([qs[hh * hd + slc[l] * vec: hh * hd + slc[l] * vec + vec] @ kx[l] for l in lane])
                o = lanes_per_row // 2
                while o > 0:
                    s = s + shfl_xor(s, o)
                    o //= 2
                for l in np.nonzero(live & (slc == 0))[0]:
                    ps[hh * CHUNK + jj[l]] = s[l] * scale
            jj0 += WARPS * rows


def chunk_softmax(ps, length, group, part, chunks, part_m, part_l):
    for warp in range(WARPS):
        for hh in range(warp, group, WARPS):
            s = ps[hh * CHUNK: hh * CHUNK + length]
            m = s.max()
            p = np.exp(s - m)
            ps[hh * CHUNK: hh * CHUNK + length] = p
            part_m[part + hh * chunks] = m
            part_l[part + hh * chunks] = p.sum()


def chunk_values(part_o, ps, vpool, g, table, j0, length, hd, kvd, group, part, chunks, vec):
    lanes_per_row = hd // vec
    rows = 32 // lanes_per_row
    sub, slc = lane // lanes_per_row, lane % lanes_per_row
    for h0 in range(0, group, HEAD_BATCH):
        nh = min(HEAD_BATCH, group - h0)
        red = np.full(WARPS * HEAD_BATCH * hd, np.nan)
        for warp in range(WARPS):
            acc = np.zeros((32, HEAD_BATCH, vec))
            for l in lane:
                jj = warp * rows + sub[l]
                while jj < length:
                    at = g * hd + slot_offset(table, j0 + jj, kvd) + slc[l] * vec
                    for b in range(nh):
                        acc[l, b] += ps[(h0 + b) * CHUNK + jj] * vpool[at:at + vec]
                    jj += WARPS * rows
            o = lanes_per_row
            while o < 32:
                acc = acc + shfl_xor(acc, o)
                o *= 2
            for l in np.nonzero(sub == 0)[0]:
                for b in range(nh):
                    red[(warp * HEAD_BATCH + b) * hd + slc[l] * vec: (warp * HEAD_BATCH + b) * hd + slc[l] * vec + vec] = acc[l, b]
        for i in range(nh * hd):
            b, d = i // hd, i % hd
            part_o[(part + (h0 + b) * chunks) * hd + d] = sum(red[(w * HEAD_BATCH + b) * hd + d] for w in range(WARPS))


def paged_partial(st, r, g, c):
    H, KV, hd, vec = st['H'], st['KV'], st['hd'], st['vec']
    group, kvd, chunks = H // KV, KV * hd, st['chunks']
    n = st['pos'][r] + 1
    if n <= 0 or n > st['max_len'] or c * CHUNK >= n:
        return
    table = st['tables'][st['row_seq'][r] * MAX_PAGES:]
    j0, length = c * CHUNK, min(CHUNK, n - c * CHUNK)
    part = (r * H + g * group) * chunks + c
    qs = st['q'][r, g * group * hd: (g + 1) * group * hd]
    ps = np.full(group * CHUNK, np.nan)
    chunk_scores(ps, qs, st['kpool'], g, table, j0, length, hd, kvd, group, 1 / np.sqrt(hd), vec)
    chunk_softmax(ps, length, group, part, chunks, st['part_m'], st['part_l'])
    chunk_values(st['part_o'], ps, st['vpool'], g, table, j0, length, hd, kvd, group, part, chunks, vec)


def paged_combine(st, r, h):
    hd, chunks = st['hd'], st['chunks']
    n = st['pos'][r] + 1
    if n <= 0 or n > st['max_len']:
        return np.full(hd, np.nan)
    nc = (n + CHUNK - 1) // CHUNK
    base = (r * st['H'] + h) * chunks
    M = max(st['part_m'][base + c] for c in range(nc))
    w = [np.exp(st['part_m'][base + c] - M) for c in range(nc)]
    l = sum(st['part_l'][base + c] * w[c] for c in range(nc))
    acc = sum(st['part_o'][(base + c) * hd: (base + c + 1) * hd] * w[c] for c in range(nc))
    return acc / l


def run(H, KV, hd, kv_bytes, seed):
    rng = np.random.default_rng(seed)
    vec, kvd = 16 // kv_bytes, KV * hd
    ids = rng.permutation(80)
    tables = np.full(8 * MAX_PAGES, -1)
    nxt = 0
    for i, n in enumerate(LENS):
        for p in range((n + PT - 1) // PT):
            tables[TABLE_ROW[i] * MAX_PAGES + p] = ids[nxt]
            nxt += 1
    k_seq = [rng.standard_normal((n, KV, hd)) for n in LENS]
    v_seq = [rng.standard_normal((n, KV, hd)) for n in LENS]
    kpool, vpool = np.full(80 * PT * kvd, np.nan), np.full(80 * PT * kvd, np.nan)
    for i, n in enumerate(LENS):  # paged_qkv's placement
        for p in range(n):
            at = slot_offset(tables[TABLE_ROW[i] * MAX_PAGES:], p, kvd)
            kpool[at:at + kvd], vpool[at:at + kvd] = k_seq[i][p].ravel(), v_seq[i][p].ravel()
    picks = [(0, 0), (1, 14), (2, 15), (3, 16), (4, 255), (4, 256), (4, 299), (5, 511), (5, 512), (5, 599), (5, 0)]
    R, max_len = len(picks), 600
    st = dict(H=H, KV=KV, hd=hd, vec=vec, max_len=max_len, chunks=(max_len + CHUNK - 1) // CHUNK, tables=tables,
              kpool=kpool, vpool=vpool, q=rng.standard_normal((R, H * hd)),
              row_seq=[TABLE_ROW[i] for i, _ in picks], pos=[p for _, p in picks])
    entries = R * H * st['chunks']
    st.update(part_o=np.full(entries * hd, np.nan), part_m=np.full(entries, np.nan), part_l=np.full(entries, np.nan))
    for r in range(R):
        for g in range(KV):
            for c in range(st['chunks']):
                paged_partial(st, r, g, c)
    err = 0.0
    for r, (i, p) in enumerate(picks):
        for h in range(H):
            q = st['q'][r, h * hd:(h + 1) * hd]
            s = k_seq[i][:p + 1, h // (H // KV)] @ q / np.sqrt(hd)
            w = np.exp(s - s.max())
            want = (w / w.sum()) @ v_seq[i][:p + 1, h // (H // KV)]
            got = paged_combine(st, r, h)
            assert np.all(np.isfinite(got)), f"row {r} (sequence {i}, position {p}) head {h}: {got}"
            err = max(err, np.abs(got - want).max())
    print(f"H {H} KV {KV} hd {hd} {'bf16' if kv_bytes == 2 else 'fp32'} pages: max abs err {err:.2e}")
    assert err < 1e-12, err


if __name__ == '__main__':
    for H, KV, hd, kv_bytes in [(4, 2, 32, 2), (4, 2, 32, 4), (4, 4, 64, 2), (4, 2, 128, 4), (4, 2, 128, 2),
                                (6, 1, 64, 2), (6, 1, 128, 4)]:
        run(H, KV, hd, kv_bytes, seed=hd + H + KV + kv_bytes)
    print("all shapes match")

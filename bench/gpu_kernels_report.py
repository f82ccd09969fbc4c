#!/usr/bin/env python3
"""Where a training step's GPU time goes, ours beside the PyTorch peer's, or a decode step's / a
prefill's: kernel traces (CSV, as `JTOK_KERNEL_TRACE=FILE jtok bench-train --device cuda`,
`train_bench.py --kernel-trace FILE` and `JTOK_KERNEL_TRACE=FILE jtok bench-decode --device cuda`
write them: src/cuda/kernel_trace.h) summed per step (the file's "steps N") by kind of op and by kernel.

    python3 bench/gpu_kernels_report.py DIR [TITLE]   # every DIR/*.csv, a column each (file name)
    python3 bench/gpu_kernels_report.py A.csv B.csv   # these

Prints markdown: milliseconds a step by kind of op (a kernel's kind from its name, first match in
KINDS), the sum of every span, the device's busy time (the union of the spans over all streams:
what overlaps counts once), the traced window (first start to last end) and the device's idle time
in it (the host's waits and launch gaps, between steps too), then each trace's top kernels with
calls and milliseconds a step."""
import csv
import os
import re
import sys

# (kind of op, test on (record kind, name)), first match wins: token tables before embedding (jtok's
# gathers), torch.compile's fused kernels by their prefix. Our kernels' names say their family
# (jtok_, jtokm_, dedup_, table_, moe_, grad_norm_, rmsnorm_, ...: src/cuda).
KINDS = [
    ("copies", lambda k, n: k.startswith("memcpy")),
    ("memsets", lambda k, n: k == "memset"),
    ("gemm", re.compile(r"gemm|xmma|nvjet|cutlass|cublas|grouped_|row_invariant", re.I)),
    ("attention", re.compile(r"attn|attention|flash|fmha|sdpa|cudnn|dkdv|paged", re.I)),
    ("lm head + loss", re.compile(r"cross_entropy|softmax|nll_loss|logsumexp|logit_digest", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|grad_norm|clip|foreach", re.I)),
    ("token tables", re.compile(r"jtok|table|dedup|hot_|host_rows|step_rows|cub::|radix|DeviceSelect|DeviceScan|"
                                r"RunLength", re.I)),
    ("embedding", re.compile(r"embedding|index_select|indexSelect|gather|scatter|index_put|indexing", re.I)),
    ("norms", re.compile(r"rmsnorm|rms_norm|layer_norm|layernorm", re.I)),
    ("moe", re.compile(r"moe|expert|topk|top_k|sort", re.I)),
    ("fused (triton)", re.compile(r"^triton_")),
    ("elementwise", re.compile(r"swiglu|rope|convert|elementwise|silu|stats_", re.I)),
    ("other", lambda k, n: True),
]

def kind_of(kind, name):
    name = short(name, width=10**6)  # "jtok::cuda::" would read as a table's
    for label, test in KINDS:
        if (test(kind, name) if callable(test) else test.search(name)):
            return label
    return "other"


def read_trace(path):
    """(steps, [(kind, stream, start_ns, end_ns, name)]) of one trace file."""
    with open(path) as f:
        first = f.readline()
        m = re.search(r"\bsteps (\d+)", first)
        if not first.startswith("#") or not m:
            sys.exit(f"gpu_kernels_report.py: {path}: no '# ... steps N' first line (not a kernel trace?)")
        rows = [(r["kind"], int(r["stream"]), int(r["start_ns"]), int(r["end_ns"]), r["name"]) for r in csv.DictReader(f)]
    return max(int(m.group(1)), 1), rows


def busy_ns(rows):
    """The union of the spans' [start, end): the device's busy time, overlaps once."""
    total, end = 0, None
    for _, _, a, b, _ in sorted(rows, key=lambda r: r[2]):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def span_ns(rows):
    """From the first span's start to the last one's end: the traced window."""
    return max(r[3] for r in rows) - min(r[2] for r in rows) if rows else 0


def short(name, width=90):
    """A kernel's name without its parameter list, return type and our namespaces (templates kept), cut to width."""
    name = name.replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, c in enumerate(name):
        depth += c == "<"
        depth -= c == ">"
        if c == "(" and depth == 0 and i > 0:
            cut = i
            break
    s = name[:cut].removeprefix("void ").replace("jtok::cuda::", "")
    return s if len(s) <= width else s[:width - 3] + "..."


def report(traces, title):
    cols = list(traces)
    out = [f"## Device time a step by kind of op, ms{f' ({title})' if title else ''}", "",
           "| kind of op | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    per = {c: {} for c in cols}
    for c, (steps, rows) in traces.items():
        for k, _, a, b, n in rows:
            label = kind_of(k, n)
            per[c][label] = per[c].get(label, 0) + (b - a) / 1e6 / steps
    for label, _ in KINDS:
        if any(label in per[c] for c in cols):
            out.append(f"| {label} | " + " | ".join(f"{per[c].get(label, 0):.3f}" for c in cols) + " |")
    out.append("| all spans (sum) | " + " | ".join(f"{sum(per[c].values()):.3f}" for c in cols) + " |")
    busy = {c: busy_ns(rows) / 1e6 / steps for c, (steps, rows) in traces.items()}
    window = {c: span_ns(rows) / 1e6 / steps for c, (steps, rows) in traces.items()}
    # The device idle inside the traced window: the host's waits and launch gaps (between steps too).
    for label, ms in (("device busy (union)", busy), ("traced window", window),
                      ("device idle in it", {c: window[c] - busy[c] for c in cols})):
        out.append(f"| {label} | " + " | ".join(f"{ms[c]:.3f}" for c in cols) + " |")
    for c, (steps, rows) in traces.items():
        agg = {}
        for k, _, a, b, n in rows:
            key = (kind_of(k, n), short(n) if k == "kernel" else k)
            calls, ns = agg.get(key, (0, 0))
            agg[key] = (calls + 1, ns + b - a)
        total = sum(ns for _, ns in agg.values()) or 1
        out += ["", f"### {c}: the top kernels ({steps} steps)", "", "| ms a step | calls a step | share | kind | kernel |",
                "|---|---|---|---|---|"]
        for (label, name), (calls, ns) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]:
            out.append(f"| {ns / 1e6 / steps:.3f} | {calls / steps:g} | {100 * ns / total:.1f} % | {label} | "
                       f"`{name}` |")
    return "\n".join(out)


def main(argv):
    if not argv:
        sys.exit(__doc__)
    title = ""
    if os.path.isdir(argv[0]):
        files = sorted(os.path.join(argv[0], f) for f in os.listdir(argv[0]) if f.endswith(".csv"))
        title = " ".join(argv[1:])
    else:
        files = argv
    if not files:
        sys.exit(f"gpu_kernels_report.py: no kernel traces (*.csv) in {argv[0]}")
    traces = {os.path.basename(f).removesuffix(".csv"): read_trace(f) for f in files}
    print(report(traces, title))


if __name__ == "__main__":
    main(sys.argv[1:])

"""The numbers side of bench/gpu_loss_curve.sh (numpy only, no torch):

    series FILE.safetensors OUT.json   a `jtok parity` output's loss, grad_norm and lr (N) as one
                                       JSON object; reads the header and those three tensors only
                                       (the file also holds every final weight: 9 GB for config b)
    report DIR cuda|cpu                DIR/curve.csv (step, one loss column a run, empty cells where
                                       a run has no step), DIR/curve_long.csv (step, run, loss: what
                                       `jtok plot-csv --group run` draws), DIR/summary.txt and
                                       DIR/summary.json (one line) from DIR's series and DIR/runs.tsv
The runs' series in DIR: ours_device.json and ours_cpu.json (from `series`), pytorch.jsonl (one line
a step from gpu_loss_curve.py train, then one with its seconds). DIR/runs.tsv: one line a run,
key (prepare, ours_device, pytorch, ours_cpu), status, wall seconds (tab-separated). Column names
by device: cuda ours_gpu_bf16, pytorch_gpu_bf16; cpu (the check without a GPU) ours_loopback_fp32
(`jtok parity --device loopback`, fp32), pytorch_cpu_bf16; both ours_cpu_fp32.
"""
import json
import os
import struct
import sys

import numpy as np

LAST = 50  # the curve's tail: mean loss over a run's last LAST steps


def read_tensors(path, names):
    """dict name -> float32 array for `names` of a safetensors file, read by offset."""
    out = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        for name in names:
            info = header.get(name)
            if info is None or info["dtype"] != "F32":
                raise ValueError(f"{path}: no float32 tensor {name}")
            begin, end = info["data_offsets"]
            f.seek(8 + n + begin)
            out[name] = np.frombuffer(f.read(end - begin), "<f4").astype(np.float32)
    return out


def series(path, out):
    t = read_tensors(path, ("loss", "grad_norm", "lr"))
    with open(out, "w") as f:
        json.dump({k: [float(v) for v in a] for k, a in t.items()}, f)
    return 0


# The runs: key (runs.tsv's name, the series file's stem) -> column name, by --device.
COLUMNS = {"cuda": {"ours_device": "ours_gpu_bf16", "pytorch": "pytorch_gpu_bf16", "ours_cpu": "ours_cpu_fp32"},
           "cpu": {"ours_device": "ours_loopback_fp32", "pytorch": "pytorch_cpu_bf16", "ours_cpu": "ours_cpu_fp32"}}


def load_series(path):
    """(losses, lrs, extra) of one run's series file: step 1 first; extra: pytorch.jsonl's last line."""
    if path.endswith(".jsonl"):
        lines = [json.loads(l) for l in open(path) if l.strip()]
        steps = [l for l in lines if "step" in l]
        extra = {k: v for l in lines if "step" not in l for k, v in l.items()}
        return [l["loss"] for l in steps], [l["lr"] for l in steps], extra
    s = json.load(open(path))
    return s["loss"], s["lr"], {}


def load_runs(d, device):
    """(columns, lrs, extra): column name -> losses and -> lrs for every run with a series in d."""
    columns, lrs, extra = {}, {}, {}
    for key, name in COLUMNS[device].items():
        path = os.path.join(d, key + (".jsonl" if key == "pytorch" else ".json"))
        if os.path.exists(path) and os.path.getsize(path) > 0:
            columns[name], lrs[name], more = load_series(path)
            extra.update(more)
    return {k: v for k, v in columns.items() if v}, lrs, extra


def cell(x):
    return "" if x is None else f"{x:.9g}"  # 9 significant digits: a float32 exactly


def write_csvs(d, columns):
    names = list(columns)
    n = max((len(c) for c in columns.values()), default=0)
    with open(os.path.join(d, "curve.csv"), "w") as f:
        f.write(",".join(["step"] + names) + "\n")
        for s in range(n):
            f.write(",".join([str(s + 1)] + [cell(columns[k][s] if s < len(columns[k]) else None) for k in names]) + "\n")
    with open(os.path.join(d, "curve_long.csv"), "w") as f:
        f.write("step,run,loss\n")
        for k in names:
            f.writelines(f"{s + 1},{k},{cell(v)}\n" for s, v in enumerate(columns[k]))


def pair_diff(a, b):
    """a against b over their common steps: max |a - b|, its step, max |a - b| / |b|."""
    n = min(len(a), len(b))
    if n == 0:
        return None
    diff = np.abs(np.array(a[:n], np.float64) - np.array(b[:n], np.float64))
    rel = diff / np.abs(np.array(b[:n], np.float64))
    i = int(np.argmax(diff))
    return {"steps": n, "max_abs_diff": float(diff[i]), "at_step": i + 1, "max_rel_diff": float(rel.max())}


def read_runs_tsv(d):
    runs = {}
    path = os.path.join(d, "runs.tsv")
    if os.path.exists(path):
        for line in open(path):
            name, status, secs = line.rstrip("\n").split("\t")
            runs[name] = {"status": status, "wall_s": int(secs)}
    return runs


def summarize(d, device, columns, lrs, extra):
    runs = {COLUMNS[device].get(k, k): v for k, v in read_runs_tsv(d).items()}
    per_run = {}
    for k, c in columns.items():
        tail = c[-LAST:]
        per_run[k] = {"steps": len(c), "first": c[0], "final": c[-1], "mean_last": float(np.mean(tail)),
                      "mean_last_steps": len(tail)}
    names = list(columns)
    pairs = {f"{a} - {b}": pair_diff(columns[a], columns[b]) for i, a in enumerate(names) for b in names[i + 1:]}
    lr_pairs = {f"{a} - {b}": pair_diff(lrs[a], lrs[b]) for i, a in enumerate(names) for b in names[i + 1:]}
    return {"device": device, "runs": runs, "series": per_run, "loss_diffs": pairs,
            "lr_max_abs_diff": {k: (v or {}).get("max_abs_diff") for k, v in lr_pairs.items()}, "pytorch": extra}


def summary_text(s):
    lines = [f"gpu_loss_curve ({s['device']}): training loss a step, same initial weights and batches", "",
             f"{'run':<20} {'status':<28} {'wall s':>6} {'steps':>5} {'step 1':>8} {'final':>8} {'mean last':>10}"]
    order = ["prepare"] + list(COLUMNS[s["device"]].values())
    for name in order + sorted(set(s["runs"]) - set(order)):
        r, c = s["runs"].get(name, {}), s["series"].get(name)
        nums = f"{c['steps']:>5} {c['first']:>8.4f} {c['final']:>8.4f} {c['mean_last']:>10.4f}" if c else f"{'-':>5}"
        lines.append(f"{name:<20} {r.get('status', '-'):<28} {r.get('wall_s', '-'):>6} {nums}")
    lines += ["", "(mean last: over a run's last 50 steps, or all of them when fewer)", "",
              f"{'pair':<42} {'steps':>5} {'max |diff|':>10} {'at step':>7} {'max rel':>9} {'lr max |diff|':>13}"]
    for pair, p in s["loss_diffs"].items():
        if p:
            lines.append(f"{pair:<42} {p['steps']:>5} {p['max_abs_diff']:>10.4g} {p['at_step']:>7} "
                         f"{p['max_rel_diff']:>9.3g} {s['lr_max_abs_diff'][pair]:>13.3g}")
    if s["pytorch"]:
        lines += ["", "pytorch: " + ", ".join(f"{k} {v}" for k, v in s["pytorch"].items())]
    if s.get("stream"):
        lines += ["", s["stream"]]
    return "\n".join(lines) + "\n"


def stream_note(d):
    """prepare's line on the batches' stream (whether and where it wraps), or None."""
    path = os.path.join(d, "prepare.log")
    if not os.path.exists(path):
        return None
    return next((x.strip()[len("gpu_loss_curve: "):] for x in open(path) if x.startswith("gpu_loss_curve: stream:")), None)


def report(d, device):
    columns, lrs, extra = load_runs(d, device)
    write_csvs(d, columns)
    s = summarize(d, device, columns, lrs, extra)
    s["stream"] = stream_note(d)
    text = summary_text(s)
    line = json.dumps(s)
    with open(os.path.join(d, "summary.txt"), "w") as f:
        f.write(text + "\n" + line + "\n")
    with open(os.path.join(d, "summary.json"), "w") as f:
        f.write(line + "\n")
    print(text + "\n" + line)
    return 0


def main(argv):
    if len(argv) == 3 and argv[0] == "series":
        return series(argv[1], argv[2])
    if len(argv) == 3 and argv[0] == "report" and argv[2] in COLUMNS:
        return report(argv[1], argv[2])
    sys.exit("usage: gpu_loss_curve_report.py series FILE.safetensors OUT.json | report DIR cuda|cpu")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

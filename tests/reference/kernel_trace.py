"""The PyTorch peer's GPU work in jtok's kernel trace CSV (src/cuda/kernel_trace.h's format), so
that bench/gpu_kernels_report.py reads both engines' traces the same way: torch.profiler's CUDA
activity over the timed steps (CUPTI underneath, as jtok's own trace), its Chrome trace's kernel,
copy and memset events converted. train_bench.py --kernel-trace FILE."""
import json
import os
import re
import tempfile

# Chrome trace category -> our kind (a copy's direction read from its name: "Memcpy HtoD (Pinned -> Device)").
KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def chrome_to_records(trace):
    """(kind, stream, start_ns, end_ns, name) of each device event of a Chrome trace (a dict), by start."""
    out = []
    for ev in trace.get("traceEvents", []):
        kind = KINDS.get(ev.get("cat"))
        if kind is None or ev.get("ph") != "X":
            continue
        name = ev.get("name", "?")
        if kind == "memcpy":
            m = re.search(r"\b([HDP]to[HDP])\b", name)
            kind = f"memcpy {m.group(1)}" if m else "memcpy"
        start = round(float(ev["ts"]) * 1000)  # microseconds (fractional) -> ns
        out.append((kind, int(ev.get("args", {}).get("stream", 0)), start, start + round(float(ev["dur"]) * 1000), name))
    return sorted(out, key=lambda r: r[2])


def write_csv(path, records, comment):
    """The trace as CSV, written whole or not at all (temporary name, fsync, rename)."""
    lines = [f"# {comment}", "kind,stream,start_ns,end_ns,name"]
    lines += [f'{k},{s},{a},{b},"{n.replace(chr(34), chr(34) * 2)}"' for k, s, a, b, n in records]
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class KernelTrace:
    """torch.profiler over the timed steps: start() before the first, stop(steps, label) after the last."""

    def __init__(self, path):
        self.path, self.prof = path, None

    def start(self):
        import torch
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        self.prof.start()

    def stop(self, steps, label):
        import torch
        torch.cuda.synchronize()
        self.prof.stop()
        with tempfile.TemporaryDirectory() as d:
            chrome = os.path.join(d, "trace.json")
            self.prof.export_chrome_trace(chrome)
            with open(chrome) as f:
                records = chrome_to_records(json.load(f))
        write_csv(self.path, records, f"pytorch {torch.__version__} {label}: steps {steps}, models base, dropped 0")
        return len(records)

#!/usr/bin/env python3
"""Every kernel of src/cuda starts with pdl_wait() (src/cuda/pdl.cuh): the GPU decoder's CUDA graphs
may let a kernel of jtok::cuda launch before the kernel it follows has finished (programmatic edges
from its launch-completion port, src/cuda/decoder_step.cu), which is safe only when the later kernel
waits for the earlier before it touches memory. A kernel added without the wait fails here, named,
as does one outside namespace jtok::cuda (the edges pick kernels by that mangled prefix); the check
itself is held to catch both on made-up sources."""
import glob
import os
import re
import sys

ROOT = os.environ.get("JTOK_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def kernels_without_wait(text):
    """The names of the __global__ functions whose body's first statement is not pdl_wait();"""
    bad = []
    for m in re.finditer(r"__global__", text):
        body = text.index("{", m.start())
        name = re.findall(r"(\w+)\s*\(", text[m.start():body])
        name = [n for n in name if n != "__launch_bounds__"]
        first = re.sub(r"//[^\n]*", "", text[body + 1:body + 200]).strip()
        if not first.startswith("pdl_wait();"):
            bad.append(name[0] if name else "?")
    return bad


def kernels_outside_namespace(text):
    """__global__ functions that come before `namespace jtok::cuda {` (or where the file has none)."""
    ns = text.find("namespace jtok::cuda {")
    return [m.start() for m in re.finditer(r"__global__", text) if ns < 0 or m.start() < ns]


def main():
    ok_src = "namespace jtok::cuda {\n__global__ void __launch_bounds__(32) k(int* x) {\n  pdl_wait();\n  *x = 1;\n}\n}"
    bad_src = "namespace jtok::cuda {\n__global__ void __launch_bounds__(32) late(int* x) {\n  *x = 1;\n  pdl_wait();\n}\n}"
    assert kernels_without_wait(ok_src) == [] and kernels_without_wait(bad_src) == ["late"], "the check itself"
    assert kernels_outside_namespace("__global__ void f() {}\nnamespace jtok::cuda {}") == [0], "the check itself"
    files = sorted(glob.glob(os.path.join(ROOT, "src/cuda/*.cu")) + glob.glob(os.path.join(ROOT, "src/cuda/*.cuh")))
    count, failures = 0, []
    for f in files:
        text = open(f).read()
        count += text.count("__global__")
        failures += [f"{os.path.basename(f)}: kernel {k} does not start with pdl_wait();" for k in kernels_without_wait(text)]
        if kernels_outside_namespace(text):
            failures.append(f"{os.path.basename(f)}: a kernel outside namespace jtok::cuda")
    if failures:
        sys.exit("\n".join(failures))
    assert count >= 60, f"only {count} kernels found under {ROOT}/src/cuda"
    print(f"test_cuda_pdl_wait: all {count} kernels of src/cuda start with pdl_wait()")


if __name__ == "__main__":
    main()

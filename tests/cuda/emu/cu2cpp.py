#!/usr/bin/env python3
"""A .cu file as C++ that g++ compiles against tests/cuda/emu (the CPU emulation of our CUDA code).

  python3 tests/cuda/emu/cu2cpp.py src/cuda/rmsnorm.cu out.cpp

Rewrites two constructs and leaves the rest to the emulator's headers (emu_device.h: __global__,
__shared__, intrinsics; emu_runtime.h: the runtime):
  kernel<<<grid, block[, shared[, stream]]>>>(args)   ->  ::emu::launch(::emu::config(grid, block, ...),
                                                          "kernel", kernel, args)   (template kernels too)
  tkernel<<<...>>>(args), a template deducing its arguments -> ::emu::launch_deduced(..., "tkernel",
                                                          [](auto... p) { tkernel(p...); }, args)
  extern __shared__ [__align__(n)] T name[];           ->  T* const name = ::emu::dynamic_shared<T>(__func__);
Lines are kept (a #line names the .cu), so compiler errors and the emulator's reports point into
the .cu. What it cannot emulate honestly (inline PTX, cub and thrust headers without a fake in
tests/cuda/emu/include (cub/emu_cub.h: the calls src/cuda makes), cooperative groups, tensor
core fragments, __constant__, textures, launches it cannot parse) fails here, naming file:line.
"""
import os
import re
import sys

FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'include')
LIBRARY_INCLUDE = re.compile(r'#\s*include\s*[<"]((?:cub|thrust)/[^>"]+)[>"]')

UNSUPPORTED = [
    (re.compile(r'\basm\b|\b__asm__\b'), 'inline PTX (asm)'),
    (re.compile(r'cooperative_groups'), 'cooperative groups'),
    (re.compile(r'\bwmma::|mma_bf16\.cuh'), 'tensor-core fragments (mma)'),
    (re.compile(r'\b__constant__\b'), '__constant__ memory'),
    (re.compile(r'\btex[123]D\w*\s*\(|\bcudaTextureObject_t\b'), 'textures'),
    (re.compile(r'\b__nanosleep\b|\bclock64\s*\(|\b__activemask\s*\('), 'timing / active-mask intrinsics'),
]
DYN_SHARED = re.compile(
    r'extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?((?:unsigned\s+|signed\s+)?[A-Za-z_][\w:]*(?:\s*<[^;>]*>)?)\s+'
    r'(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_]\w*)\s*\[\s*\]\s*;')


class Fail(Exception):
    pass


def line_of(src, pos):
    return src.count('\n', 0, pos) + 1


def strip_comments(src, strings=True):
    """Comments (and string literals unless strings=False) blanked, newlines kept."""
    def blank(m):
        return m.group(0) if m.group(0)[0] == '"' else re.sub(r'[^\n]', ' ', m.group(0))
    def blank_all(m):
        return re.sub(r'[^\n]', ' ', m.group(0))
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', blank_all if strings else blank, src, flags=re.S)


def kernel_start(code, at):
    """Start of the kernel expression ending just before `at` (name, ns::name or name<T, 4>)."""
    i = at
    while i > 0 and code[i - 1].isspace():
        i -= 1
    if i > 0 and code[i - 1] == '>':
        depth = 0
        while i > 0:
            i -= 1
            depth += {'>': 1, '<': -1}.get(code[i], 0)
            if depth == 0:
                break
        while i > 0 and code[i - 1].isspace():
            i -= 1
    j = i
    while j > 0 and (code[j - 1].isalnum() or code[j - 1] in '_:'):
        j -= 1
    return j if j < i else None


def split_top(text):
    """text split at commas outside (), [], {} and <>-free nesting."""
    parts, depth, cur = [], 0, ''
    for ch in text:
        depth += {'(': 1, '[': 1, '{': 1, ')': -1, ']': -1, '}': -1}.get(ch, 0)
        if ch == ',' and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += ch
    return parts + [cur]


def template_kernels(code):
    """Names of the __global__ function templates (their launches may deduce the arguments)."""
    names = set()
    for m in re.finditer(r'__global__[^;{(]*?(\w+)\s*\(', code):
        head = code[max(code.rfind(';', 0, m.start()), code.rfind('}', 0, m.start())) + 1:m.start()]
        if re.search(r'\btemplate\b', head):
            names.add(m.group(1))
    return names


def rewrite_launches(src, code, path):
    out, last = [], 0
    deducing = template_kernels(code)
    for m in re.finditer(r'<<<', code):
        where = f'{path}:{line_of(code, m.start())}'
        start = kernel_start(code, m.start())
        close = code.find('>>>', m.end())
        if start is None or close < 0:
            raise Fail(f'{where}: a kernel launch cu2cpp.py cannot parse')
        cfg = split_top(src[m.end():close])
        if not 2 <= len(cfg) <= 4:
            raise Fail(f'{where}: a launch configuration of {len(cfg)} values')
        paren = close + 3
        while code[paren].isspace():
            paren += 1
        if code[paren] != '(':
            raise Fail(f'{where}: no argument list after >>>')
        k = paren + 1
        while code[k].isspace():
            k += 1
        kernel = src[start:m.start()].strip()
        name = re.sub(r'\s+', ' ', kernel)
        # Newlines inside the configuration kept: the lines after it stay where they were.
        config = src[m.end():close]
        if kernel in deducing:  # no template arguments: a function pointer cannot be formed before the call
            fn = f'[](auto... p) {{ {kernel}(p...); }}'
            call = f'::emu::launch_deduced(::emu::config({config}), "{name}", {fn}' + ('' if code[k] == ')' else ', ')
        else:
            call = f'::emu::launch(::emu::config({config}), "{name}", {kernel}' + ('' if code[k] == ')' else ', ')
        out.append(src[last:start] + call)
        last = paren + 1
    out.append(src[last:])
    return ''.join(out)


def convert(path):
    src = open(path).read()
    code = strip_comments(src, strings=False)  # #include "..." names stay visible
    for pat, what in UNSUPPORTED:
        m = pat.search(code)
        if m:
            raise Fail(f'{path}:{line_of(code, m.start())}: {what}: not emulated')
    # cub and thrust: only the headers tests/cuda/emu/include fakes (the calls src/cuda makes, on
    # the host); any other is refused, and a cub:: call the fake lacks fails to compile.
    for m in LIBRARY_INCLUDE.finditer(code):
        if not os.path.isfile(os.path.join(FAKES, m.group(1))):
            raise Fail(f'{path}:{line_of(code, m.start())}: {m.group(1)}: not emulated (no fake in tests/cuda/emu/include)')
    # Dynamic shared memory first, then the launches scanned in the rewritten text.
    src = DYN_SHARED.sub(lambda m: f'{m.group(1)}* const {m.group(2)} = ::emu::dynamic_shared<{m.group(1)}>(__func__);',
                         src)
    code = strip_comments(src)
    if re.search(r'extern\s+__shared__', code):
        m = re.search(r'extern\s+__shared__', code)
        raise Fail(f'{path}:{line_of(code, m.start())}: an extern __shared__ declaration cu2cpp.py cannot parse')
    src = rewrite_launches(src, code, path)
    if '<<<' in strip_comments(src):
        raise Fail(f'{path}: a launch left unrewritten')
    return f'#include "cuda_runtime.h"\n#include "cuda_bf16.h"\n#line 1 "{path}"\n' + src


def main():
    if len(sys.argv) != 3:
        sys.exit('usage: cu2cpp.py in.cu out.cpp')
    try:
        text = convert(sys.argv[1])
    except Fail as e:
        sys.exit(f'cu2cpp.py: {e}')
    open(sys.argv[2], 'w').write(text)


if __name__ == '__main__':
    main()

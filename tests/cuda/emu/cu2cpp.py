#!/usr/bin/env python3
"""A .cu file as C++ that g++ compiles against tests/cuda/emu (the CPU emulation of our CUDA code).

  python3 tests/cuda/emu/cu2cpp.py src/cuda/rmsnorm.cu out.cpp

Rewrites two constructs and leaves the rest to the emulator's headers (emu_device.h: __global__,
__shared__, intrinsics; emu_runtime.h: the runtime):
  kernel<<<grid, block[, shared[, stream]]>>>(args)   ->  ::emu::launch(::emu::config(grid, block, ...)
                                                          .bounded(B), "kernel", kernel, args)
                                                          (template kernels too)
  tkernel<<<...>>>(args), a template deducing its arguments -> ::emu::launch_deduced(..., "tkernel",
                                                          [](auto... p) { tkernel(p...); }, args)
  extern __shared__ [__align__(n)] T name[];           ->  T* const name = ::emu::dynamic_shared<T>(__func__);
B is the kernel's __launch_bounds__ (its first argument, as written: it must name something the
launch sees too): every __global__ function of a .cu needs one, and its launches are in that .cu.
ptxas fits a kernel's registers to the bound, so a GPU launch within it never runs out of
registers, and the emulator refuses a block past it as the GPU does (without a bound ptxas may
give a kernel up to 255 registers a thread, and a large block of such a kernel fails only there).
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
    (re.compile(r'\b__asm__\b'), 'inline PTX (__asm__; asm volatile(...) is converted)'),
    (re.compile(r'cooperative_groups'), 'cooperative groups'),
    (re.compile(r'\bwmma::'), 'tensor-core fragments (wmma)'),
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


LAUNCH_BOUNDS = re.compile(r'__launch_bounds__\s*\(((?:[^()]|\([^()]*\))*)\)')


def kernels(code):
    """(name, start of its declaration, end of its name) of each __global__ function."""
    blanked = LAUNCH_BOUNDS.sub(lambda m: ' ' * len(m.group(0)), code)  # its parentheses are not the parameters'
    return [(m.group(1), m.start(), m.end(1)) for m in re.finditer(r'__global__[^;{(]*?(\w+)\s*\(', blanked)]


def template_kernels(code):
    """Names of the __global__ function templates (their launches may deduce the arguments)."""
    names = set()
    for name, start, _ in kernels(code):
        head = code[max(code.rfind(';', 0, start), code.rfind('}', 0, start)) + 1:start]
        if re.search(r'\btemplate\b', head):
            names.add(name)
    return names


def kernel_bounds(code, path):
    """Each __global__ function's __launch_bounds__ (its largest block), by name; one without fails."""
    bounds = {}
    for name, start, end in kernels(code):
        m = LAUNCH_BOUNDS.search(code, start, end)
        if not m:
            raise Fail(f'{path}:{line_of(code, start)}: kernel {name} has no __launch_bounds__ (its largest block: '
                       'ptxas fits its registers to it)')
        bound = m.group(1).split(',')[0].strip()
        if bounds.setdefault(name, bound) != bound:
            raise Fail(f'{path}:{line_of(code, start)}: kernel {name} declared with two launch bounds')
    return bounds


def rewrite_launches(src, code, path):
    out, last = [], 0
    deducing = template_kernels(code)
    bounds = kernel_bounds(code, path)
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
        base = re.sub(r'<.*', '', name).split('::')[-1].strip()
        if base not in bounds:
            raise Fail(f'{where}: a launch of {base}, which is not a kernel of this file')
        # Newlines inside the configuration kept: the lines after it stay where they were.
        config = src[m.end():close]
        bounded = f'.bounded({bounds[base]})'
        if kernel in deducing:  # no template arguments: a function pointer cannot be formed before the call
            fn = f'[](auto... p) {{ {kernel}(p...); }}'
            call = (f'::emu::launch_deduced(::emu::config({config}){bounded}, "{name}", {fn}' +
                    ('' if code[k] == ')' else ', '))
        else:
            call = (f'::emu::launch(::emu::config({config}){bounded}, "{name}", {kernel}' +
                    ('' if code[k] == ')' else ', '))
        out.append(src[last:start] + call)
        last = paren + 1
    out.append(src[last:])
    return ''.join(out)


ASM = re.compile(r'\basm\s+(?:volatile\s*)?\(')
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')


def close_paren(code, open_at):
    """Index of the ')' matching code[open_at] == '(' (string literals skipped)."""
    depth, i = 0, open_at
    while i < len(code):
        if code[i] == '"':
            i = STRING.match(code, i).end()
            continue
        depth += {'(': 1, ')': -1}.get(code[i], 0)
        if depth == 0:
            return i
        i += 1
    return -1


def split_colons(text):
    """The asm body split at ':' outside strings and brackets (template : outputs : inputs : clobbers)."""
    parts, depth, cur, i = [], 0, '', 0
    while i < len(text):
        if text[i] == '"':
            end = STRING.match(text, i).end()
            cur += text[i:end]
            i = end
            continue
        depth += {'(': 1, '[': 1, ')': -1, ']': -1}.get(text[i], 0)
        if text[i] == ':' and depth == 0 and text[i:i + 2] != '::' and (i == 0 or text[i - 1] != ':'):
            parts.append(cur)
            cur = ''
        else:
            cur += text[i]
        i += 1
    return parts + [cur]


def asm_call(body, where):
    """asm volatile("instr ..." : "=r"(x), ... : "r"(y), ...) -> ::emu::ptx::instr(x, ..., y, ...)."""
    parts = split_colons(body)
    if not 2 <= len(parts) <= 4:
        raise Fail(f'{where}: an asm statement cu2cpp.py cannot parse')
    template = ''.join(bytes(m.group(0)[1:-1], 'utf-8').decode('unicode_escape') for m in STRING.finditer(parts[0]))
    mnemonic = template.split()[0].rstrip(';') if template.split() else ''
    if not re.fullmatch(r'[a-z][\w.]*', mnemonic):
        raise Fail(f'{where}: an asm statement without an instruction cu2cpp.py can name')
    first = []
    for n in re.findall(r'%(\d+)', template):
        if int(n) not in first:
            first.append(int(n))
    operands = []
    for group in parts[1:3]:
        for op in split_top(group):
            if not op.strip():
                continue
            m = re.fullmatch(r'\s*"[=+&]*[a-z]+"\s*\((.*)\)\s*', op, flags=re.S)
            if not m:
                raise Fail(f'{where}: an asm operand cu2cpp.py cannot parse: {op.strip()}')
            operands.append(m.group(1).strip())
    if first != list(range(len(operands))):
        raise Fail(f'{where}: {mnemonic}: operands not used in the order %0, %1, ...: the emulation passes them so')
    return '::emu::ptx::' + mnemonic.replace('.', '_') + '(' + ', '.join(operands) + ')'


def rewrite_asm(src, path):
    """Every asm volatile(...) statement as a call to its emulation (tests/cuda/emu/include/emu_ptx.h),
    the lines it spanned kept."""
    code = strip_comments(src, strings=False)
    out, last = [], 0
    for m in ASM.finditer(code):
        if m.start() < last:
            continue
        end = close_paren(code, m.end() - 1)
        where = f'{path}:{line_of(code, m.start())}'
        if end < 0:
            raise Fail(f'{where}: an asm statement without its closing parenthesis')
        call = asm_call(code[m.end():end], where)
        out.append(src[last:m.start()] + call + '\n' * src.count('\n', m.start(), end))
        last = end + 1
    out.append(src[last:])
    return ''.join(out)


def convert_headers(src, path, out_dir):
    """src/cuda .cuh headers the file includes that hold asm, converted next to the output (a quoted
    include finds them there before -I src)."""
    here = os.path.dirname(os.path.abspath(path))
    for m in re.finditer(r'#\s*include\s*"cuda/(\w+\.cuh)"', src):
        header = os.path.join(here, m.group(1))
        text = open(header).read()
        if not ASM.search(strip_comments(text, strings=False)):
            continue
        os.makedirs(os.path.join(out_dir, 'cuda'), exist_ok=True)
        with open(os.path.join(out_dir, 'cuda', m.group(1)), 'w') as f:
            f.write(f'#line 1 "{header}"\n' + rewrite_asm(text, header))


def convert(path, out_dir='.'):
    src = open(path).read()
    code = strip_comments(src, strings=False)  # #include "..." names stay visible
    convert_headers(code, path, out_dir)
    src = rewrite_asm(src, path)
    code = strip_comments(src, strings=False)
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
        text = convert(sys.argv[1], os.path.dirname(os.path.abspath(sys.argv[2])))
    except Fail as e:
        sys.exit(f'cu2cpp.py: {e}')
    open(sys.argv[2], 'w').write(text)


if __name__ == '__main__':
    main()

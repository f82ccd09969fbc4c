"""Normalises corpus documents to UTF-8 text and splits them train/validation by whole documents.
Usage: normalize_corpus.py OUT_DIR SOURCE=GLOB_OR_DIR... (called by scripts/prepare_data.sh)
Per document: bytes -> text (UTF-8; if that fails, Latin-1), drop a BOM, CRLF/CR -> LF, NFC.
Split: within each source, documents sorted by name; every 10th (index % 10 == 5) is validation.
Writes OUT_DIR/{train,val}/<source>__<name>.txt and OUT_DIR/{train,val}.list (one path a line)."""
import gzip, os, sys, glob, unicodedata


def read_text(path):
    raw = open(path, "rb").read()
    if path.endswith((".gz", ".dz")):  # dictzip (.dz) is gzip-compatible
        raw = gzip.decompress(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text)


def main():
    out = sys.argv[1]
    lists = {"train": [], "val": []}
    for split in lists:
        os.makedirs(os.path.join(out, split), exist_ok=True)
        for f in glob.glob(os.path.join(out, split, "*.txt")):
            os.remove(f)
    for spec in sys.argv[2:]:
        source, pattern = spec.split("=", 1)
        paths = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not paths:
            sys.exit(f"normalize_corpus: no files for {source} ({pattern})")
        counts = {"train": 0, "val": 0}
        for i, p in enumerate(paths):
            text = read_text(p)
            if not text.strip():
                continue
            split = "val" if i % 10 == 5 else "train"
            rel = os.path.relpath(p, os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(p))
            name = source + "__" + rel.replace(os.sep, "_").removesuffix(".gz").removesuffix(".dz")
            dst = os.path.join(out, split, name if name.endswith(".txt") else name + ".txt")
            with open(dst, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            lists[split].append(dst)
            counts[split] += 1
        print(f"normalize_corpus: {source}: {counts['train']} train, {counts['val']} val documents")
    for split, files in lists.items():
        with open(os.path.join(out, split + ".list"), "w") as f:
            f.write("".join(p + "\n" for p in sorted(files)))


if __name__ == "__main__":
    main()

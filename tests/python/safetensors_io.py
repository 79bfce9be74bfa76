"""An independent safetensors reader and writer (no safetensors package here), for tests/cli_formats.sh.

    safetensors_io.py check FILE              validate FILE as the format's spec says, print its tensors
    safetensors_io.py rewrite FILE OUT SEED   write OUT with FILE's names, shapes and metadata, new
                                              random values, tensors in reverse name order (without
                                              spanformer.sha256, which no longer holds; --keep-sum keeps it)
    safetensors_io.py same A B                exit 0 when A and B hold the same tensors, bit for bit
    safetensors_io.py damage FILE OUT KIND    a broken copy: hole | overlap | dtype | header | short | flip
                                              (flip: one exponent bit of the first value, header unchanged)
"""
import hashlib
import json
import struct
import sys

import torch

DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "F16": (torch.float16, 2),
          "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
          "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1), "BOOL": (torch.bool, 1)}


def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header longer than the file"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()), "metadata must be str -> str"
    tensors, spans = {}, []
    for name, e in header.items():
        dtype, size = DTYPES[e["dtype"]]
        begin, end = e["data_offsets"]
        numel = 1
        for d in e["shape"]:
            numel *= d
        assert end - begin == numel * size, f"{name}: {end - begin} bytes for {numel} elements"
        buf = bytearray(data[begin:end])
        t = torch.frombuffer(buf, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(e["shape"]).clone()
        spans.append((begin, end))
    at = 0
    for begin, end in sorted(spans):
        assert begin == at, "hole or overlap in the data buffer"
        at = end
    assert at == len(data), "bytes after the last tensor"
    return tensors, meta, n


def write(path, tensors, meta, order):
    header, chunks, offset = {"__metadata__": meta}, [], 0
    for name in order:
        t = tensors[name].contiguous()
        b = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        code = next(k for k, (d, _) in DTYPES.items() if d == t.dtype)
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def main():
    cmd = sys.argv[1]
    if cmd == "check":
        tensors, meta, n = read(sys.argv[2])
        assert n % 8 == 0, "spanformer pads its header to 8 bytes"
        for key in ("spanformer.family", "spanformer.config", "spanformer.vocab", "spanformer.vocab_level",
                    "spanformer.sha256"):
            assert key in meta, key
        assert hashlib.sha256(open(sys.argv[2], "rb").read()[8 + n:]).hexdigest() == meta["spanformer.sha256"]
        json.loads(meta["spanformer.config"])
        for name, t in tensors.items():
            assert t.dtype == torch.float32 and torch.isfinite(t).all(), name
        print(f"{len(tensors)} tensors, {sum(t.numel() for t in tensors.values())} values, family {meta['spanformer.family']}")
    elif cmd == "rewrite":
        tensors, meta, _ = read(sys.argv[2])
        g = torch.Generator().manual_seed(int(sys.argv[4]))
        # Small values: the span parameters stay inside [0, 1] and the model stays well behaved.
        new = {k: torch.rand(v.shape, generator=g, dtype=torch.float32) * 0.1 for k, v in tensors.items()}
        meta.pop("spanformer.header_sha256", None)  # the order (offsets) changes: the header hash no longer holds
        if "--keep-sum" not in sys.argv:
            meta.pop("spanformer.sha256", None)
        write(sys.argv[3], new, meta, sorted(new, reverse=True))
    elif cmd == "huge":  # the largest tensor scaled to reach 3e38 (finite, but any product overflows)
        tensors, meta, _ = read(sys.argv[2])
        name = max(tensors, key=lambda k: tensors[k].numel())
        t = tensors[name].double()
        tensors[name] = (t * (3e38 / t.abs().max())).to(tensors[name].dtype)  # in double: 3e38 / max overflows float32
        meta.pop("spanformer.sha256", None)
        meta.pop("spanformer.header_sha256", None)
        write(sys.argv[3], tensors, meta, sorted(tensors))
    elif cmd == "same":
        a, _, _ = read(sys.argv[2])
        b, _, _ = read(sys.argv[3])
        assert a.keys() == b.keys(), "different names"
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k
        print(f"{len(a)} tensors identical")
    elif cmd == "damage":
        path, out, kind = sys.argv[2:5]
        raw = open(path, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        names = [k for k in header if k != "__metadata__"]
        first = min(names, key=lambda k: header[k]["data_offsets"][0])
        if kind == "header":
            open(out, "wb").write(struct.pack("<Q", len(raw)) + raw[8:])
            return
        if kind == "short":
            open(out, "wb").write(raw[:len(raw) - 4])
            return
        if kind == "flip":  # the first value's exponent (little-endian float32: byte 3 holds sign and exponent)
            at = 8 + n + header[first]["data_offsets"][0] + 3
            open(out, "wb").write(raw[:at] + bytes([raw[at] ^ 0x20]) + raw[at + 1:])
            return
        if kind == "hole":
            header[first]["data_offsets"][0] += 4
            header[first]["shape"] = [header[first]["data_offsets"][1] - header[first]["data_offsets"][0] >> 2]
        elif kind == "overlap":
            header[first]["data_offsets"][1] += 4
            header[first]["shape"] = [header[first]["data_offsets"][1] - header[first]["data_offsets"][0] >> 2]
        elif kind == "dtype":
            header[first]["dtype"] = "U32"
        elif kind == "vocab":  # one bit of the vocabulary in __metadata__ flipped, both checksums kept
            v = header["__metadata__"]["spanformer.vocab"]
            header["__metadata__"]["spanformer.vocab"] = v[:10] + chr(ord(v[10]) ^ 1) + v[11:]
        elif kind == "swap":  # the names of two tensors of one shape exchanged, both checksums kept
            a, b = next((a, b) for a in names for b in names
                        if a < b and header[a]["shape"] == header[b]["shape"] and header[a]["dtype"] == header[b]["dtype"])
            header[a], header[b] = header[b], header[a]
        text = json.dumps(header).encode()
        open(out, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])


if __name__ == "__main__":
    main()

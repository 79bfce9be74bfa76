"""Reads a PNG (8-bit RGB or RGBA, not interlaced) with the standard library and prints how much of it
is drawn: the share of pixels that are not the page background (the most common colour) and the number
of distinct colours. With --min-drawn and --min-colours it is the command-line scripts' one picture
check (tests/cli_checks.sh `picture_drawn`): a blank or one-colour picture fails with one line naming it.

    python tests/png_check.py picture.png [--min-drawn PERCENT] [--min-colours N]
"""
import argparse
import struct
import sys
import zlib
from collections import Counter


def read_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path}: not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise SystemExit(f"{path}: expected 8-bit RGB(A) without interlacing")
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


parser = argparse.ArgumentParser()
parser.add_argument("png")
parser.add_argument("--min-drawn", type=float, default=0.0, help="least share of non-background pixels, percent")
parser.add_argument("--min-colours", type=int, default=0, help="least number of distinct colours")
args = parser.parse_args()
width, height, bpp, rows = read_png(args.png)
pixels = Counter(row[i:i + 3] for row in rows[::2] for i in range(0, len(row), bpp * 2))  # every 4th pixel
total = sum(pixels.values())
background, count = pixels.most_common(1)[0]
drawn = 100 * (1 - count / total)
line = f"{width}x{height}: {drawn:.1f}% drawn, {len(pixels)} colours"
if drawn < args.min_drawn or len(pixels) < args.min_colours:
    sys.exit(f"FAIL: picture drawn: {args.png}: {line} (want at least {args.min_drawn}% drawn and "
             f"{args.min_colours} colours)")
print(line)

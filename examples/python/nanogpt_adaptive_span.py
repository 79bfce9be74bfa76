"""A nanoGPT-sized byte-level language model in plain PyTorch whose attention is spanformer's adaptive
span (spanformer.nn.AdaptiveSpanAttention), trained with torch.compile on the King James Bible: each
head learns how far back it reads, and the layer reads (and caches) only that far.

    .venv/bin/python examples/python/nanogpt_adaptive_span.py [--steps 600] [--out spans.png]

The text: --text FILE, else data/kjv.txt, made with Debian's `bible` program (package bible-kjv) as
scripts/demo.sh makes it. The model: pre-norm blocks (x + attn(ln(x)), x + mlp(ln(x))), one key_pe
(D, L) for all layers (the reference's relative positions), the output tied to the byte embedding.
Training reads B parallel streams of the text block after block, each layer carrying a cache of its
last inputs (as long as its spans need: AdaptiveSpan.cache_size), Adam, the span loss added, spans
clamped after every step. Prints steps, bits per byte, tokens/s and the mean span per layer; at the
end the held-out bits per byte and the spans, drawn with spanformer.plot_spans.
"""
import argparse
import math
import os
import subprocess
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import spanformer
import spanformer.nn as snn


class Block(nn.Module):
    def __init__(self, H, K, L, dropout):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.attn = snn.AdaptiveSpanAttention(H, K, attn_span=L, loss_coeff=2e-6, dropout=dropout)
        self.fc1, self.fc2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x, cache, key_pe):
        h = self.ln1(x)                                                   # (B, M, H): what the cache keeps
        x = x + self.attn(h, cache, key_pe)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)))), h


class AdaptiveSpanGpt(nn.Module):
    def __init__(self, layers=4, H=256, K=4, L=512, dropout=0.0):
        super().__init__()
        self.emb = nn.Embedding(256, H)
        self.key_pe = nn.Parameter(torch.randn(H // K, L) / math.sqrt(H // K))  # (D, L)
        self.blocks = nn.ModuleList(Block(H, K, L, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(H)

    def forward(self, ids, caches):
        """ids (B, M) -> log-probabilities (B, M, 256), and each layer's new cache."""
        x, new = self.emb(ids), []
        for block, cache in zip(self.blocks, caches):
            x, h = block(x, cache, self.key_pe)
            new.append(torch.cat([cache, h], 1)[:, -block.attn.cache_size():].detach())
        return F.log_softmax(self.ln_f(x) @ self.emb.weight.t(), -1), new

    def span_loss(self):
        return sum(b.attn.span.loss() for b in self.blocks)

    def spans(self):
        return [b.attn.span.spans() for b in self.blocks]

    def zero_caches(self, B):
        """The states before the text's start: zeros, as long as each layer's cache (one shape for
        torch.compile until the spans move a layer's cache size)."""
        return [torch.zeros(B, b.attn.cache_size(), self.emb.weight.shape[1]) for b in self.blocks]


def text_bytes(path):
    if path is None:
        path = os.path.join("data", "kjv.txt")
        if not os.path.exists(path):
            os.makedirs("data", exist_ok=True)
            text = subprocess.run(["bible", "-l0", "Genesis1:1-Revelation22:21"], capture_output=True, check=True).stdout
            open(path, "wb").write(text)
    return torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8).long()


def streams(data, B):
    """(B, len / B): B consecutive parts of data, read side by side."""
    n = len(data) // B
    return data[: n * B].view(B, n)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--span", type=int, default=512, help="L: the longest span a head may learn")
    p.add_argument("--block", type=int, default=128, help="M: tokens per step and stream")
    p.add_argument("--batch", type=int, default=16, help="B: parallel streams")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--span-lr", type=float, default=3e-2,
                   help="Adam's step for the span ratios (a ratio of 1/L is one token: they need larger steps)")
    p.add_argument("--eval-blocks", type=int, default=20)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="spans.png", help="the picture of the learned spans")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    data = text_bytes(a.text)
    cut = int(len(data) * 0.95)
    train, held = streams(data[:cut], a.batch), streams(data[cut:], a.batch)
    model = AdaptiveSpanGpt(a.layers, a.d_model, a.heads, a.span)
    step_fn = model if a.no_compile or not hasattr(torch, "compile") else torch.compile(model)  # PyTorch 2
    spans = [b.attn.span.span_ratio for b in model.blocks]
    others = [q for q in model.parameters() if all(q is not r for r in spans)]
    opt = torch.optim.Adam([{"params": others}, {"params": spans, "lr": a.span_lr}], lr=a.lr)
    caches = model.zero_caches(a.batch)
    M, pos, start, seen = a.block, 0, None, 0
    for step in range(1, a.steps + 1):
        if pos + M + 1 > train.shape[1]:
            pos, caches = 0, model.zero_caches(a.batch)
        x, y = train[:, pos: pos + M], train[:, pos + 1: pos + M + 1]
        pos += M
        logp, caches = step_fn(x, caches)
        nll = F.nll_loss(logp.reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        (nll + model.span_loss()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for block in model.blocks:
            block.attn.span.clamp_()
        if step == 10:  # tokens/s from here: the first steps compile
            start, seen = time.time(), 0
        seen += x.numel()
        if step % 50 == 0 or step == a.steps:
            spent = time.time() - start if start else float("nan")
            mean = " ".join(f"{sum(s) / len(s):.0f}" for s in model.spans())
            print(f"step {step:5d} | train {nll.item() / math.log(2):.3f} bits/byte | {seen / spent:.0f} tokens/s | "
                  f"left {spent / max(1, step - 10) * (a.steps - step):.0f} s | mean span per layer {mean}", flush=True)
    model.eval()
    caches, total, count = model.zero_caches(a.batch), 0.0, 0
    with torch.no_grad():
        for b in range(min(a.eval_blocks, (held.shape[1] - 1) // M)):
            x, y = held[:, b * M: (b + 1) * M], held[:, b * M + 1: (b + 1) * M + 1]
            logp, caches = model(x, caches)
            total += F.nll_loss(logp.reshape(-1, 256), y.reshape(-1), reduction="sum").item()
            count += y.numel()
    print(f"held-out: {total / count / math.log(2):.4f} bits/byte over {count} bytes")
    for layer, spans in enumerate(model.spans()):
        print(f"layer {layer}: spans " + " ".join(f"{z:.1f}" for z in spans))
    spanformer.plot_spans(model.spans(), a.out, a.span, title="nanoGPT with adaptive span, King James Bible")
    print(f"spans drawn in {a.out}")


if __name__ == "__main__":
    main()

"""A plain PyTorch implementation of the adaptive-span model with the reference's semantics and
operation order (skew/unskew by padding, trimming to the largest span, per-tensor clipped Adagrad with
host reads of each norm), used only as the Python baseline of docs/benchmarks.md.

Run with Debian's python3-torch (same LibTorch 1.13 and OpenBLAS as spanformer):
    /usr/bin/python3 bench/python/reference_semantics.py --span 40 --steps 3

First it checks that this model is ours (configs/bench_small.json): the same number of parameters, the
same spans and the same mean NLL on the first batch before any update (within 2%: the same
initialisation rule, other draws and batches), against `spanformer bench ... --json` (--spanformer, or
$SPANFORMER_CLI, or build/spanformer; --no-check skips it). A mismatch exits non-zero.
"""
import argparse, json, math, os, resource, subprocess, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


def unskew(x):  # (N, M, W+M) -> (N, M, W): row i keeps columns i .. i+W-1
    n, m, wm = x.shape
    w = wm - m
    x = F.pad(x.reshape(n, -1), (0, m)).view(n, m, wm + 1)
    return x[:, :, :w]


def skew(x):  # (N, M, W) -> (N, M, W+M)
    n, m, w = x.shape
    x = F.pad(x, (0, m + 1)).view(n, -1)[:, : m * (w + m)]
    return x.view(n, m, w + m)


class Layer(nn.Module):
    def __init__(s, H, K, I, L, ramp, span_init):
        super().__init__()
        s.H, s.K, s.D, s.L, s.ramp = H, K, H // K, L, ramp
        s.q, s.k, s.v, s.o = (nn.Linear(H, H, bias=False) for _ in range(4))
        s.fc1, s.fc2 = nn.Linear(H, I), nn.Linear(I, H)
        s.n1, s.n2 = nn.LayerNorm(H), nn.LayerNorm(H)
        s.ratio = nn.Parameter(torch.full((K, 1, 1), span_init))

    def trim(self):
        S = max(0, min(self.L, math.ceil(self.ratio.max().item() * self.L) + self.ramp))
        return math.floor(min(self.L - 1, self.L - S) / 64) * 64

    def cache_size(self):
        return min(self.L, self.L - self.trim() + 64)

    def heads(self, x):
        B, T, _ = x.shape
        return x.view(B, T, self.K, self.D).transpose(1, 2).reshape(B * self.K, T, self.D)

    def forward(self, h, cache, key_pe):
        B, M, _ = h.shape
        ctx = torch.cat([cache, h], 1)
        trim = self.trim()
        c = ctx.size(1) - M
        t = trim - (self.L - c)
        if t > 0:
            ctx = ctx[:, t:]
        elif t < 0:
            ctx = F.pad(ctx, (0, 0, -t, 0))
        pe = key_pe[:, :, trim:]
        q, k, v = self.heads(self.q(h)), self.heads(self.k(ctx)), self.heads(self.v(ctx))
        a = unskew(q @ k.transpose(-1, -2)) + q @ pe
        a = F.softmax(a / math.sqrt(self.D), -1)
        W = a.size(-1)
        tmpl = torch.linspace(1 - self.L, 0, self.L, device=h.device)
        mask = ((tmpl + self.ratio * self.L) / self.ramp + 1).clamp(0, 1)[:, :, -W:]
        a = (a.view(B, self.K, M, W) * mask).view(B * self.K, M, W)
        a = a / (a.sum(-1, keepdim=True) + 1e-8)
        out = (skew(a) @ v).view(B, self.K, M, self.D).transpose(1, 2).reshape(B, M, self.H)
        h = self.n1(h + self.o(out))
        return self.n2(h + self.fc2(F.relu(self.fc1(h))))


class Model(nn.Module):
    def __init__(s, V, H, K, I, L, layers, ramp, span_init):
        super().__init__()
        s.emb, s.out = nn.Embedding(V, H), nn.Linear(H, V)
        s.key_pe = nn.Parameter(torch.randn(1, H // K, L))
        s.layers = nn.ModuleList(Layer(H, K, I, L, ramp, span_init) for _ in range(layers))

    def forward(self, x, caches):
        M = x.size(1)
        h = self.emb(x)
        nxt = []
        for l, layer in enumerate(self.layers):
            cs = layer.cache_size()
            nxt.append((torch.cat([caches[l][:, -cs + M:], h], 1) if cs > M else h[:, -cs:]).detach())
            h = layer(h, caches[l], self.key_pe)
        return F.log_softmax(self.out(h), -1), nxt


def check_against_ours(cli, config, span, params, first_loss, spans):
    """Our model of the same shape and spans (`spanformer bench --json`: params, first_loss, mean_span)."""
    run = subprocess.run([cli, "--threads", "1", "bench", "-c", config, "--span", str(span), "--steps", "1",
                          "--warmup", "0", "--json"], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"reference_semantics: {cli} bench failed: {run.stderr.strip().splitlines()[-1:]} (--no-check skips this)")
    ours = json.loads(run.stdout.strip().splitlines()[-1])
    gap = abs(ours["first_loss"] - first_loss) / first_loss
    same_spans = all(abs(z - ours["mean_span"]) < 1e-3 for z in spans)
    ok = ours["params"] == params and gap <= 0.02 and same_spans
    print(f"# twin check: parameters ours {ours['params']:,}, this model {params:,}; spans ours {ours['mean_span']:.1f}, "
          f"this model {', '.join(f'{z:.1f}' for z in spans)}; first-step NLL ours {ours['first_loss']:.4f}, "
          f"this model {first_loss:.4f} ({100 * gap:.2f}%): {'ok' if ok else 'MISMATCH'}", flush=True)
    if not ok:
        sys.exit("reference_semantics: this model is not spanformer's (the twin check above)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--span", type=float, default=40)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--spanformer", default=os.environ.get("SPANFORMER_CLI", os.path.join(here, "..", "..", "build", "spanformer")))
    p.add_argument("--no-check", action="store_true", help="skip the comparison with spanformer's model")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    V, H, K, I, L, M, B, layers = 256, 256, 4, 1024, 1024, 256, 8, 4
    model = Model(V, H, K, I, L, layers, 32, a.span / L)
    params = list(model.parameters())
    sums = [torch.zeros_like(q) for q in params]
    caches = [torch.zeros(B, layer.cache_size(), H) for layer in model.layers]
    if not a.no_check:
        with torch.no_grad():
            out, _ = model(torch.randint(V, (B, M)), caches)
            first = F.nll_loss(out.view(-1, V), torch.randint(V, (B, M)).view(-1)).item()
        check_against_ours(a.spanformer, os.path.join(here, "..", "..", "configs", "bench_small.json"), a.span,
                           sum(q.numel() for q in params), first, [layer.ratio.mean().item() * L for layer in model.layers])
    total = 0.0
    for step in range(a.warmup + a.steps):
        x, y = torch.randint(V, (B, M)), torch.randint(V, (B, M))
        t0 = time.time()
        for q in params:
            q.grad = None
        out, caches = model(x, caches)
        loss = F.nll_loss(out.view(-1, V), y.view(-1))
        loss = loss + sum(2e-6 * L * layer.ratio.mean() for layer in model.layers)
        loss.backward()
        with torch.no_grad():
            for q, s in zip(params, sums):  # Adagrad, per-tensor clip with a host read of each norm
                g = q.grad
                lr = 1e-9
                n = g.norm().item()
                if n > 0.03:
                    lr *= 0.03 / (n + 1e-10)
                s.addcmul_(g, g)
                q.addcdiv_(g, s.sqrt().add_(1e-10), value=-lr)
            for layer in model.layers:
                layer.ratio.clamp_(0, 1)
        loss.item()
        dt = time.time() - t0
        if step >= a.warmup:
            total += dt
        print(f"  step {step + 1}: {dt * 1e3:.0f} ms")
    per = total / a.steps
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    print(f"python reference semantics: span {a.span:.0f}, {per * 1e3:.1f} ms/step, {B * M / per:.0f} tokens/s, peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()

"""How many far keys an exact bound could skip in the adaptive-span op (docs/kernels.md).

The reference's normaliser, a_d = e_d m_d / (sum_e e_e m_e + 1e-8 Z), counts every key of the window in Z
(e = exp(s - c), c the row's largest score): a key beyond a head's span (m = 0) reaches the output only
through the 1e-8 Z term. Skipping a tile of such keys is exact when a bound B on its share of Z makes
1e-8 B / sum(e m) smaller than the output's rounding. This measures, on the op's perf shape with the
inputs the benchmarks use (standard normal q, k, pe; B 1, K 8, D 64, M 512, L 8192, bimodal spans, ramp
32), per head:
  - the true relative effect of the far keys' 1e-8 Z share on the output (median and largest over rows);
  - the share of far-key tiles (64 keys x one query) that can be skipped, greedily from the smallest
    bound up, while the skipped bounds' sum stays below half an ulp of the output, in float32 and in
    bfloat16, with the Cauchy-Schwarz bound (||q|| (max ||k|| + max ||pe||) / sqrt(D) over the tile)
    and with the tile's true Z share (the limit no bound can beat).

  .venv/bin/python bench/python/far_keys.py [--seed N]
"""
import argparse
import math

import torch


def skippable(share, rel_of, budget):
    """Share (per row) of tiles skippable greedily: smallest first, cumulative effect below budget."""
    ordered, _ = torch.sort(rel_of(share), dim=-1)
    return (ordered.cumsum(-1) < budget).double().mean(-1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    B, K, M, W, D, L, R, T = 1, 8, 512, 8192, 64, 8192, 32, 64
    spans = [40.5, 80.5, 160.5, 320.5, 4000.5, 6000.5, 7000.5, 8100.5]
    f64 = torch.float64
    q, k, pe = torch.randn(K, M, D, dtype=f64), torch.randn(K, W + M, D, dtype=f64), torch.randn(D, L, dtype=f64)
    rows = torch.arange(M)
    idx = rows[:, None] + torch.arange(L)[None, :]  # (M, L): query i reads keys i .. i + L - 1, distance L - 1 - j
    dist = (L - 1 - torch.arange(L)).to(f64)
    half_ulp = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}
    print(f"{'head':>4} {'span':>7} {'far keys':>8} {'1e-8 Z_far / sum(e m)':>24} "
          + " ".join(f"{'skip ' + n + ' ' + b:>22}" for n in half_ulp for b in ("CS", "true")))
    for h, z in enumerate(spans):
        s = (torch.einsum("md,mld->ml", q[h], k[h][idx]) + q[h] @ pe) / math.sqrt(D)  # (M, L)
        m = ((z - dist) / R + 1).clamp(0, 1)                                           # (L,)
        c = s.max(-1, keepdim=True).values
        e = torch.exp(s - c)
        near = (e * m).sum(-1)                                                         # (M,)
        far = int((m == 0).sum())                                                      # far slots come first
        effect = 1e-8 * e[:, :far].sum(-1) / near
        tiles = [(t, min(t + T, far)) for t in range(0, far, T)]
        true_share = torch.stack([e[:, a:b].sum(-1) for a, b in tiles], -1)            # (M, tiles)
        qn, kn, pn = q[h].norm(dim=-1), k[h].norm(dim=-1), pe.norm(dim=0)
        cs_share = torch.stack([(b - a) * torch.exp(qn * (kn[idx[:, a:b]].max(-1).values + pn[a:b].max())
                                                    / math.sqrt(D) - c[:, 0]) for a, b in tiles], -1)
        rel = lambda share: 1e-8 * share / near[:, None]
        cells = []
        for budget in half_ulp.values():
            for share in (cs_share, true_share):
                cells.append(f"{100 * float(skippable(share, rel, budget).median()):21.1f}%")
        print(f"{h:>4} {z:7.1f} {far:8d} {float(effect.median()):11.3g} (max {float(effect.max()):8.3g}) " + " ".join(cells))


if __name__ == "__main__":
    main()

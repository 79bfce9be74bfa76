#!/usr/bin/python3
"""An independent Python Transformer-XL with the module names of kimiyoung/transformer-xl's
MemTransformerLM (pytorch/mem_transformer.py, attn_type 0), for the import/export test.

It builds the model from a small JSON of hyperparameters, loads a state_dict with strict=True (so the
layout spanformer exports must have exactly the reference's names and shapes, tied tensors included),
writes the per-token log-probabilities of a spanformer token file evaluated in one stream (segments of
tgt_len, memories of mem_len, as the reference's eval.py with batch 1), and saves its own state_dict
(PyTorch's layout, written by PyTorch) for spanformer to import back.

usage: xl_reference.py CONFIG.json STATE_IN.pt TOKENS.bin LOGPROBS_OUT.txt STATE_OUT.pt
"""
import json
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class PositionalEmbedding(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.register_buffer("inv_freq", 1 / (10000 ** (torch.arange(0.0, d, 2.0) / d)))

    def forward(self, pos):  # (R) -> (R, d)
        x = torch.outer(pos, self.inv_freq)
        return torch.cat([x.sin(), x.cos()], -1)


class PositionwiseFF(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.CoreNet = nn.Sequential(nn.Linear(c["d_model"], c["d_inner"]), nn.ReLU(), nn.Dropout(0.0),
                                     nn.Linear(c["d_inner"], c["d_model"]), nn.Dropout(0.0))
        self.layer_norm = nn.LayerNorm(c["d_model"])
        self.pre_lnorm = c["pre_lnorm"]

    def forward(self, x):
        if self.pre_lnorm:
            return x + self.CoreNet(self.layer_norm(x))
        return self.layer_norm(x + self.CoreNet(x))


class RelPartialLearnableMultiHeadAttn(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.K, self.D, H = c["n_head"], c["d_head"], c["d_model"]
        self.qkv_net = nn.Linear(H, 3 * self.K * self.D, bias=False)
        self.o_net = nn.Linear(self.K * self.D, H, bias=False)
        self.layer_norm = nn.LayerNorm(H)
        self.r_net = nn.Linear(H, self.K * self.D, bias=False)
        if c["untie_r"]:
            self.r_w_bias = nn.Parameter(torch.zeros(self.K, self.D))
            self.r_r_bias = nn.Parameter(torch.zeros(self.K, self.D))
        self.pre_lnorm = c["pre_lnorm"]

    def forward(self, w, r, u, v, mask, mem):  # time-major: w (Q, B, H), r (Kl, H), mem (Mm, B, H)
        u = getattr(self, "r_w_bias", u)
        v = getattr(self, "r_r_bias", v)
        Q, B = w.shape[0], w.shape[1]
        cat = torch.cat([mem, w], 0)
        heads = self.qkv_net(self.layer_norm(cat) if self.pre_lnorm else cat)
        q, k, val = torch.chunk(heads, 3, -1)
        Kl = k.shape[0]
        q = q[-Q:].view(Q, B, self.K, self.D)
        k = k.view(Kl, B, self.K, self.D)
        val = val.view(Kl, B, self.K, self.D)
        rk = self.r_net(r).view(Kl, self.K, self.D)
        ac = torch.einsum("ibnd,jbnd->ijbn", q + u, k)
        bd = torch.einsum("ibnd,jnd->ijbn", q + v, rk)
        # relative shift: entry (i, j) takes the term of distance Mm + i - j
        bd = torch.cat([bd.new_zeros(Q, 1, B, self.K), bd], 1).view(Kl + 1, Q, B, self.K)[1:].view(Q, Kl, B, self.K)
        score = (ac + bd) / self.D ** 0.5
        score = score.masked_fill(mask[:, :, None, None], float("-inf"))
        prob = F.softmax(score, 1)
        out = torch.einsum("ijbn,jbnd->ibnd", prob, val).reshape(Q, B, self.K * self.D)
        out = self.o_net(out)
        return w + out if self.pre_lnorm else self.layer_norm(w + out)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dec_attn = RelPartialLearnableMultiHeadAttn(c)
        self.pos_ff = PositionwiseFF(c)


def clusters(c):
    return [0] + list(c["cutoffs"]) + [c["vocab"]]


class AdaptiveEmbedding(nn.Module):
    def __init__(self, c):
        super().__init__()
        E, P, b = c["d_embed"], c["d_model"], clusters(c)
        self.c, self.bounds = c, b
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if c["div_val"] == 1:
            self.emb_layers.append(nn.Embedding(c["vocab"], E))
            if P != E:
                self.emb_projs.append(nn.Parameter(torch.zeros(P, E)))
        else:
            for i in range(len(b) - 1):
                width = E // c["div_val"] ** i
                self.emb_layers.append(nn.Embedding(b[i + 1] - b[i], width))
                self.emb_projs.append(nn.Parameter(torch.zeros(P, width)))

    def forward(self, x):
        P = self.c["d_model"]
        if self.c["div_val"] == 1:
            e = self.emb_layers[0](x)
            if len(self.emb_projs):
                e = F.linear(e, self.emb_projs[0])
        else:
            flat = x.reshape(-1)
            e = torch.zeros(flat.numel(), P)
            for i in range(len(self.bounds) - 1):
                idx = ((flat >= self.bounds[i]) & (flat < self.bounds[i + 1])).nonzero().squeeze(1)
                if idx.numel():
                    e[idx] = F.linear(self.emb_layers[i](flat[idx] - self.bounds[i]), self.emb_projs[i])
            e = e.view(*x.shape, P)
        return e * P ** 0.5


class ProjectedAdaptiveLogSoftmax(nn.Module):
    def __init__(self, c):
        super().__init__()
        E, P, b = c["d_embed"], c["d_model"], clusters(c)
        self.c, self.bounds, n = c, b, len(c["cutoffs"])
        if n > 0:
            self.cluster_weight = nn.Parameter(torch.zeros(n, E))
            self.cluster_bias = nn.Parameter(torch.zeros(n))
        self.out_layers = nn.ModuleList()
        self.out_projs = nn.ParameterList()
        if c["div_val"] == 1:
            if P != E:
                for _ in range(n + 1):
                    self.out_projs.append(nn.Parameter(torch.zeros(P, E)))
            self.out_layers.append(nn.Linear(E, c["vocab"]))
        else:
            for i in range(n + 1):
                width = E // c["div_val"] ** i
                self.out_projs.append(nn.Parameter(torch.zeros(P, width)))
                self.out_layers.append(nn.Linear(width, b[i + 1] - b[i]))

    def log_prob(self, h):  # (N, P) -> (N, V), the reference's head/tail decomposition
        n, b = len(self.c["cutoffs"]), self.bounds
        parts = []
        for i in range(n + 1):
            if self.c["div_val"] == 1:
                w, bias = self.out_layers[0].weight[b[i]:b[i + 1]], self.out_layers[0].bias[b[i]:b[i + 1]]
            else:
                w, bias = self.out_layers[i].weight, self.out_layers[i].bias
            if i == 0 and n > 0:
                w, bias = torch.cat([w, self.cluster_weight]), torch.cat([bias, self.cluster_bias])
            proj = self.out_projs[i] if len(self.out_projs) else None
            x = h @ proj if proj is not None else h
            parts.append(F.log_softmax(F.linear(x, w, bias), -1))
        if n == 0:
            return parts[0]
        head = parts[0]
        out = [head[:, :b[1]]]
        for i in range(1, n + 1):
            out.append(head[:, -i, None] + parts[i])  # cluster i's logit sits at head column -i
        return torch.cat(out, -1)


class MemTransformerLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.word_emb = AdaptiveEmbedding(c)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["n_layer"])])
        self.crit = ProjectedAdaptiveLogSoftmax(c)
        if c["tie_weight"]:
            for i in range(len(self.crit.out_layers)):
                self.crit.out_layers[i].weight = self.word_emb.emb_layers[i].weight
        if c["tie_projs"]:
            for i in range(1, len(self.crit.out_projs)):
                self.crit.out_projs[i] = self.word_emb.emb_projs[0 if c["div_val"] == 1 else i]
        self.pos_emb = PositionalEmbedding(c["d_model"])
        if not c["untie_r"]:
            self.r_w_bias = nn.Parameter(torch.zeros(c["n_head"], c["d_head"]))
            self.r_r_bias = nn.Parameter(torch.zeros(c["n_head"], c["d_head"]))

    def forward(self, x, mems):  # x (Q, B); mems: n_layer + 1 tensors (Mm, B, H) -> hidden (Q, B, H)
        c, Q = self.c, x.shape[0]
        Mm = mems[0].shape[0]
        Kl = Mm + Q
        ones = torch.ones(Q, Kl, dtype=torch.bool)
        mask = torch.triu(ones, 1 + Mm)
        if c["same_length"]:
            over = Kl - c["mem_len"]
            mask = mask | torch.tril(ones, -(Q - over if over > 0 else Q))
        pos = torch.arange(Kl - 1, -1, -1.0)
        if c["clamp_len"] > 0:
            pos = pos.clamp(max=c["clamp_len"])
        r = self.pos_emb(pos)
        h = self.word_emb(x)
        hids = [h]
        for i, layer in enumerate(self.layers):
            h = layer.dec_attn(h, r, getattr(self, "r_w_bias", None), getattr(self, "r_r_bias", None), mask, mems[i])
            h = layer.pos_ff(h)
            hids.append(h)
        end = Mm + Q  # ext_len 0
        new = [torch.cat([m, s], 0)[max(0, end - c["mem_len"]):end] for m, s in zip(mems, hids)]
        return h, new


def read_tokens(path):
    raw = open(path, "rb").read()
    assert raw[:8] == b"SPFTOK01", path
    width, _, count = struct.unpack("<IIQ", raw[8:24])
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    return torch.from_numpy(np.frombuffer(raw[24:], dtype=dtype, count=count).astype(np.int64))


def main():
    config, state_in, tokens, logprobs_out, state_out = sys.argv[1:6]
    c = json.load(open(config))
    model = MemTransformerLM(c)
    model.load_state_dict(torch.load(state_in), strict=True)
    model.eval()
    t = read_tokens(tokens)
    mems = [torch.zeros(0, 1, c["d_model"]) for _ in range(c["n_layer"] + 1)]
    out = []
    with torch.no_grad():
        for i in range(0, len(t) - 1, c["tgt_len"]):
            seq = min(c["tgt_len"], len(t) - 1 - i)
            x, y = t[i:i + seq].view(seq, 1), t[i + 1:i + 1 + seq]
            h, mems = model(x, mems)
            lp = model.crit.log_prob(h.view(seq, -1))
            out.append(lp.gather(1, y.view(-1, 1)).view(-1))
    np.savetxt(logprobs_out, torch.cat(out).double().numpy(), fmt="%.9g")
    torch.save(dict(model.state_dict()), state_out)


if __name__ == "__main__":
    main()

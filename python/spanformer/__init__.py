"""spanformer from Python: the span-aware attention as a PyTorch operator, and any checkpoint.

    import spanformer                      # loads libspanformer_torch_ops.so
    out = torch.ops.spanformer.adaptive_span_attention(q, k, v, key_pe, span_ratio, attn_span)
    out = spanformer.adaptive_span_attention(q, k, v, key_pe, span_ratio, attn_span, ramp=32)
    out = spanformer.flash_attention(q, k, v, band=0)   # causal attention, tiled (CUDA: its kernels)

    m = spanformer.load("runs/demo")       # a run directory or checkpoint file, any family
    m.evaluate("test")                     # the record `spanformer eval --json` prints, as a dict
    m.generate("The ", tokens=100, seed=1) # sampled text (language models)
    m.translate(["Il fait froid."])        # seq2seq
    m.spans()                              # (layers, heads) learned spans, float64 tensor
    m.logits([5, 17, 3])                   # next-token logits (N, V) of token ids (gpt)
    m.attention(text="...")                # the weights `spanformer attention` draws, as tensors
    m.state_dict()                         # parameters by name (load them into a PyTorch module)
    spanformer.bleu(hyps, [refs])          # corpus BLEU as `spanformer eval` scores translations

Both operators are registered with torch.library (fake kernels, autograd): torch.compile(model,
fullgraph=True) compiles a module that calls them. The library is found through $SPANFORMER_TORCH_OPS,
then beside this package (pip install, or an installed tree), then in ../../build (a source checkout). Shapes and semantics: include/spanformer/ops/adaptive_span_attention.h.
"""
import json
import math
import numbers
import os

import torch

_NAME = "libspanformer_torch_ops.so"


def _library_path():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("SPANFORMER_TORCH_OPS", ""), os.path.join(here, _NAME),
                  os.path.join(here, "..", "..", "build", _NAME)]
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    raise ImportError(f"spanformer: {_NAME} not found (build it with CMake, or set SPANFORMER_TORCH_OPS)")


torch.ops.load_library(_library_path())


def _compile_caches_know_this_library(path):
    """torch.compile caches what it compiled under a key made from the traced program, which names the
    public operators but not the private ones they expand into (`_adaptive_span_attention_forward`, ...):
    after this library changes (a rebuild, an upgrade), a graph cached with an older one would call
    operators that no longer exist or compute otherwise. The loaded library's SHA-256 joins the key
    (torch.compiler.config.cache_key_tag, kept after any tag of the user's). Returns the tag, or None
    where this PyTorch has no such key."""
    import hashlib
    config = getattr(getattr(torch, "compiler", None), "config", None)
    if config is None or not hasattr(config, "cache_key_tag"):
        return None
    with open(path, "rb") as f:
        ours = "spanformer-" + hashlib.sha256(f.read()).hexdigest()[:16]
    tag = config.cache_key_tag or ""
    if ours not in tag:
        config.cache_key_tag = f"{tag}+{ours}" if tag else ours
    return config.cache_key_tag


_compile_caches_know_this_library(_library_path())


def _inductor_links_this_torch():
    """torch.compile's CPU kernels are linked with -L<Python's LIBDIR> ahead of torch/lib. Where another
    LibTorch sits in that LIBDIR (Debian's libtorch-dev in /usr/lib/x86_64-linux-gnu, which a machine
    building both LibTorch versions has), the linker takes its libtorch_cpu, which lacks the SLEEF symbols
    this torch's vectorised kernels call: Inductor's ISA probe fails and every compiled kernel is scalar,
    or loading one fails ("undefined symbol: Sleef_expf16_u10"). Only there, this torch's lib directory
    is put first. A no-op elsewhere, on PyTorch 1.x, and where Inductor's builder has no such hook."""
    import sysconfig
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    other = os.path.join(libdir, "libtorch_cpu.so")
    if not os.path.exists(other) or os.path.realpath(other) == os.path.realpath(os.path.join(torch_lib, "libtorch_cpu.so")):
        return False
    try:
        import torch._inductor.cpp_builder as builder
        original = builder._get_python_related_args
    except (ImportError, AttributeError):
        return False
    if getattr(original, "_spanformer", False):
        return True

    def python_related_args():
        include_dirs, lib_dirs = original()
        return include_dirs, [torch_lib] + [d for d in lib_dirs if d != torch_lib]

    python_related_args._spanformer = True
    builder._get_python_related_args = python_related_args
    return True


_inductor_links_this_torch()


def adaptive_span_attention(q, k, v, key_pe, span_ratio, attn_span, ramp=32.0, dropout=0.0, training=False, seed=-1):
    """q (B,K,M,D); k, v (B,K,W+M,D); key_pe (D,L); span_ratio (K) -> (B,K,M,D). Differentiable, and
    torch.compile(fullgraph=True) traces it. seed -1: a dropout stream drawn from torch's generator."""
    w = "adaptive_span_attention"
    return torch.ops.spanformer.adaptive_span_attention(q, k, v, key_pe, span_ratio, _arg(w, "attn_span", attn_span, int),
                                                        _arg(w, "ramp", ramp, float), _arg(w, "dropout", dropout, float),
                                                        _arg(w, "training", training, bool), _arg(w, "seed", seed, int))


def flash_attention(q, k, v, band=0, dropout=0.0, training=False, seed=-1, cuda_kernel=True, softcap=0.0, sinks=None,
                    key_ranges=None):
    """Causal attention: q (B,K,N,D); k, v (B,K,C,D), C >= N, query i at key position C - N + i, reading
    the last `band` keys (0: all earlier keys) -> (B,K,N,D). Differentiable; no N x C tensor is kept.
    softcap > 0 caps every score at softcap * tanh(s / softcap) (Gemma 2); sinks, a (K) tensor of
    logits, joins every row's softmax with no value (GPT-OSS), differentiable too.
    key_ranges, a (B, 2) integer tensor, makes a padded batch: row b reads keys first_b <= j < end_b only
    (left padding before first_b, right padding from end_b); its queries outside the range give 0.
    Semantics: include/spanformer/ops/flash_attention.h."""
    w = "flash_attention"
    return torch.ops.spanformer.flash_attention(q, k, v, _arg(w, "band", band, int), _arg(w, "dropout", dropout, float),
                                                _arg(w, "training", training, bool), _arg(w, "seed", seed, int),
                                                cuda_kernel=_arg(w, "cuda_kernel", cuda_kernel, bool),
                                                softcap=_arg(w, "softcap", softcap, float), sinks=sinks,
                                                key_ranges=key_ranges)


def cpu_half_products(mode=None):
    """How the CPU attention kernels (flash and adaptive span) multiply bfloat16 / float16 inputs, for the whole process:
    "native" (16-bit operands, float32 accumulation; what "auto" picks where the CPU has AMX, or
    AVX512-BF16 for bfloat16) or
    "widened" (converted to float32 first). mode: "auto", "widened" or "native" sets it; None only asks.
    Returns what bfloat16 inputs get now. SPANFORMER_CPU_HALF_PRODUCTS sets the starting mode."""
    if mode is not None and mode not in ("auto", "widened", "native"):
        raise ValueError(f"cpu_half_products: mode {mode!r}: expected 'auto', 'widened' or 'native'")
    return torch.ops.spanformer.cpu_half_products("" if mode is None else mode)


def _arg(where, name, value, kind):
    """`value` as `kind` (int, float, str or bool), or a TypeError that names the argument and the type it
    takes (rather than TorchScript's multi-line error about argument `_2`)."""
    symbolic = isinstance(value, (getattr(torch, "SymInt", ()), getattr(torch, "SymFloat", ())))  # torch.compile's
    if symbolic:
        return value
    ok = {int: isinstance(value, numbers.Integral) and not isinstance(value, bool),
          float: isinstance(value, numbers.Real) and not isinstance(value, bool),
          str: isinstance(value, (str, os.PathLike)),
          bool: isinstance(value, bool)}[kind]
    if not ok:
        raise TypeError(f"{where}: {name} must be {kind.__name__} (got {type(value).__name__} {value!r:.80})")
    if kind is int and not -2 ** 63 <= value < 2 ** 63:
        raise ValueError(f"{where}: {name} must fit in 64 bits (got {value})")
    return os.fspath(value) if kind is str else kind(value)


def _strings(where, name, values):
    if isinstance(values, (str, bytes)) or not all(isinstance(v, str) for v in values):
        raise TypeError(f"{where}: {name} must be a list of str (got {values!r:.80})")
    return list(values)


class Model:
    """A spanformer checkpoint of any family (adaptive-span, xl, par, gpt, seq2seq, vit), run by the
    same C++ code as the command line; CPU, with torch.get_num_threads() threads."""

    def __init__(self, path, **overrides):
        device = str(overrides.get("device", "cpu"))
        if device != "cpu":
            raise ValueError(f"spanformer.load: device={device!r}: models loaded from Python run on the CPU "
                             "(the command line's --device runs them on a GPU in a CUDA build)")
        args = [_override(key, value) for key, value in overrides.items()]
        self._m = torch.classes.spanformer.Model(os.fspath(path), args)
        self.family = self._m.family()
        self.config = json.loads(self._m.config())
        self.vocab = self._m.vocab()
        self.step = self._m.step()

    def __repr__(self):
        return f"spanformer.Model(family={self.family!r}, step={self.step}, vocab={len(self.vocab)})"

    def evaluate(self, split="test", data="", batch=-1):
        """`spanformer eval CKPT --split SPLIT --json` as a dict (bpc/ppl for language models, accuracy
        for vit, BLEU and accuracy for seq2seq). `data`: another prepared directory or data set."""
        return json.loads(self._m.evaluate(_arg("evaluate", "split", split, str), _arg("evaluate", "data", data, str),
                                           _arg("evaluate", "batch", batch, int)))

    def generate(self, prompt="\n", tokens=200, temperature=1.0, top_k=0, top_p=1.0, seed=1, errors="replace",
                 dtype="float32"):
        """The sampled continuation of `prompt` (the prompt itself not repeated): the bytes `spanformer
        generate` prints, decoded as UTF-8 with `errors` ("replace": U+FFFD in place of each run of bytes that
        is not valid UTF-8, which a byte-level model may sample; "strict" raises; "surrogateescape" keeps
        them reversible).
        errors=None returns the bytes themselves. dtype="bfloat16" (the gpt family) runs every step in
        bfloat16, as `spanformer generate --dtype bfloat16` does; the model keeps its float32 weights."""
        w = "generate"
        if _arg(w, "dtype", dtype, str) not in ("float32", "bfloat16"):
            raise ValueError(f"generate: dtype must be float32 or bfloat16 (got {dtype!r})")
        data = bytes(self._m.generate(_arg(w, "prompt", prompt, str), _arg(w, "tokens", tokens, int),
                                      _arg(w, "temperature", temperature, float), _arg(w, "top_k", top_k, int),
                                      _arg(w, "top_p", top_p, float), _arg(w, "seed", seed, int),
                                      dtype == "bfloat16").tolist())
        return data if errors is None else data.decode("utf-8", errors)

    def translate(self, sentences, beam=None, length_penalty=None):
        """Translations of source sentences (seq2seq); None: the config's beam and length penalty. beam: 1
        (greedy) up to the target vocabulary's size; length_penalty: a finite number >= 0."""
        if isinstance(sentences, str):
            sentences = [sentences]
        sentences = _strings("translate", "sentences", sentences)
        if beam is not None and _arg("translate", "beam", beam, int) < 1:
            raise ValueError(f"translate: beam must be positive (got {beam})")
        if length_penalty is not None:
            length_penalty = _arg("translate", "length_penalty", length_penalty, float)
            if not (math.isfinite(length_penalty) and length_penalty >= 0):
                raise ValueError(f"translate: length_penalty must be a finite number >= 0 (got {length_penalty})")
        return self._m.translate(sentences, -1 if beam is None else int(beam),
                                 -1.0 if length_penalty is None else length_penalty)

    def logits(self, ids):
        """The gpt family's next-token logits (N, V) for token ids at positions 0 .. N - 1 (N <= context)."""
        return self._m.logits([_arg("logits", "ids[]", i, int) for i in ids])

    def spans(self):
        """Learned spans in tokens, (layers, heads) float64 (adaptive-span models)."""
        return self._m.spans()

    def attention(self, text=None, texts=(), indices=(), split="test"):
        """The weights `spanformer attention` draws, float64:
        language models (text=...): one (1, K, n, S + 1) per layer, weight of query i on distance d;
        seq2seq (texts=[...] or indices of `split`): per sentence (L, K, T, S), or (T, S) recurrent;
        vit (indices of `split`'s images): one (b, K, N, N) per layer."""
        texts = _strings("attention", "text", [text] if text is not None else []) + _strings("attention", "texts", texts)
        return self._m.attention(texts, [_arg("attention", "indices[]", i, int) for i in indices],
                                 _arg("attention", "split", split, str))

    def state_dict(self):
        """Parameters and buffers by their names in spanformer checkpoints, as CPU tensors."""
        return dict(self._m.state_dict())


def plot_spans(spans, out, attn_span, ramp=32, title="", layout="auto"):
    """The picture `spanformer spans --out` draws, for spans from anywhere: spans[l][h] = z of head h in
    layer l, in tokens (spanformer.nn.AdaptiveSpan.spans() per layer); layout "curves" (each head's mask
    against distance, and the spans per layer on a log scale), "grid" (a heat map) or "auto". PNG, SVG
    or PDF by out's extension, with the numbers in a JSON file beside it. Returns out."""
    rows = [[float(z) for z in layer] for layer in spans]
    if not rows or any(len(r) != len(rows[0]) or not r for r in rows):
        raise ValueError("plot_spans: spans must be layers of the same number of heads (spans[l][h], tokens)")
    bad = [(l, h, z) for l, r in enumerate(rows) for h, z in enumerate(r) if not (math.isfinite(z) and z >= 0)]
    if bad:
        l, h, z = bad[0]
        raise ValueError(f"plot_spans: a span is a number of tokens >= 0 (layer {l} head {h}: {z})")
    return torch.ops.spanformer.plot_spans([z for r in rows for z in r], len(rows[0]), os.fspath(out),
                                           _arg("plot_spans", "attn_span", attn_span, int),
                                           _arg("plot_spans", "ramp", ramp, int), str(title), str(layout))


def report(run_dir, out=None, refresh=0):
    """Writes the run's self-contained HTML report (as `spanformer report RUN_DIR`); returns its path.
    refresh > 0 makes the page reload itself every `refresh` seconds."""
    run_dir = _arg("report", "run_dir", run_dir, str)
    out = _arg("report", "out", out, str) if out is not None else os.path.join(run_dir, "report.html")
    return torch.ops.spanformer.report(run_dir, out, _arg("report", "refresh", refresh, int))


def bleu(hyps, refs, tokenize=True):
    """Corpus BLEU as `spanformer eval` scores translations (sacrebleu's 13a tokenisation and defaults):
    hyps, a list of lines; refs, a list of reference streams, each a list as long as hyps. Returns a dict:
    score (0..100), bp, sys_len, ref_len, counts and totals (n-grams of order 1..4)."""
    hyps = _strings("bleu", "hyps", hyps)
    refs = [_strings("bleu", "refs[]", stream) for stream in refs]
    for i, stream in enumerate(refs):
        if len(stream) != len(hyps):
            raise ValueError(f"bleu: reference stream {i} has {len(stream)} lines for {len(hyps)} hypotheses "
                             "(each stream holds one reference per hypothesis)")
    flat = [line for stream in refs for line in stream]
    r = torch.ops.spanformer.corpus_bleu(hyps, flat, _arg("bleu", "tokenize", tokenize, bool))
    return {"score": r[0], "bp": r[1], "sys_len": int(r[2]), "ref_len": int(r[3]),
            "counts": [int(c) for c in r[4:8]], "totals": [int(t) for t in r[8:12]]}


def tokenize_13a(line):
    """sacrebleu's 13a tokenisation of one line, as spanformer's BLEU applies it."""
    if not isinstance(line, str):
        raise TypeError(f"tokenize_13a: line must be str (got {type(line).__name__} {line!r:.80})")
    return torch.ops.spanformer.tokenize_13a(line)


def load(path, **overrides):
    """A checkpoint file or run directory of any family. Keyword overrides change how the model runs,
    never what it is, as on the command line: load("runs/xl", eval_mem_len=1600)."""
    return Model(path, **overrides)


# ---- the command line's runner from Python ---------------------------------------------------------

def _tool():
    """The `spanformer` program: $SPANFORMER_CLI, the package's own (spanformer/bin), a source checkout's
    build, or the one on PATH."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.environ.get("SPANFORMER_CLI", ""), os.path.join(here, "bin", "spanformer"),
                 os.path.join(here, "..", "..", "build", "spanformer")):
        if path and os.access(path, os.X_OK):
            return path
    import shutil
    found = shutil.which("spanformer")
    if not found:
        raise RuntimeError("no spanformer program: set SPANFORMER_CLI or reinstall the package")
    return found


def _run(args, quiet):
    """Runs the program with its output passed through line by line (progress as it comes); the GIL is
    free while it runs. Ctrl-C is passed on once: the run saves its checkpoint and stops, then
    KeyboardInterrupt is raised here. A failure raises RuntimeError with the program's error line."""
    import signal
    import subprocess
    # Its own session: Ctrl-C reaches it from here only. SPANFORMER_PARENT_PID ties its life to this
    # process's: if this one is killed, the program stops as on SIGTERM (a run saves its checkpoint).
    env = {**os.environ, "SPANFORMER_PARENT_PID": str(os.getpid())}
    proc = subprocess.Popen([_tool(), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1, start_new_session=True, env=env)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if not quiet:
                print(line, end="", flush=True)
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        for line in proc.stdout:  # the run's last words ("checkpoint saved at step N")
            if not quiet:
                print(line, end="", flush=True)
        proc.wait()
        raise
    if rc < 0:  # ended by a signal (killed, out of memory): said as such, not as its last progress line
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        raise RuntimeError(f"spanformer: error: the program was killed by {name} (signal {-rc})")
    if rc != 0:
        errors = [l for l in lines if l.startswith("spanformer: error:")]
        raise RuntimeError((errors or lines or [f"spanformer exited with {rc}"])[-1])
    return lines


def _override(key, value):
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"--{key.replace('__', '.')}={value}"


def prepare(text, out, crlf_to_lf=False, quiet=True):
    """`spanformer data prepare TEXT --out OUT`: a byte-level data directory (train/valid/test 90/5/5,
    vocab.txt) from a text file. Returns out."""
    _run(["data", "prepare", os.fspath(text), "--out", os.fspath(out)] + (["--crlf-to-lf"] if crlf_to_lf else []), quiet)
    return os.fspath(out)


def train(config, out, data=None, resume=False, overwrite=False, threads=None, quiet=False, **overrides):
    """`spanformer train -c CONFIG --out OUT [--data DATA] --key=value ...` from Python: any family, the
    same progress lines (steps, tokens/s, loss, time left), the same files in OUT. Overrides are the
    command line's keys, with "__" for "." (train__amp="bf16" is --train.amp=bf16; nb_steps=300).
    Ctrl-C stops the run with its checkpoint saved (resume=True continues it) and raises KeyboardInterrupt.
    Returns the run's last log record (a dict: step, train and valid figures, spans, ...) with "run": OUT."""
    if threads is not None and _arg("train", "threads", threads, int) < 0:
        raise ValueError(f"train: threads must be >= 0 (got {threads}; 0 or None: the machine's)")
    args = (["--threads", str(threads)] if threads else []) + ["train", "-c", os.fspath(config), "--out", os.fspath(out)]
    if data is not None:
        args += ["--data", os.fspath(data)]
    args += (["--resume"] if resume else []) + (["--overwrite"] if overwrite else [])
    args += [_override(k, v) for k, v in overrides.items()]
    _run(args, quiet)
    log = os.path.join(os.fspath(out), "log.jsonl")
    records = [json.loads(line) for line in open(log) if line.strip()] if os.path.exists(log) else []
    return {**(records[-1] if records else {}), "run": os.fspath(out)}

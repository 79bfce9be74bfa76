"""spanformer.load() from Python against the command line, for a checkpoint of every family, each a small
model trained here by the CLI: adaptive span (bytes, Dickens), Transformer-XL and a PAR-layered XL (words,
WikiText-2), GPT (bytes; adaptive-span attention, so it has spans), the encoder-decoder Transformer
(a synthetic word-for-word language) and a ViT (Debian's Fashion-MNIST).

1. evaluate() returns the record `spanformer eval --json` prints: the same figure (bpc, ppl, BLEU,
   accuracy) and counts. Both run one thread, the same code (train/eval_checkpoint.h) on the same
   weights, so the figures must agree to rounding of the JSON text (1e-12);
2. generate() continues a prompt exactly as `spanformer generate --seed` does (same seed, same text);
   translate() as `spanformer translate`;
3. spans() equals `spanformer spans --json`; report() writes `spanformer report`'s page; state_dict()
   holds every parameter of the exported safetensors file, bit for bit;
4. attention() returns the weights behind `spanformer attention`: per layer (1, K, n, S + 1) for the
   adaptive-span model, (L, K, T, S) per sentence for the Transformer, (b, K, N, N) per layer for the
   ViT, every row a distribution (sums to 1 within 1e-6: adaptive span renormalises its masked weights
   by sum + 1e-8, as the reference does, so a row may fall short of 1 by 1e-8 / sum);
5. a missing checkpoint raises RuntimeError naming the path.
"""
import json
import os
import re

import pytest
import torch

import safetensors_io
import spanformer

torch.set_num_threads(1)


def close(a, b, tol=1e-12):
    assert abs(a - b) <= tol * max(1.0, abs(b)), (a, b)


def rows_are_distributions(w):
    sums = w.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-6, rtol=0), sums


def same_weights(cli, model, run, tmp):
    path = os.path.join(tmp, os.path.basename(run) + ".safetensors")
    cli("export", "safetensors", run, "-o", path)
    exported = safetensors_io.read(path)[0]
    mine = model.state_dict()
    assert exported, path
    for name, t in exported.items():
        assert name in mine, name
        assert torch.equal(mine[name].to(t.dtype), t), name


def same_generation(cli, model, run, prompt, words=False):
    """The same continuation; word models print the prompt and the words the CLI's way (space-joined)."""
    want = cli("generate", run, "--prompt", prompt, "--tokens", "40", "--seed", "3")
    got = model.generate(prompt, 40, seed=3)
    if words:
        assert want.split() == (prompt + " " + got).split() and len(got.split()) == 40, (want, got)
    else:
        assert want == prompt + got + "\n"


# ---- the tests -----------------------------------------------------------------------------------

def test_adaptive_span(cli, adaptive_span_run, tmp):
    run = adaptive_span_run
    m = spanformer.load(run)
    assert m.family == "adaptive-span" and m.step == 20 and len(m.vocab) > 30, m
    mine = m.evaluate("test", batch=4)
    theirs = json.loads(cli("eval", run, "--split", "test", "--batch", "4", "--json"))
    close(mine["bpc"], theirs["bpc"])
    assert mine["tokens"] == theirs["tokens"] and mine["blocks"] == theirs["blocks"], (mine, theirs)
    prompt = "It was the best of times"
    same_generation(cli, m, run, prompt)
    spans = json.loads(cli("spans", run, "--json", "--out", os.path.join(tmp, "s.png")))["spans"]
    assert torch.allclose(m.spans(), torch.tensor(spans, dtype=torch.float64), atol=1e-12, rtol=0)
    weights = m.attention(text=prompt + ", it was the worst of times")
    assert len(weights) == 2, len(weights)
    for w in weights:
        assert w.dtype == torch.float64 and w.dim() == 4 and w.shape[:2] == (1, 2), w.shape
        rows_are_distributions(w)
    same_weights(cli, m, run, tmp)


def test_report(cli, adaptive_span_run, tmp):
    """report(): the page the CLI writes, but for the time it was written."""
    page = spanformer.report(adaptive_span_run, os.path.join(tmp, "py.html"))
    cli("report", adaptive_span_run, "--out", os.path.join(tmp, "cli.html"))
    strip = lambda p: re.sub(r'"written":"[^"]*"', "", open(p).read())  # noqa: E731
    assert strip(page) == strip(os.path.join(tmp, "cli.html")) and "uPlot" in strip(page)


def test_report_refuses_a_log_nested_too_deep(adaptive_span_run, tmp):
    """A log line nesting 100,000 arrays: an exception naming the line, not a crash of the interpreter."""
    import shutil
    run = os.path.join(tmp, "deep")
    shutil.copytree(adaptive_span_run, run)
    with open(os.path.join(run, "log.jsonl"), "w") as f:
        f.write("[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(Exception, match="log.jsonl line 1: JSON nested deeper than 64 levels"):
        spanformer.report(run, os.path.join(tmp, "deep.html"))


def test_generate_bytes_that_are_not_utf8(cli, tmp):
    """A byte-level model trained on accented text samples, at a high temperature, continuation bytes
    without their lead byte: generate() returns what the CLI prints (errors=None: the bytes themselves;
    by default the text with U+FFFD in place of each invalid run), where it raised UnicodeDecodeError."""
    import subprocess
    text = "naïve café, déjà vu — señor Müller’s «Übermaß». " * 3000
    open(os.path.join(tmp, "accents.txt"), "w", encoding="utf-8").write(text)
    data, run = os.path.join(tmp, "accents"), os.path.join(tmp, "accents_run")
    cli("data", "prepare", os.path.join(tmp, "accents.txt"), "--out", data)
    json.dump({"model": {"nb_layers": 1, "hidden_size": 16, "inner_hidden_size": 32, "nb_heads": 2, "attn_span": 16,
                         "block_size": 16},
               "train": {"batch_size": 2, "nb_steps": 2, "eval_interval": 2, "eval_blocks": 1, "lr_warmup": 0}},
              open(os.path.join(tmp, "accents.json"), "w"))
    cli("train", "-c", os.path.join(tmp, "accents.json"), "--data", data, "--out", run, "--quiet")
    m = spanformer.load(run)
    invalid = 0
    for seed in range(1, 6):
        printed = subprocess.run([cli.path, "--threads", "1", "generate", run, "--prompt", "caf", "--tokens", "60",
                                  "--temperature", "3", "--seed", str(seed)], capture_output=True, check=True).stdout
        raw = m.generate("caf", 60, temperature=3.0, seed=seed, errors=None)
        assert isinstance(raw, bytes) and printed == b"caf" + raw + b"\n", (printed, raw)
        assert m.generate("caf", 60, temperature=3.0, seed=seed) == raw.decode("utf-8", "replace")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            invalid += 1
            with pytest.raises(UnicodeDecodeError):
                m.generate("caf", 60, temperature=3.0, seed=seed, errors="strict")
    assert invalid > 0, "no seed sampled bytes that are not UTF-8: the case is not exercised"


@pytest.fixture(params=["xl_run", "par_run"])
def xl_or_par_run(request):
    return request.getfixturevalue(request.param)


def test_xl_and_par(cli, xl_or_par_run, tmp):
    xl_run = xl_or_par_run
    m = spanformer.load(xl_run)
    assert m.family in ("xl", "par") and m.step == 10, m
    mine = m.evaluate("test")
    theirs = json.loads(cli("eval", xl_run, "--split", "test", "--json"))
    close(mine["ppl"], theirs["ppl"])
    assert mine["tokens"] == theirs["tokens"], (mine, theirs)
    same_generation(cli, m, xl_run, "The game", words=True)
    same_weights(cli, m, xl_run, tmp)
    # run-time overrides change how the model runs, never what it is
    longer = spanformer.load(xl_run, eval_mem_len=32).evaluate("test")
    assert "mem_len 32" in longer["protocol"] and longer["tokens"] == mine["tokens"], longer


def test_gpt(cli, gpt_run, tmp):
    m = spanformer.load(gpt_run)
    assert m.family == "gpt" and m.step == 10, m
    mine = m.evaluate("test")
    theirs = json.loads(cli("eval", gpt_run, "--split", "test", "--json"))
    close(mine["bpc"], theirs["bpc"])
    same_generation(cli, m, gpt_run, "It was")
    assert m.spans().shape == (2, 2)
    same_weights(cli, m, gpt_run, tmp)


def test_seq2seq(cli, seq2seq_run, tmp):
    m = spanformer.load(seq2seq_run)
    assert m.family == "seq2seq", m
    mine, theirs = m.evaluate(), json.loads(cli("eval", seq2seq_run, "--json"))
    close(mine["bleu"], theirs["bleu"])
    close(mine["accuracy"], theirs["accuracy"])
    sentences = ["Je vois le chat .", "Nous aimons un grand chien ."]
    want = cli("translate", seq2seq_run, "--beam", "2", "--text", sentences[0], "--text", sentences[1]).splitlines()
    assert m.translate(sentences, beam=2) == want
    weights = m.attention(texts=sentences)
    assert len(weights) == 2
    for w in weights:
        assert w.dim() == 4 and w.shape[:2] == (1, 2), w.shape  # (L, K, T, S)
        rows_are_distributions(w)
    same_weights(cli, m, seq2seq_run, tmp)


def test_vit(cli, vit_run, tmp):
    m = spanformer.load(vit_run)
    assert m.family == "vit", m
    mine, theirs = m.evaluate("valid"), json.loads(cli("eval", vit_run, "--split", "valid", "--json"))
    close(mine["accuracy"], theirs["accuracy"])
    close(mine["nll"], theirs["nll"])
    weights = m.attention(indices=[0, 3])
    assert len(weights) == 2 and weights[0].shape == (2, 2, 50, 50), [w.shape for w in weights]
    for w in weights:
        rows_are_distributions(w)
    same_weights(cli, m, vit_run, tmp)


def test_missing_checkpoint(tmp):
    with pytest.raises(RuntimeError) as e:
        spanformer.load(os.path.join(tmp, "missing"))
    assert "missing" in str(e.value).splitlines()[0], str(e.value)


def test_wrong_capability(adaptive_span_run):
    """A capability the family lacks is one clear error, not a crash."""
    with pytest.raises(RuntimeError) as e:
        spanformer.load(adaptive_span_run).translate(["x"])
    assert "family has no" in str(e.value).splitlines()[0], str(e.value)


def test_python_api_keeps_the_command_lines_checks(seq2seq_run, adaptive_span_run):
    """What the CLI refuses, the Python API refuses: one error naming the argument (not TorchScript's
    multi-line binding error about `_2`), and no silent default for a value the user gave."""
    tf = spanformer.load(seq2seq_run)
    V = tf.config["model"]["target_vocab"]
    for beam in (0, -2):
        with pytest.raises(ValueError, match=f"translate: beam must be positive \\(got {beam}\\)"):
            tf.translate("Le chat .", beam=beam)
    with pytest.raises(RuntimeError, match=f"beam {V + 1} is wider than the target vocabulary \\({V} tokens\\)"):
        tf.translate("Le chat .", beam=V + 1)
    with pytest.raises(RuntimeError, match="beam 1000000 is wider than the target vocabulary"):
        tf.translate("Le chat .", beam=10**6)
    for penalty in (float("nan"), float("inf"), -2.0):
        with pytest.raises(ValueError, match="translate: length_penalty must be a finite number >= 0"):
            tf.translate("Le chat .", length_penalty=penalty)
    with pytest.raises(TypeError, match="translate: beam must be int \\(got float 2.5\\)"):
        tf.translate("Le chat .", beam=2.5)
    # the config's beam, given explicitly and by default, translates the same
    assert tf.translate("Le chat .", beam=tf.config["run"]["beam"]) == tf.translate("Le chat .")

    lm = spanformer.load(adaptive_span_run)
    for call, message in [(lambda: lm.generate(5), "generate: prompt must be str (got int 5)"),
                          (lambda: lm.generate("a", tokens=1.5), "generate: tokens must be int (got float 1.5)"),
                          (lambda: lm.generate("a", tokens="3"), "generate: tokens must be int (got str '3')"),
                          (lambda: lm.generate("a", seed=True), "generate: seed must be int (got bool True)"),
                          (lambda: lm.evaluate(split=3), "evaluate: split must be str (got int 3)"),
                          (lambda: lm.attention(text=5), "attention: text must be a list of str"),
                          (lambda: spanformer.report(adaptive_span_run, refresh="1"), "report: refresh must be int")]:
        with pytest.raises(TypeError, match=re.escape(message)):
            call()
    with pytest.raises(ValueError, match="device='cuda': models loaded from Python run on the CPU"):
        spanformer.load(adaptive_span_run, device="cuda")
    # BLEU: a reference stream must hold one line per hypothesis (a longer one was read as two streams)
    with pytest.raises(ValueError, match="bleu: reference stream 0 has 2 lines for 1 hypotheses"):
        spanformer.bleu(["a b"], [["a b", "c"]])
    assert spanformer.bleu(["a b c d"], [["a b c d"]])["score"] == pytest.approx(100.0)


def test_peak_memory_is_the_commands_own_when_a_large_process_starts_it(cli):
    """`bench` reports its own peak resident memory, not its parent's: Linux carries a process's
    resident size across fork and exec into getrusage's maximum, so a command started from this
    process holding 1.5 GB (a benchmark script, a notebook) reported 1.5 GB and more. A tiny GPT's step
    needs a few hundred MB (measured 211 on a 2-core AMD EPYC), far below the parent's 1.5 GB."""
    here = os.path.dirname(os.path.abspath(__file__))
    config = os.path.join(here, "..", "..", "configs", "gpt", "bench_attention.json")
    held = b"\x01" * (1500 * 10 ** 6)  # written, so resident
    out = cli("bench", "-c", config, "--context=64", "--batch_size=1", "--steps", "1", "--warmup", "0", "--json")
    peak = json.loads(out.strip().splitlines()[-1])["peak_rss_mb"]
    assert 20 < peak < 1000, peak
    del held


def tiny_lm_config(path):
    json.dump({"model": {"nb_layers": 1, "hidden_size": 16, "inner_hidden_size": 32, "nb_heads": 2, "attn_span": 16,
                         "block_size": 16},
               "train": {"batch_size": 2, "nb_steps": 6, "eval_interval": 3, "eval_blocks": 1, "lr_warmup": 0}},
              open(path, "w"))
    return path


def test_train_and_prepare_from_python_are_the_command_line(shared, tmp_path, capsys):
    """spanformer.prepare and spanformer.train run the command line's runner: the progress lines come
    through, the run directory is the command's, the returned record is the log's last, overrides
    change what they name (nb_steps, and train__seed's "." gives other numbers), and a mistake is a
    RuntimeError carrying the command's one-line error."""
    text = tmp_path / "t.txt"
    text.write_bytes(open(os.path.join(shared, "data", "dickens.txt"), "rb").read()[:100000])
    data = spanformer.prepare(text, tmp_path / "data")
    assert sorted(os.listdir(data))[:3] == ["meta.json", "test.bin", "train.bin"]
    config = tiny_lm_config(tmp_path / "c.json")
    result = spanformer.train(config, tmp_path / "run", data=data, threads=1, nb_steps=4, train__seed=3)
    shown = capsys.readouterr().out
    assert "step       3 |" in shown and "trained 4 steps" in shown
    records = [json.loads(l) for l in open(tmp_path / "run" / "log.jsonl")]
    assert result == {**records[-1], "run": str(tmp_path / "run")} and result["step"] == 4
    other = spanformer.train(config, tmp_path / "run2", data=data, threads=1, quiet=True, nb_steps=4, train__seed=4)
    assert other["step"] == 4 and other["train_loss"] != result["train_loss"]
    assert capsys.readouterr().out == ""
    with pytest.raises(RuntimeError, match=r"^spanformer: error: .*run already holds a run: continue it with --resume"):
        spanformer.train(config, tmp_path / "run", data=data, quiet=True)
    with pytest.raises(RuntimeError, match=r"^spanformer: error: .*no_such_key"):
        spanformer.train(config, tmp_path / "run3", data=data, quiet=True, no_such_key=1)


def test_ctrl_c_in_python_stops_the_run_with_its_checkpoint(shared, tmp_path):
    """Ctrl-C while spanformer.train runs: the run saves its checkpoint and stops (once: the program has
    its own session, so only this process passes the interrupt on), KeyboardInterrupt reaches the
    caller, and resume=True continues from the saved step."""
    import signal
    import threading
    import time
    text = tmp_path / "t.txt"
    text.write_bytes(open(os.path.join(shared, "data", "dickens.txt"), "rb").read()[:100000])
    data = spanformer.prepare(text, tmp_path / "data")
    config = tiny_lm_config(tmp_path / "c.json")
    run = tmp_path / "run"

    main = threading.main_thread().ident

    def interrupt_after_first_record():
        for _ in range(1200):
            if (run / "log.jsonl").exists() and (run / "log.jsonl").stat().st_size:
                break
            time.sleep(0.1)
        # To the main thread, as a terminal's Ctrl-C reaches a program waiting on its child's output (a
        # process-wide kill may land in this thread and leave the main thread blocked in its read).
        signal.pthread_kill(main, signal.SIGINT)

    # Python leaves SIGINT ignored when it started that way (a background job of a non-interactive shell):
    # Ctrl-C's handler, as an interactive session has it, for the length of the test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_after_first_record, daemon=True).start()
    try:
        returned = spanformer.train(config, run, data=data, threads=1, quiet=True, nb_steps=10**9,
                                    checkpoint_interval=10**9)
    except KeyboardInterrupt:
        pass
    else:
        pytest.fail(f"spanformer.train returned instead of raising KeyboardInterrupt: {returned}")
    finally:
        signal.signal(signal.SIGINT, previous)
    saved = spanformer.load(str(run / "checkpoint.pt"))
    assert saved is not None
    step = json.loads(open(run / "log.jsonl").readlines()[-1])["step"]
    assert step >= 3
    result = spanformer.train(config, run, data=data, threads=1, quiet=True, resume=True, nb_steps=step + 3)
    assert result["step"] == step + 3


def _processes_running(needle):
    """The pids whose command line holds `needle` (a run directory's path)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            # The program by its file name (an installed one lies under .../python3.11/site-packages/).
            if needle in cmdline and "train" in cmdline and \
                    os.path.basename(cmdline.split("\0")[0]).startswith("spanformer"):
                pids.append(int(entry))
    return pids


def _children(parent):
    """The pids whose parent is `parent`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(entry))
    return pids


def test_a_killed_python_process_stops_its_training(shared, tmp_path):
    """The Python process that runs spanformer.train killed outright (SIGKILL: no handler runs): the
    training it started follows it (the program asks the kernel for a signal when its parent ends), saves
    its checkpoint and releases the run directory, rather than running on orphaned with the lock held;
    resume=True then continues it."""
    import fcntl
    import signal
    import subprocess
    import sys
    import time
    text = tmp_path / "t.txt"
    text.write_bytes(open(os.path.join(shared, "data", "dickens.txt"), "rb").read()[:100000])
    data = spanformer.prepare(text, tmp_path / "data")
    config = tiny_lm_config(tmp_path / "c.json")
    run = tmp_path / "run"
    # No validation and no checkpoint until the end: the program writes nothing a closed pipe would stop.
    script = (f"import spanformer; spanformer.train({str(config)!r}, {str(run)!r}, data={str(data)!r}, threads=1, "
              "quiet=True, nb_steps=10**9, eval_interval=10**9, checkpoint_interval=10**9)")

    def locked():
        with open(run / ".lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(lock, fcntl.LOCK_UN)
            return False

    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": os.path.dirname(
        os.path.dirname(spanformer.__file__))})
    try:
        for _ in range(1200):
            if (run / "train.log").exists() and locked():
                break
            time.sleep(0.1)
        time.sleep(2)  # some steps
        assert _processes_running(str(run)), "the training did not start"
        parent.kill()
        parent.wait()
        for _ in range(600):  # the training's stop: its checkpoint written, then the process gone
            if not _processes_running(str(run)):
                break
            time.sleep(0.1)
        assert not _processes_running(str(run)), "the training runs on without its Python process"
        assert not locked(), "the run directory is still locked"
        log = open(run / "train.log").read()
        said = re.search(r"checkpoint saved at step (\d+)", log)
        assert (run / "checkpoint.pt").exists(), f"the stop saved no checkpoint: {log[-500:]}"
        assert said, f"the stop said nothing in train.log: {log[-500:]}"
    finally:  # whatever failed above, nothing of this test runs on (its run asks for 10**9 steps)
        running = _processes_running(str(run)) + _children(parent.pid)
        parent.kill()
        parent.wait()
        for pid in running:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    step = int(said.group(1))
    result = spanformer.train(config, run, data=data, threads=1, quiet=True, resume=True, nb_steps=step + 2,
                              eval_interval=1)
    assert result["step"] == step + 2


def test_a_killed_training_is_said_killed(shared, tmp_path):
    """The program killed under spanformer.train (out of memory, a kill -9): a RuntimeError that says it
    was killed and by which signal, not its last progress line as if that were an error."""
    import signal
    import threading
    import time
    text = tmp_path / "t.txt"
    text.write_bytes(open(os.path.join(shared, "data", "dickens.txt"), "rb").read()[:100000])
    data = spanformer.prepare(text, tmp_path / "data")
    config = tiny_lm_config(tmp_path / "c.json")
    run = tmp_path / "run"

    def kill_after_first_record():
        for _ in range(1200):
            if (run / "log.jsonl").exists() and (run / "log.jsonl").stat().st_size:
                break
            time.sleep(0.1)
        pids = _processes_running(str(run))
        found.append(bool(pids))
        # Not found: this process's children are stopped all the same, so that the test fails rather than
        # waiting on 10**9 steps.
        for pid in pids or _children(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    found = []
    threading.Thread(target=kill_after_first_record, daemon=True).start()
    with pytest.raises(RuntimeError, match=r"^spanformer: error: the program was killed by SIGKILL \(signal 9\)$"):
        spanformer.train(config, run, data=data, threads=1, quiet=True, nb_steps=10**9, checkpoint_interval=10**9)
    assert found == [True], "the training's process was not found by its command line"


def test_python_arguments_of_load_and_train_take_python_types(shared, tmp_path):
    """Python values where the command line takes text: a bool override of load (adapt_span_cache=False
    here; eval_same_length=True of an XL model the same way) is the key set to false (not a refused
    "False"), and train(threads=1.7) is a TypeError rather than one thread."""
    text = tmp_path / "t.txt"
    text.write_bytes(open(os.path.join(shared, "data", "dickens.txt"), "rb").read()[:100000])
    data = spanformer.prepare(text, tmp_path / "data")
    config = tiny_lm_config(tmp_path / "c.json")
    spanformer.train(config, tmp_path / "run", data=data, threads=1, quiet=True, nb_steps=2)
    assert spanformer.load(str(tmp_path / "run"), adapt_span_cache=False).config["run"]["adapt_span_cache"] is False
    assert spanformer.load(str(tmp_path / "run"), adapt_span_cache=True).config["run"]["adapt_span_cache"] is True
    with pytest.raises(TypeError, match=r"^train: threads must be int \(got float 1.7\)$"):
        spanformer.train(config, tmp_path / "run2", data=data, threads=1.7, quiet=True, nb_steps=2)
    with pytest.raises(ValueError, match=r"^train: threads must be >= 0"):
        spanformer.train(config, tmp_path / "run2", data=data, threads=-2, quiet=True, nb_steps=2)
    assert not (tmp_path / "run2").exists()


def test_generate_in_bfloat16(cli, gpt_run, adaptive_span_run):
    """`generate --dtype bfloat16` (the gpt family): greedy decoding starts with the float32 model's first 5
    tokens (where their margins exceed bfloat16's rounding), sampling runs; another family and another dtype
    are one-line errors."""
    import subprocess
    greedy = [cli("generate", gpt_run, "--prompt", "It was", "--tokens", "20", "--top-k", "1", "--dtype", d)
              for d in ("float32", "bfloat16")]
    assert len(greedy[0]) == len("It was") + 20 + 1 and greedy[1][:len("It was") + 5] == greedy[0][:len("It was") + 5], greedy
    assert cli("generate", gpt_run, "--tokens", "30", "--dtype", "bfloat16", "--seed", "2").endswith("\n")
    for args, message in (((gpt_run, "--dtype", "float16"), "generate --dtype must be float32 or bfloat16 (got 'float16')"),
                          ((adaptive_span_run, "--dtype", "bfloat16"), "generate --dtype bfloat16 is for the gpt family")):
        done = subprocess.run([cli.path, "generate", *args, "--tokens", "5"], capture_output=True, text=True)
        assert done.returncode != 0 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_python_generate_in_bfloat16_as_the_command_line(cli, gpt_run, adaptive_span_run):
    """Model.generate(dtype="bfloat16") gives `generate --dtype bfloat16`'s text, greedy and sampled, and leaves
    the loaded model in float32: its evaluation and float32 text afterwards are those of before."""
    m = spanformer.load(gpt_run)
    before = m.evaluate("valid")["bpc"], m.generate("It was", 20, top_k=1)
    for kwargs, flags in (({"top_k": 1}, ["--top-k", "1"]), ({"seed": 2}, ["--seed", "2"])):
        want = cli("generate", gpt_run, "--prompt", "It was", "--tokens", "20", "--dtype", "bfloat16", *flags)
        assert want == "It was" + m.generate("It was", 20, dtype="bfloat16", **kwargs) + "\n"
    assert (m.evaluate("valid")["bpc"], m.generate("It was", 20, top_k=1)) == before
    with pytest.raises(ValueError, match=r"^generate: dtype must be float32 or bfloat16 \(got 'float16'\)$"):
        m.generate("It was", 5, dtype="float16")
    with pytest.raises(RuntimeError, match=r"^generate: dtype bfloat16 is for the gpt family \(this checkpoint is of the adaptive-span family\)$"):
        spanformer.load(adaptive_span_run).generate("It was", 5, dtype="bfloat16")

"""What the Python tests share: which spanformer they test and the command line beside it.

Two ways to run them (CTest does the first, scripts/test.sh the second for an installed wheel):
  build tree   SPANFORMER_TORCH_OPS=BUILD/libspanformer_torch_ops.so SPANFORMER_CLI=BUILD/spanformer \\
               .venv/bin/python -m pytest tests/python        (the package from python/, the module built)
  installed    VENV/bin/python -m pytest tests/python          (the installed package and its `spanformer`)
The data sets come from ../shared beside the checkout (SPANFORMER_SHARED_DIR to point elsewhere).
The trained models below (one small model per family, made by the CLI) serve test_load and test_oracles.
"""
import json
import os
import random
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
SHARED = os.environ.get("SPANFORMER_SHARED_DIR", os.path.join(SOURCE, "..", "shared"))
sys.path.insert(0, HERE)  # the helpers beside the tests (safetensors_io)
if os.environ.get("SPANFORMER_TORCH_OPS"):
    sys.path.insert(0, os.path.join(SOURCE, "python"))  # the package of this checkout, the module just built


def _cli_path():
    path = os.environ.get("SPANFORMER_CLI") or shutil.which("spanformer")
    if not path:
        raise RuntimeError("no spanformer command: set SPANFORMER_CLI or install the package")
    return path


class Cli:
    """The command line, one thread (so figures equal the Python side's to the last digit)."""

    def __init__(self, path):
        self.path = path

    def __call__(self, *args):
        done = subprocess.run([self.path, "--threads", "1", *args], capture_output=True, text=True)
        assert done.returncode == 0, f"spanformer {' '.join(args)}: {done.stderr}"
        return done.stdout


@pytest.fixture(scope="session")
def cli():
    return Cli(_cli_path())


@pytest.fixture(scope="session")
def shared():
    if not os.path.isdir(os.path.join(SHARED, "data")):
        pytest.fail(f"{SHARED}/data is missing: the shared data sets must sit beside the checkout")
    return SHARED


@pytest.fixture(scope="session")
def source():
    return SOURCE


# CI (scripts/test.sh) sets SPANFORMER_NO_SKIPS=1: a skipped test fails there, so a test that stopped
# running cannot pass as green. Only skips that name the PyTorch version they need are allowed (they
# fire on Debian's torch 1.13, never on the pinned 2.x).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("SPANFORMER_NO_SKIPS") == "1" and report.skipped:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "needs PyTorch" not in reason:
            report.outcome = "failed"
            report.longrepr = f"unexpected skip (SPANFORMER_NO_SKIPS=1): {reason}"


# ---- the trained models, one per family (module scope: trained once per test file) ---------------------

@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return str(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def byte_data(cli, shared, tmp):
    text = open(os.path.join(shared, "data", "dickens.txt"), "rb").read()[:200000]
    open(os.path.join(tmp, "d.txt"), "wb").write(text)
    cli("data", "prepare", os.path.join(tmp, "d.txt"), "--out", os.path.join(tmp, "data"))
    return os.path.join(tmp, "data")


@pytest.fixture(scope="module")
def word_data(cli, shared, tmp):
    wt2 = os.path.join(shared, "data", "wikitext-2")
    for name, n in (("train", 600), ("test", 150)):
        src = "wiki.valid.tokens" if name == "train" else "wiki.test.tokens"
        with open(os.path.join(wt2, src)) as f, open(os.path.join(tmp, name + ".tokens"), "w") as out:
            out.writelines(line for _, line in zip(range(n), f))
    test = os.path.join(tmp, "test.tokens")
    cli("data", "words", "--train", os.path.join(tmp, "train.tokens"), "--valid", test, "--test", test,
        "--out", os.path.join(tmp, "wt"))
    return os.path.join(tmp, "wt")


@pytest.fixture(scope="module")
def adaptive_span_run(cli, byte_data, tmp):
    json.dump({"model": {"nb_layers": 2, "hidden_size": 32, "inner_hidden_size": 64, "nb_heads": 2, "attn_span": 64,
                         "block_size": 32, "adapt_span_init": 0.2},
               "train": {"batch_size": 4, "nb_steps": 20, "eval_interval": 20, "eval_blocks": 4, "lr_warmup": 5}},
              open(os.path.join(tmp, "c.json"), "w"))
    run = os.path.join(tmp, "lm")
    cli("train", "-c", os.path.join(tmp, "c.json"), "--data", byte_data, "--out", run, "--quiet")
    return run


XL = {"arch": "xl",
      "model": {"n_layer": 2, "d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 64, "tgt_len": 16, "mem_len": 16,
                "dropout": 0.0},
      "train": {"batch_size": 4, "nb_steps": 10, "eval_interval": 10, "eval_segments": 4, "lr": 0.003,
                "warmup_steps": 2, "eval_tgt_len": 8, "eval_mem_len": 24, "eval_batch_size": 4}}


def train_xl(cli, word_data, tmp, kind):
    config = json.loads(json.dumps(XL))
    if kind == "par":  # PAR's searched layout: attention and feed-forward blocks in its own order
        config["model"]["layers"] = "afff"
    path = os.path.join(tmp, kind + ".json")
    json.dump(config, open(path, "w"))
    run = os.path.join(tmp, kind)
    cli("train", "-c", path, "--data", word_data, "--out", run, "--quiet")
    return run


@pytest.fixture(scope="module")
def xl_run(cli, word_data, tmp):
    return train_xl(cli, word_data, tmp, "xl")


@pytest.fixture(scope="module")
def par_run(cli, word_data, tmp):
    return train_xl(cli, word_data, tmp, "par")


@pytest.fixture(scope="module")
def gpt_run(cli, source, byte_data, tmp):
    run = os.path.join(tmp, "gpt")
    cli("train", "-c", os.path.join(source, "configs", "gpt", "demo.json"), "--data", byte_data, "--out", run,
        "--n_layer=2", "--d_model=32", "--n_head=2", "--context=64", "--batch_size=4", "--nb_steps=10",
        "--eval_interval=10", "--eval_blocks=2", "--lr_warmup=2", "--eval_batch_size=4",
        "--attention=adaptive_span", "--adapt_span_init=0.2", "--quiet")
    return run


@pytest.fixture(scope="module")
def seq2seq_run(cli, source, tmp):
    random.seed(4)
    en = "i you we see like the a cat dog house red big small".split()
    fr = "je tu nous vois aime le un chat chien maison rouge grand petit".split()
    with open(os.path.join(tmp, "pairs.txt"), "w") as f:
        for _ in range(1500):
            idx = [random.randrange(len(en)) for _ in range(random.randint(1, 6))]
            f.write(" ".join(en[i] for i in idx).capitalize() + ".\t" + " ".join(fr[i] for i in idx).capitalize() + " .\n")
    run = os.path.join(tmp, "tf")
    cli("train", "-c", os.path.join(source, "configs", "seq2seq", "transformer.json"), "--out", run, "--data",
        os.path.join(tmp, "pairs.txt"), "--d_model=32", "--n_layer=1", "--n_head=2", "--d_inner=64", "--dropout=0",
        "--max_length=8", "--valid_pairs=100", "--test_pairs=100", "--batch_size=32", "--nb_steps=60",
        "--eval_interval=60", "--lr_warmup=10", "--lr=3e-3", "--eval_batch_size=100", "--quiet")
    return run


FASHION = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="module")
def vit_run(cli, source, tmp):
    if not os.path.isdir(FASHION):
        pytest.fail(f"{FASHION} is missing: install Debian's dataset-fashion-mnist (scripts/install-deps.sh)")
    run = os.path.join(tmp, "vit")
    cli("train", "-c", os.path.join(source, "configs", "vit", "fashion_mnist.json"), "--out", run, "--d_model=16",
        "--d_inner=32", "--n_layer=2", "--n_head=2", "--batch_size=32", "--nb_steps=10", "--eval_interval=10",
        "--lr_warmup=2", "--valid_images=500", "--quiet")
    return run

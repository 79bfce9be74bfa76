"""spanformer beside Hugging Face's libraries, as their users run it: transformers 5.24.0 and tokenizers
0.23.3 (python/requirements.txt), in the same process as the installed package.

1. The GPT-2 layout: `spanformer export gpt2` opens in transformers' GPT2LMHeadModel with the same logits
   and greedy tokens, and a directory transformers saved imports back (`import gpt2`), tokenizer included.
2. GPT-2's byte-level BPE: `spanformer data tokenize` gives the tokenizers library's ids on a BPE that
   library trains here, and decodes them back to the same text.
3. transformers' models on our attention (`spanformer.hf`, attn_implementation="spanformer"): eager's
   logits, gradients and greedy tokens on GPT-2, grouped-query Llama, sliding-window Mistral, soft-capping
   and sinks, padded batches (left and right), and one-line refusals of what the op cannot express.

CI runs this file twice: in the suite stage against the build tree (CTest's python.hf) and in the
python stage against the installed wheel with transformers and tokenizers installed beside it.
"""
import json
import math
import os
import random
import subprocess

import pytest
import torch

import spanformer
from hf_models import KINDS, hf_model, hf_pair, prompt_ids

torch.set_num_threads(1)


# ---- 1. transformers: the GPT-2 layout --------------------------------------------------------------

def hf_gpt2(path):
    import transformers
    transformers.logging.set_verbosity_error()
    model = transformers.GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager")
    return model.eval()


def greedy(logits_of, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(logits_of(ids)[-1].argmax()))
    return ids


def dense_gpt_run(cli, byte_data, tmp, name, *extra):
    run = os.path.join(tmp, name)
    if not os.path.isdir(run):
        cli("train", "-c", os.path.join(os.path.dirname(__file__), "..", "..", "configs", "gpt", "demo.json"),
            "--data", byte_data, "--out", run, "--n_layer=2", "--d_model=32", "--n_head=2", "--context=64",
            "--batch_size=4", "--eval_interval=60", "--eval_blocks=2", "--lr_warmup=5", "--eval_batch_size=4",
            "--attention=dense", "--quiet", *extra)
    return run


@pytest.mark.parametrize("variant", [
    ("random", "--nb_steps=1", "--lr=1e-12", "--lr_min=0"),              # the initial weights
    ("trained", "--nb_steps=60", "--lr=3e-3"),                            # trained here
    ("untied_tanh", "--nb_steps=60", "--lr=3e-3", "--tie_weights=false", "--activation=gelu_tanh", "--d_inner=48"),
], ids=lambda v: v[0])
def test_gpt2_layout_both_ways(variant, cli, byte_data, tmp, tmp_path):
    """export gpt2 -> transformers' GPT2LMHeadModel: the same logits (1e-5) and greedy tokens; then the
    directory the library saves back (save_pretrained) -> import gpt2 -> the same logits again."""
    run = dense_gpt_run(cli, byte_data, tmp, "gpt2_" + variant[0], *variant[1:])
    ours = spanformer.load(run)
    out = str(tmp_path / "hf")
    cli("export", "gpt2", run, "-o", out)
    theirs = hf_gpt2(out)
    rng = random.Random(7)
    V = len(ours.vocab)
    ids = [rng.randrange(V) for _ in range(64)]
    with torch.no_grad():
        hf_logits = theirs(torch.tensor([ids])).logits[0]
    mine = ours.logits(ids)
    assert mine.shape == hf_logits.shape == (64, V)
    assert torch.allclose(mine, hf_logits, atol=1e-5, rtol=0), (mine - hf_logits).abs().max()
    with torch.no_grad():
        want = greedy(lambda x: theirs(torch.tensor([x])).logits[0], ids[:8], 30)
    assert greedy(ours.logits, ids[:8], 30) == want

    saved = str(tmp_path / "saved")
    theirs.save_pretrained(saved)  # the library's own directory: its config.json and model.safetensors
    for name in ("vocab.txt",):
        open(os.path.join(saved, name), "w").write(open(os.path.join(out, name)).read())
    back = str(tmp_path / "back.pt")
    cli("import", "gpt2", saved, "-o", back)
    again = spanformer.load(back).logits(ids)
    assert torch.allclose(again, hf_logits, atol=1e-5, rtol=0), (again - hf_logits).abs().max()
    assert torch.equal(again, mine)  # the same weights, bit for bit, after the round trip


def test_a_transformers_users_gpt2_opens_in_generate(cli, byte_data, tmp_path):
    """A GPT-2 a transformers user built and saved (their config: gelu_new, untied head, n_inner), over
    this byte vocabulary: import gpt2 with --vocab, then generate greedily (top_k 1) as the library does."""
    import transformers
    vocab = os.path.join(byte_data, "vocab.txt")
    V = sum(1 for _ in open(vocab))
    config = transformers.GPT2Config(vocab_size=V, n_positions=48, n_embd=24, n_layer=3, n_head=3, n_inner=40,
                                     tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(3)
    model = transformers.GPT2LMHeadModel(config).eval()
    saved = str(tmp_path / "user")
    model.save_pretrained(saved)
    checkpoint = str(tmp_path / "user.pt")
    cli("import", "gpt2", saved, "--vocab", vocab, "-o", checkpoint)
    tokens = [line.rstrip("\n") for line in open(vocab)]
    prompt = "It was"
    ids = [tokens.index(str(b)) for b in prompt.encode()]
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False, pad_token_id=0)[0].tolist()
    text = cli("generate", checkpoint, "--prompt", prompt, "--tokens", "20", "--top-k", "1")
    decode = lambda i: "\n" if tokens[i] == "<eos>" else bytes([int(tokens[i])]).decode("latin-1")  # noqa: E731
    assert text == "".join(decode(i) for i in want) + "\n", (text, want)


def trained_bpe(shared, where, vocab_size=2000):
    """A byte-level BPE trained here by `tokenizers` (GPT-2's kind: ByteLevel pre-tokenizer, no prefix
    space, <|endoftext|> as an added token) on 2 MB of Dickens: saved as tokenizer.json and as vocab.json
    + merges.txt in `where`. Returns the Tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    text = open(os.path.join(shared, "data", "dickens.txt"), encoding="utf-8", errors="replace").read()[:2_000_000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[i:i + 10000] for i in range(0, len(text), 10000)], trainer)
    os.makedirs(where, exist_ok=True)
    tok.save(os.path.join(where, "tokenizer.json"))
    tok.model.save(where)
    return tok


BPE_TEXTS = [
    "It was the best of times, it was the worst of times; it's I'd we'll they've you're she's.",
    "  runs   of spaces\n\n\tand tabs \t  \n",
    "naïve café, 東京タワー, Ελληνικά, 😀 emoji, ünïcödé.",
    "<|endoftext|>between two<|endoftext|>",
    " a leading space and a trailing one ",
    "digits 3.14159 and 1,000,000 and 42nd",
    "'quoted' don't 'S 'LL", "", "x" * 300, "no\u00a0break\u2003em space\u200bzero width",
]


def test_gpt2_byte_level_bpe_encodes_and_decodes_as_tokenizers_does(cli, shared, tmp_path):
    """`spanformer data tokenize` against the tokenizers library, on a byte-level BPE that library trained
    (2000 tokens): the same ids for text with unicode, runs of whitespace, contractions, digits and the
    added token, read from tokenizer.json and from vocab.json + merges.txt alike; decoding the library's
    ids gives the text back; bytes that are not UTF-8 (which the library cannot take) come back exactly;
    a missing or foreign tokenizer is one line."""
    tok = trained_bpe(shared, str(tmp_path / "bpe"))
    for i, text in enumerate(BPE_TEXTS):
        (tmp_path / f"t{i}.txt").write_bytes(text.encode())
        want = tok.encode(text).ids
        got_json = [int(x) for x in cli("data", "tokenize", "--tokenizer", str(tmp_path / "bpe" / "tokenizer.json"),
                                        str(tmp_path / f"t{i}.txt")).split()]
        assert got_json == want, (text, got_json[:30], want[:30])
        (tmp_path / f"ids{i}.txt").write_text(" ".join(map(str, want)))
        done = subprocess.run([cli.path, "data", "tokenize", "--tokenizer", str(tmp_path / "bpe" / "tokenizer.json"),
                               "--decode", str(tmp_path / f"ids{i}.txt")], capture_output=True, check=True)
        assert done.stdout == text.encode()
    merges_only = tmp_path / "merges_only"
    merges_only.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (merges_only / name).write_bytes((tmp_path / "bpe" / name).read_bytes())
    for i, text in enumerate(BPE_TEXTS):
        got = [int(x) for x in cli("data", "tokenize", "--tokenizer", str(merges_only), str(tmp_path / f"t{i}.txt")).split()]
        assert got == tok.encode(text).ids, text
    raw = b"ab\xff\xfecd \x80x \xe2\x82 end\xc3"
    (tmp_path / "raw.bin").write_bytes(raw)
    ids = cli("data", "tokenize", "--tokenizer", str(tmp_path / "bpe"), str(tmp_path / "raw.bin"))
    (tmp_path / "raw.ids").write_text(ids)
    back = subprocess.run([cli.path, "data", "tokenize", "--tokenizer", str(tmp_path / "bpe"), "--decode",
                           str(tmp_path / "raw.ids")], capture_output=True, check=True).stdout
    assert back == raw
    (tmp_path / "foreign.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 0}}}))
    for path, said in ((tmp_path / "nothing", "no such file or directory"), (merges_only.parent / "t0.txt", "not JSON"),
                       (tmp_path / "foreign.json", "the model is not BPE")):
        done = subprocess.run([cli.path, "data", "tokenize", "--tokenizer", str(path), str(tmp_path / "t0.txt")],
                              capture_output=True, text=True)
        assert done.returncode != 0 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_a_transformers_gpt2_with_its_tokenizer_generates_text_as_transformers_does(cli, shared, tmp_path):
    """A GPT-2 saved by transformers with its byte-level BPE tokenizer (tokenizer.json, vocab.json,
    merges.txt): import gpt2 keeps the tokenizer (no --vocab), and generate takes a text prompt and prints
    transformers' greedy continuation, decoded as its tokenizer decodes; export gpt2 writes the tokenizer
    back, and the re-imported model generates the same."""
    import transformers
    saved = tmp_path / "user"
    tok = trained_bpe(shared, str(saved))
    config = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(5)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(str(saved))
    checkpoint = str(tmp_path / "user.pt")
    cli("import", "gpt2", str(saved), "-o", checkpoint)
    prompt = "It was the best of times, it was"
    ids = tok.encode(prompt).ids
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=15, do_sample=False, pad_token_id=0)[0, len(ids):]
    text = cli("generate", checkpoint, "--prompt", prompt, "--tokens", "15", "--top-k", "1")
    assert text == prompt + tok.decode(want.tolist()) + "\n", (text, tok.decode(want.tolist()))  # the prompt, then the tokens
    exported = str(tmp_path / "exported")
    cli("export", "gpt2", checkpoint, "-o", exported)
    assert json.load(open(os.path.join(exported, "tokenizer.json"))) == json.load(open(saved / "tokenizer.json"))
    again = str(tmp_path / "again.pt")
    cli("import", "gpt2", exported, "-o", again)
    assert cli("generate", again, "--prompt", prompt, "--tokens", "15", "--top-k", "1") == text
    # eval --text: the text tokenized as the tokenizer does, scored in one window (it fits in the 64
    # positions): transformers' own loss on the same ids, and bits per byte of the text from it.
    passage = "It was the best of times,  it was the worst of times\u2014it was the age of wisdom. Caf\u00e9 d\u00e9j\u00e0 vu!\n"
    (tmp_path / "passage.txt").write_text(passage, encoding="utf-8")
    ids = tok.encode(passage).ids
    assert 2 <= len(ids) <= 65, len(ids)
    with torch.no_grad():
        loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    record = json.loads(cli("eval", checkpoint, "--text", str(tmp_path / "passage.txt"), "--json"))
    assert record["tokens"] == len(ids) - 1 and record["unit"] == "ppl", record
    assert abs(record["nll"] - loss) < 1e-5, (record["nll"], loss)
    assert abs(record["ppl"] - math.exp(loss)) < 1e-4 * math.exp(loss), record
    n_bytes = len(passage.encode())
    assert record["bytes"] == n_bytes
    assert abs(record["bits_per_byte"] - loss * (len(ids) - 1) / (n_bytes * math.log(2))) < 1e-5, record


# ---- 3. transformers: its models on our attention (spanformer.hf) -------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_transformers_models_on_our_flash_attention_give_eagers_logits_and_tokens(kind):
    """GPT-2 (also with scores divided by the layer number: a `scaling` other than D^-1/2), a Llama with
    grouped-query attention and a Mistral with 8-key sliding windows (shorter than the 40 tokens, so the
    band matters), attn_implementation="spanformer" against transformers' eager, each model built from
    its own config and checked to run what it says (hf_pair): logits within 1e-5 (float32 rounding of the
    same sums in another order) and the same 20 greedy tokens through generate(), which runs the KV cache
    (one query against C keys)."""
    eager, ours = hf_pair(kind)
    ids = prompt_ids()
    with torch.no_grad():
        want, got = eager(ids).logits, ours(ids).logits
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
        prompt = ids[:1, :6]
        args = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
        assert torch.equal(ours.generate(prompt, **args), eager.generate(prompt, **args))
    if kind == "mistral":  # the band is what makes them equal: the same model with dense attention differs
        eager.config.sliding_window = None
        with torch.no_grad():
            assert (eager(ids).logits - got).abs().max() > 1e-3
    if kind == "gpt2_layer_scaled":  # the layer's scaling is what makes them equal: without it they differ
        plain = hf_model("gpt2", "eager")
        plain.load_state_dict(eager.state_dict())
        with torch.no_grad():
            assert (plain(ids).logits - got).abs().max() > 1e-3


def test_transformers_refusals_are_one_line_value_errors():
    """What spanformer.hf cannot compute is a ValueError that names the way out, never other numbers: a
    layer made bidirectional (the module's is_causal, or is_causal=False passed down), attention weights
    asked for (output_attentions=True, which eager returns)."""
    eager, ours = hf_pair("llama")
    ids = prompt_ids()[:1, :8]
    with torch.no_grad():
        assert len(eager(ids, output_attentions=True).attentions) == 2  # what a user asking for them gets from eager
        with pytest.raises(ValueError, match=r"^spanformer: attention weights are never formed; use attn_implementation='eager'"):
            ours(ids, output_attentions=True)
        layer = next(m for m in ours.modules() if hasattr(m, "is_causal"))
        layer.is_causal = False
        with pytest.raises(ValueError, match=r"^spanformer: only causal self-attention is supported.*'sdpa'"):
            ours(ids)
        layer.is_causal = True
        from spanformer.hf import _attention
        q = torch.randn(1, 4, 3, 16)
        with pytest.raises(ValueError, match="only causal self-attention"):
            _attention(layer, q, q, q, None, is_causal=False)
        assert ours(ids).logits.shape == (1, 8, 97)  # the layer restored: it runs again


def test_transformers_models_with_soft_capping_and_sinks_give_eagers_logits_and_packed_rows_are_refused():
    """Gemma 2 (scores tanh-capped: `softcap`; its own query scale; sliding-window layers) and GPT-OSS (a
    learned sink logit per head: `s_aux`; grouped-query heads; sliding windows) on our attention against
    eager: logits within 1e-5 and, for a fine-tuning step, every gradient (the sinks' included) within
    1e-4 of eager's largest. Without the cap the logits differ (so the cap is what makes them equal). A
    batch of packed sequences (position_ids restarting within the row, which FlashAttention-2 would split)
    is a one-line ValueError."""
    import copy
    import transformers
    import spanformer.hf
    spanformer.hf.register()
    ids = prompt_ids()[:1, :24]

    def pair(config, cls):
        torch.manual_seed(5)
        eager = cls._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
        ours = cls._from_config(copy.deepcopy(config), attn_implementation="spanformer").eval()
        ours.load_state_dict(eager.state_dict())
        return eager, ours

    def same(eager, ours, what):
        want, got = eager(ids).logits, ours(ids).logits
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (what, (got - want).abs().max())
        for model in (eager, ours):
            model.zero_grad()
            model(ids, labels=ids).loss.backward()
        for (name, a), (_, b) in zip(eager.named_parameters(), ours.named_parameters()):
            scale = a.grad.abs().max().item() + 1e-12
            assert (a.grad - b.grad).abs().max().item() <= 1e-4 * scale, (what, name)
        return got

    gemma = transformers.Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=128, sliding_window=8, query_pre_attn_scalar=24,
                                      attn_logit_softcapping=2.0)
    eager, ours = pair(gemma, transformers.Gemma2ForCausalLM)
    for model in (eager, ours):  # larger scores, so that the cap of 2 bends them
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.data.mul_(8)
    capped = same(eager, ours, "gemma2")
    uncapped = copy.deepcopy(gemma)
    uncapped.attn_logit_softcapping = None
    plain, _ = pair(uncapped, transformers.Gemma2ForCausalLM)
    plain.load_state_dict(eager.state_dict())
    with torch.no_grad():
        assert (plain(ids).logits - capped).abs().max() > 1e-3
    oss = transformers.GptOssConfig(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, max_position_embeddings=128, sliding_window=8)
    eager, ours = pair(oss, transformers.GptOssForCausalLM)
    for model in (eager, ours):
        for layer in model.model.layers:
            layer.self_attn.sinks.data.normal_(generator=torch.Generator().manual_seed(1)).mul_(2)
    same(eager, ours, "gpt-oss")
    assert ours.model.layers[0].self_attn.sinks.grad.abs().max() > 0
    with torch.no_grad():
        eager, ours = hf_pair("llama")
        packed = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]])
        with pytest.raises(ValueError, match=r"^spanformer: packed sequences \(position_ids restarting within a row\)"):
            ours(ids[:, :12], position_ids=packed)
        straight = torch.arange(12)[None]
        assert torch.allclose(ours(ids[:, :12], position_ids=straight).logits,
                              eager(ids[:, :12], position_ids=straight).logits, atol=1e-5, rtol=0)


# Padded batches: four rows of 20 tokens (longer than Mistral's 8-key window): unpadded, left-padded by 5,
# right-padded after 13, and left-padded but for the last token.
PADDING = ((0, 20), (5, 20), (0, 13), (19, 20))


def padded_batch():
    """(ids, mask): (4, 20) each, 0 in ids where mask is 0."""
    mask = torch.zeros(len(PADDING), 20, dtype=torch.long)
    for b, (first, end) in enumerate(PADDING):
        mask[b, first:end] = 1
    return prompt_ids()[:1, :20].repeat(len(PADDING), 1) * mask, mask


@pytest.mark.parametrize("kind", ("gpt2", "llama", "mistral"))
def test_transformers_padded_batches_give_eagers_logits_gradients_and_tokens(kind):
    """A padded batch through attn_implementation="spanformer" (the mask becomes the op's key_ranges):
    at every real token, float32 logits within 1e-5 of eager's (the same sums in another order), and the
    gradients of a fine-tuning step (cross-entropy on the real tokens that follow a real token) within
    1e-4 relative; bfloat16
    logits no farther from eager's float32 than twice eager's own bfloat16 (plus its rounding); greedy
    generation of a left-padded batch gives eager's tokens and each row's tokens generated alone."""
    eager, ours = hf_pair(kind)
    ids, mask = padded_batch()
    real = mask.bool()
    with torch.no_grad():
        want, got = eager(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert torch.allclose(got[real], want[real], atol=1e-5, rtol=0), (got - want)[real].abs().max()
    assert (ours(ids).logits[real] - got[real]).abs().max() > 1e-3  # the mask is not ignored
    # The first real token of a row is not predicted (it would be read from a padded position, whose
    # output eager fills with an average of the row and FlashAttention-2, as the op, with 0).
    labels = ids.masked_fill(~real, -100)
    labels[torch.arange(len(PADDING)), torch.tensor([f for f, _ in PADDING])] = -100
    grads = []
    for model in (eager, ours):
        model.zero_grad()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert torch.allclose(grads[1][name], g, atol=1e-4 * (1 + g.abs().max().item()), rtol=0), name
    with torch.no_grad():
        half_eager, half_ours = (hf_model(kind, impl).to(torch.bfloat16) for impl in ("eager", "spanformer"))
        half_eager.load_state_dict(eager.state_dict())
        half_ours.load_state_dict(eager.state_dict())
        own = (half_eager(ids, attention_mask=mask).logits.float() - want)[real].abs().max()
        ours_err = (half_ours(ids, attention_mask=mask).logits.float() - want)[real].abs().max()
        assert ours_err <= 2 * own + 0.05, (ours_err, own)
        left = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 0, 0, 9, 3]])
        left_mask = (torch.arange(8) >= torch.tensor([3, 0, 6])[:, None]).long()
        args = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
        batched = ours.generate(left, attention_mask=left_mask, **args)
        assert torch.equal(batched, eager.generate(left, attention_mask=left_mask, **args))
        for b in range(3):
            alone = ours.generate(left[b:b + 1, left_mask[b].bool()], **args)
            assert torch.equal(batched[b, 8:], alone[0, alone.shape[1] - 12:]), b


def test_transformers_masks_other_than_padding_are_refused_by_name():
    """A 4-D causal mask with padding is taken like the 2-D one (eager's logits); a mask with a hole
    inside a row (a 0 between two 1s) or a 4-D mask of another pattern is a ValueError that names the
    way out, not silently other logits."""
    eager, ours = hf_pair("llama")
    ids, mask = padded_batch()
    real = mask.bool()
    causal = torch.tril(torch.ones(20, 20, dtype=torch.bool))
    four = causal[None, None] & real[:, None, None, :] & real[:, None, :, None]  # (4, 1, 20, 20)
    with torch.no_grad():
        want = eager(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=four).logits
        assert torch.allclose(got[real], want[real], atol=1e-5, rtol=0), (got - want)[real].abs().max()
        holed = mask.clone()
        holed[0, 7] = 0
        with pytest.raises(ValueError, match=r"^spanformer: this attention_mask is not a causal mask with padding.*'sdpa'"):
            ours(ids, attention_mask=holed)
        bidirectional = real[:, None, None, :] & real[:, None, :, None]
        with pytest.raises(ValueError, match=r"^spanformer: this attention_mask is not a causal mask with padding"):
            ours(ids, attention_mask=bidirectional)

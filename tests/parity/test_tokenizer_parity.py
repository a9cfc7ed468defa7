#!/usr/bin/env python3
"""test_tokenizer_parity.py: snug's tokenizer against Hugging Face `tokenizers`, id for id.

Builds a corpus of more than 5 MB (fortunes as prose, Python stdlib sources as code, numbers, runs of spaces and
newlines, CJK, emoji, other scripts, Unicode spaces, invalid UTF-8 bytes and special-token strings), builds one
tokenizer per supported family with the `tokenizers` package (trained on part of the corpus), saves each
tokenizer.json, encodes every document (build_families: the whole corpus; build_extra_families, the other
pre-tokenizers: a slice of it) with snug (tests/parity/tok_driver.c, compiled here with gcc) and with `tokenizers`
(add_special_tokens=False, on the text decoded with errors="replace"), and compares:
  - the ids of every document (the first mismatch is shown with context);
  - snug's decode against `tokenizers`' decode(ids, skip_special_tokens=False);
  - decode(encode(x)) == x for the byte-level families without a prefix space or normalizer;
  - vocab size, and encode(add_special_tokens=True) against snug's BOS and EOS around the ids;
  - the same ids when 3 threads encode at once on one tokenizer.
Prints "N passed, M failed" and exits non-zero on any failure.

Run with the venv python: /root/.cache/snug/venv/bin/python tests/parity/test_tokenizer_parity.py
Env: SNUG_SOURCE_DIR (repository root; default: two folders up), CC (default gcc), SNUG_TOK_CORPUS_MB (default 5.5),
SNUG_TOK_KEEP=dir (keep the corpus and tokenizer files there).
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.environ.get("SNUG_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIAL_STRINGS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>",
                   "<|eot_id|>", "<|start_header_id|>", "<|reserved_special_token_3|>", "<s>", "</s>", "<unk>",
                   "<mask>", " <mask> ", "  <mask>", "snug", " snug ", "snugly", "_snug", " banana split ",
                   "<|im_", "<<s>>", "<s><s>", "</s >", "<0x41>", "<0xE4><0xB8>", "\u2581", "\u2581\u2581x"]

# Documents for the character-class pre-tokenizers (Digits, Punctuation, Whitespace, UnicodeScripts...): digit runs in
# several scripts, number-like symbols, punctuation runs, the characters Rust's \w holds beyond letters and digits,
# scripts switching with and without spaces, characters UnicodeScripts' table does not know.
STRESS = ["1234567890", "abc123def4567", "x1y22z333",
          "\uff11\uff12\uff13 \u0661\u0662\u0663 \u0967\u0968 \u00bd\u00b2\u2167 \u2460\u2461",
          "3.14, 2,718; (42)!", "a!!,b..c?!\u2014d\u00bfe\u00a1f\u3002g\u300ch\u300d", "$100 + 5% = <x> ^ `y` | ~z",
          "snake_case x_y __init__", "\u24b6\u24d1 \U0001F130x", "a\u200db\u200cc", "e\u0301 \u0301x",
          " \u6771\u4eac", "  abc",
          "\u6771\u4eac\u3072\u3089\u30ab\u30bf\u30fc\u30fc abc \u041f\u0440\u0438\u0432\u0435\u0442!!",
          "\u30fcabc", "abc\u30fc", "\U0001F972\U0001FAE0 abc \U0001F972",
          "\uac00\ub098 abc \u0e2a\u0e27\u0e31 \u05e9\u05dc",
          "a\r\nb\r\n\r\n", "\ttab\t\tx\t", "\x0b\x0c\x1c\x1d\x1e\x1f\x85", "\u00a0\u2003\u3000x\u2028y", "x" * 37,
          "a1\u3000\u4e00" * 20, "<|endoftext|>123<|im_start|> 456", "2024-12-07T18:44:27Z", "0x1F600 1e-9 -0.5",
          "\ufeffBOM \u200b\u200f x\ufffd \u2581a</w>b </w>"]

# ---------------------------------------------------------------- corpus

def fortunes():
    out = []
    d = "/usr/share/games/fortunes"
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            if name.endswith(".dat") or os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb") as f:
                out += [e for e in f.read().split(b"\n%\n") if e.strip()]
    return out


def python_sources():
    d = os.path.dirname(os.__file__)
    out = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".py"):
            with open(os.path.join(d, name), "rb") as f:
                out.append(f.read())
    return out


CJK_SENTENCES = ["我们今天去公园散步，天气非常好。", "東京は日本の首都です。ひらがなとカタカナ、漢字を使います。",
                 "안녕하세요, 만나서 반갑습니다. 한국어 문장입니다.", "机器学习模型需要大量的训练数据。",
                 "「こんにちは」と彼は言った。", "大規模言語モデル（LLM）の訓練。"]
OTHER_SCRIPTS = ["Привет, как дела? Ёлка и щи.", "Καλημέρα κόσμε, ΣΟΦΙΑ σοφός.", "مرحبا بالعالم، كيف حالك؟",
                 "שלום עולם", "नमस्ते दुनिया, हिन्दी पाठ।", "สวัสดีครับ ภาษาไทย", "Ünïcödé façade naïve café résumé",
                 "e\u0301te\u0301 cafe\u0301 A\u030a \u212b \u00c5 o\u0308", "ﬁnancial ﬂow ＦＵＬＬＷＩＤＴＨ ｶﾀｶﾅ ①②③ ㍿",
                 "İstanbul ıi ß ẞ ΣΑΣ ǅ", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇"]
EMOJI = ["😀", "😂", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "❤️", "🔥", "🤖", "🧑🏿‍💻", "🏳️‍🌈", "✨", "🥲", "🫠"]
UNICODE_SPACES = ["\u00a0", "\u2000", "\u2003", "\u200a", "\u3000", "\u180e", "\u0085", "\u2028", "\u2029",
                  "\u200b", "\u202f", "\u205f", "\u1680", "\t", "\v", "\f", "\r", "\r\n", "\x1c", "\x00"]
INVALID = [b"\x80", b"\xff", b"\xfe\xfe", b"\xc0\xaf", b"\xe4\xb8", b"\xe4", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
           b"\xf0\x9f\x98", b"\xc3", b"\xe2\x82", b"\xbf\xbf\xbf", b"\xf8\x88\x80\x80\x80", b"a\xe9b", b"\xc2\x41"]


def make_corpus(rng, target):
    prose, code = fortunes(), python_sources()
    code_lines = [ln for src in code for ln in src.split(b"\n")]

    def f_prose():
        return rng.choice(prose) if prose else b"The quick brown fox jumps over the lazy dog."

    def f_code():
        i = rng.randrange(len(code_lines))
        return b"\n".join(code_lines[i:i + rng.randint(3, 60)])

    def f_numbers():
        parts = [str(rng.randint(0, 10 ** rng.randint(1, 15))), f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}",
                 f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                 f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
                 "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40))), f"{rng.random():e}",
                 f"0x{rng.getrandbits(32):08X}", "1,234,567.89", "3.14159265358979", "١٢٣٤٥ ൧൨ ½ ² Ⅻ"]
        return " ".join(rng.sample(parts, rng.randint(1, 5))).encode()

    def f_space():
        unit = rng.choice([" ", "\n", "\t", " \n", "\n\n", "\r\n", "  \t", " ", " "])
        return (unit * rng.randint(1, 40)).encode()

    def f_cjk():
        if rng.random() < 0.5:
            return rng.choice(CJK_SENTENCES).encode()
        lo, hi = rng.choice([(0x4E00, 0x9FFF), (0x3040, 0x30FF), (0xAC00, 0xD7A3), (0x3400, 0x4DBF)])
        return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 30))).encode()

    def f_emoji():
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 8))).encode()

    def f_script():
        return rng.choice(OTHER_SCRIPTS).encode()

    def f_uspace():
        return "".join(rng.choice(UNICODE_SPACES + ["a", "b", " ", "1"]) for _ in range(rng.randint(1, 10))).encode()

    def f_invalid():
        return b"".join(rng.choice(INVALID + [b"x", b" "]) for _ in range(rng.randint(1, 6)))

    def f_special():
        return "".join(rng.choice(SPECIAL_STRINGS + [" ", "a", "\n"]) for _ in range(rng.randint(1, 6))).encode()

    def f_long():
        return rng.choice([b" " * rng.randint(500, 5000), b"\n" * rng.randint(100, 2000),
                           b"a" * rng.randint(200, 3000), b"ab" * rng.randint(100, 1000),
                           "字".encode() * rng.randint(50, 500), b"0123456789" * rng.randint(10, 200),
                           b"-" * rng.randint(50, 500)])

    gens = [(f_prose, 30), (f_code, 25), (f_numbers, 8), (f_space, 8), (f_cjk, 6), (f_emoji, 4), (f_script, 5),
            (f_uspace, 4), (f_invalid, 4), (f_special, 6), (f_long, 1)]
    funcs = [g for g, w in gens for _ in range(w)]
    seps = [b"", b" ", b"\n", b"\n\n", b"  ", b"\t"]
    docs, size = [], 0
    # a few whole source files as long documents
    for src in rng.sample(code, 4):
        docs.append(src)
        size += len(src)
    while size < target:
        doc = b""
        for _ in range(rng.randint(1, 14)):
            doc += rng.choice(seps) + rng.choice(funcs)()
        docs.append(doc)
        size += len(doc)
    # many tiny documents: the boundaries (start of text, next to a special token, at the end) in every combination
    tiny = [" ", "  ", "\n", "\t", "\r\n", "a", "A", "hello", "Hello", " world", "'s", "'S", "'ll", "\u017f",
            "\u212a", "1", "123", "1234567", "\u00bd", "e\u0301", "\u00e9", "\u2581", "\u2581\u2581", "<s>", "</s>",
            "<unk>", "<|endoftext|>", "<|im_start|>", "<|begin_of_text|>", "<mask>", "snug", "banana",
            " banana split", "[SEP]", "year", "2024", "\u65e5\u672c", "\U0001F600", "\u00a0", "\u3000", "\u180e",
            "\u0085", "\x00", "!", "...", "--", "$", "\u0130", "\u00df", "\u03a3", "\u01c5", "#", "##", "</w>",
            "cafe\u0301", "\u0301"]
    tiny = [t.encode() for t in tiny] + [b"\xff", b"\xe4\xb8", b"\xed\xa0\x80"]
    for _ in range(20000):
        docs.append(b"".join(rng.choice(tiny) for _ in range(rng.randint(1, 5))))
    docs += [b"", b" ", b"\n", b"<s>", b" <s>", b"<|endoftext|>", b"a", "\u2581".encode(), b"\xff", b"  hello"]
    docs += [t.encode() for t in STRESS]
    return docs


# ---------------------------------------------------------------- tokenizers

def train(texts, model, pre, normalizer=None, vocab_size=6000, byte_level=True, special=()):
    tok = Tokenizer(model)
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    kw = dict(vocab_size=vocab_size, show_progress=False, special_tokens=list(special))
    if byte_level:
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    else:
        kw["limit_alphabet"] = 300
    tok.train_from_iterator(texts, trainers.BpeTrainer(**kw))
    return json.loads(tok.to_str())


def added(content, special=True, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return AddedToken(content, special=special, lstrip=lstrip, rstrip=rstrip, single_word=single_word,
                      normalized=(not special) if normalized is None else normalized)


def finish(j, adds):
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_tokens(adds)
    return tok


def template(bos, bos_id):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def build_families(texts):
    fams = []  # (name, Tokenizer, roundtrip?)
    bl_adds = [added("<|endoftext|>"), added("<|im_start|>"), added("<|im_end|>"),
               added("<mask>", lstrip=True), added("snug", special=False, single_word=True, normalized=False),
               added(" banana split", special=False, rstrip=True, normalized=True)]

    # (a) GPT-2 byte-level BPE
    j = train(texts, models.BPE(), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    fams.append(("gpt2", finish(j, bl_adds), True))
    j2 = json.loads(json.dumps(j))
    j2["pre_tokenizer"]["add_prefix_space"] = True
    j2["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j2["model"]["merges"]]  # string form
    fams.append(("gpt2-prefix-space", finish(j2, bl_adds), False))

    # (b) Llama-3: Split(regex) + ByteLevel(use_regex=false), ignore_merges, BOS from TemplateProcessing
    split = pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False)
    j = train(texts, models.BPE(ignore_merges=True),
              pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    j["model"]["ignore_merges"] = True
    # Like tiktoken-derived vocabularies, add whole pre-tokens that no merge sequence builds: ignore_merges is what
    # emits them as one token.
    pre = Tokenizer.from_str(json.dumps(j)).pre_tokenizer
    words = sorted({w for t in texts[:200] for w, _ in pre.pre_tokenize_str(t) if len(w) >= 6})
    vocab = j["model"]["vocab"]
    for w in random.Random(7).sample(words, min(400, len(words))):
        vocab.setdefault(w, len(vocab))
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    n = max(j["model"]["vocab"].values()) + 1
    j["post_processor"] = template("<|begin_of_text|>", n)
    fams.append(("llama3", finish(j, [added("<|begin_of_text|>"), added("<|end_of_text|>"),
                                      added("<|start_header_id|>"), added("<|eot_id|>"),
                                      added("<|reserved_special_token_3|>")] + bl_adds[:3]), True))

    # (b) Qwen2: NFC + Split(\p{N} one digit at a time) + ByteLevel, no BOS
    split = pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False)
    j = train(texts, models.BPE(),
              pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
              normalizer=normalizers.NFC())
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    fams.append(("qwen2", finish(j, [added("<|endoftext|>"), added("<|im_start|>"), added("<|im_end|>"),
                                     added("cafe\u0301", special=False, normalized=True)]), False))

    # (c) SentencePiece-style BPE with byte fallback (Llama 2 / Mistral / TinyLlama conversions)
    j = train(texts, models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True),
              pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True),
              vocab_size=4000, byte_level=False, special=["<unk>", "<s>", "</s>"])
    old = j["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = 3 + b
    for tokstr, _ in sorted(old.items(), key=lambda kv: kv[1]):
        if tokstr not in vocab:
            vocab[tokstr] = len(vocab)
    j["model"]["vocab"] = vocab
    j["added_tokens"] = [{"id": vocab[c], "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for c in ("<unk>", "<s>", "</s>")]
    j["post_processor"] = template("<s>", 1)
    sp_decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}

    legacy = json.loads(json.dumps(j))
    legacy["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                                {"type": "Replace", "pattern": {"String": " "},
                                                                 "content": "\u2581"}]}
    legacy["pre_tokenizer"] = None
    legacy["decoder"] = sp_decoder
    fams.append(("sp-legacy", finish(legacy, [added("<mask>", rstrip=True),
                                              added("banana", special=False, normalized=True)]), False))

    meta = json.loads(json.dumps(j))
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    meta["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    fams.append(("sp-metaspace-first", finish(meta, []), False))

    old_form = json.loads(json.dumps(j))
    old_form["normalizer"] = None
    old_form["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}
    old_form["decoder"] = sp_decoder
    fams.append(("sp-metaspace-old-split", finish(old_form, []), False))

    unk = json.loads(json.dumps(j))
    unk["model"]["byte_fallback"] = False
    unk["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}
    unk["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True}
    unk["decoder"] = sp_decoder
    fams.append(("sp-unk-fused", finish(unk, []), False))

    # Beyond the three families: every Split behavior, invert, String patterns, more normalizers and decoders, and
    # BPE's continuing_subword_prefix / end_of_word_suffix / unk without byte fallback.
    norm = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents(),
                                 normalizers.Replace(Regex(r"[0-9]{4}"), "<year>"), normalizers.Strip()])
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="removed"),
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"\p{P}+"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[A-Z]"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\s"), behavior="contiguous", invert=True),
        pre_tokenizers.Split(Regex(r"[a-z]{5,}"), behavior="isolated", invert=True),
        pre_tokenizers.Split(Regex(r"\w{2}\W|\u00e9|[\h\s]$"), behavior="isolated")])  # Oniguruma's \w \h \u
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.normalizer, tok.pre_tokenizer = norm, pre
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=3000, show_progress=False, special_tokens=["[UNK]"], limit_alphabet=200,
        continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    j = json.loads(tok.to_str())
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "</w>"}, "content": " "},
        {"type": "Replace", "pattern": {"Regex": "#+"}, "content": ""}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}  # (stop > 0 panics upstream on an empty text)
    fams.append(("misc-split-behaviors", finish(j, [added("[SEP]"), added("year", special=False)]), False))

    # SmolLM / SmolLM2 as published: Digits(individual_digits) before the GPT-2 ByteLevel split, no normalizer
    smol_pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    j = train(texts, models.BPE(), smol_pre, special=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>",
                                                      "<file_sep>", "<filename>"])
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    fams.append(("smollm", finish(j, []), True))
    return fams


def build_extra_families(smollm):
    """The other pre-tokenizers, one family each, on SmolLM's byte-level vocabulary (every piece encodes without an
    unknown token) and a smaller slice of the corpus: (name, Tokenizer, round-trips?)."""
    base = json.loads(smollm.to_str())
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}

    def fam(name, pres, roundtrip=False, normalizer=None, decoder=None):
        j = json.loads(json.dumps(base))
        j["pre_tokenizer"] = {"type": "Sequence",
                              "pretokenizers": [json.loads(p.__getstate__()) if not isinstance(p, dict) else p
                                                for p in pres]}
        j["normalizer"] = normalizer
        j["decoder"] = decoder or j["decoder"]
        return (name, Tokenizer.from_str(json.dumps(j)), roundtrip)

    P = pre_tokenizers
    fams = [fam("digits-contiguous", [P.Digits(individual_digits=False), dict(bl, use_regex=True)], True),
            fam("digits-alone", [P.Digits(individual_digits=True), bl], True),
            fam("whitespace", [P.Whitespace(), bl]),
            fam("whitespace-split", [P.WhitespaceSplit(), bl]),
            fam("unicode-scripts", [P.UnicodeScripts(), bl]),
            fam("unicode-scripts-digits", [P.Digits(individual_digits=True), P.UnicodeScripts(), bl]),
            fam("bert-pre-tokenizer", [P.BertPreTokenizer(), bl]),
            fam("char-delimiter-fixed-length", [P.CharDelimiterSplit("e"), P.FixedLength(length=3), bl]),
            fam("split-invert", [P.Split(Regex(r"\p{L}+"), behavior="merged_with_next", invert=True),
                                 P.Split(" ", behavior="merged_with_previous", invert=True),
                                 P.Split(Regex(r"[0-9]+|\s"), behavior="removed", invert=True), bl])]
    # the other normalizers and decoders: Nmt, the ByteLevel normalizer, BPEDecoder
    fams.append(fam("nmt-bpe-decoder", [P.Digits(individual_digits=True), dict(bl, use_regex=True)],
                    normalizer={"type": "Sequence", "normalizers": [{"type": "Nmt"}, {"type": "Lowercase"}]},
                    decoder={"type": "Sequence", "decoders": [{"type": "BPEDecoder", "suffix": "ing"}, base["decoder"]]}))
    fams.append(fam("bytelevel-normalizer", [P.Split(Regex("\u0120"), behavior="merged_with_next")],
                    normalizer={"type": "ByteLevel"}))
    for b in ["isolated", "removed", "merged_with_previous", "merged_with_next", "contiguous"]:
        fams.append(fam("punctuation-" + b, [P.Punctuation(behavior=b), bl], b != "removed"))
    return fams


# ---------------------------------------------------------------- running

def build_driver(tmp):
    srcs = [os.path.join(ROOT, "src/core/error.c"), os.path.join(ROOT, "src/core/json_util.c")]
    srcs += sorted(os.path.join(ROOT, "src/data", f) for f in os.listdir(os.path.join(ROOT, "src/data"))
                   if f.startswith("tokenizer") and f.endswith(".c"))
    srcs.append(os.path.join(ROOT, "tests/parity/tok_driver.c"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "jansson", "libpcre2-8", "libutf8proc"],
                           check=True, capture_output=True, text=True).stdout.split()
    exe = os.path.join(tmp, "tok_driver")
    cmd = [os.environ.get("CC", "gcc"), "-std=c11", "-O2", "-D_GNU_SOURCE", "-Wall", "-Wextra",
           "-Wno-unused-parameter", "-I" + os.path.join(ROOT, "include"), "-I" + os.path.join(ROOT, "src")]
    cmd += srcs + flags + ["-lpthread", "-o", exe]
    subprocess.run(cmd, check=True)
    return exe


def write_docs(path, docs):
    with open(path, "wb") as f:
        for d in docs:
            f.write(struct.pack("<I", len(d)))
            f.write(d)


def read_records(path, ints):
    out = []
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        (n,) = struct.unpack_from("<I", data, at)
        at += 4
        if ints:
            out.append(list(struct.unpack_from(f"<{n}i", data, at)))
            at += 4 * n
        else:
            out.append(data[at:at + n])
            at += n
    return out


def context(tok, ids, at):
    return [tok.id_to_token(i) for i in ids[max(0, at - 4):at + 4]]


def run_family(exe, tmp, name, tok, roundtrip, docs, docs_path, texts, check):
    """Encodes and decodes docs (written to docs_path) with snug and with `tokenizers` and compares them (see the
    module doc)."""
    total = sum(len(d) for d in docs)
    path = os.path.join(tmp, name + ".json")
    tok.save(path)
    ids_path, dec_path = os.path.join(tmp, name + ".ids"), os.path.join(tmp, name + ".dec")
    r = subprocess.run([exe, path, docs_path, ids_path, dec_path, "--threads", "3"], capture_output=True, text=True)
    if r.returncode != 0:
        check(False, f"{name}: driver failed: {r.stderr.strip()[:2000]}")
        return
    info = dict(kv.split("=") for kv in r.stdout.split("\n")[0].split()[1:])
    secs = float(r.stdout.split("seconds=")[1].split()[0])
    c_ids = read_records(ids_path, True)
    c_dec = read_records(dec_path, False)
    t0 = time.time()
    hf_ids = [enc.ids for enc in tok.encode_batch(texts, add_special_tokens=False)]
    hf_secs = time.time() - t0

    bad = [i for i in range(len(docs)) if c_ids[i] != hf_ids[i]]
    for i in bad[:3]:
        a, b = c_ids[i], hf_ids[i]
        at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        print(f"  {name}: document {i} differs at id {at} (snug {len(a)} ids, tokenizers {len(b)})\n"
              f"    snug:       {a[max(0, at - 4):at + 4]} {context(tok, a, at)}\n"
              f"    tokenizers: {b[max(0, at - 4):at + 4]} {context(tok, b, at)}\n"
              f"    text: {texts[i][:300]!r}")
    check(not bad, f"{name}: {len(bad)} of {len(docs)} documents encode differently")

    hf_dec = tok.decode_batch(hf_ids, skip_special_tokens=False)
    dbad = [i for i in range(len(docs)) if c_dec[i] != hf_dec[i].encode("utf-8", "surrogatepass")]
    for i in dbad[:3]:
        print(f"  {name}: document {i} decodes differently\n    snug:       {c_dec[i][:200]!r}\n"
              f"    tokenizers: {hf_dec[i][:200]!r}")
    check(not dbad, f"{name}: {len(dbad)} documents decode differently")

    if roundtrip:  # (lstrip/rstrip tokens eat spaces: documents holding them cannot round-trip)
        rbad = [i for i in range(len(docs)) if c_dec[i] != texts[i].encode()
                and "<mask>" not in texts[i] and " banana split" not in texts[i]]
        for i in rbad[:3]:
            print(f"  {name}: document {i} does not round-trip\n    in:  {texts[i][:200]!r}\n"
                  f"    out: {c_dec[i][:200]!r}")
        check(not rbad, f"{name}: {len(rbad)} documents do not round-trip")

    vocab = tok.get_vocab(with_added_tokens=True)
    check(int(info["vocab_size"]) == max(vocab.values()) + 1,
          f"{name}: vocab_size {info['vocab_size']} != {max(vocab.values()) + 1}")
    # the post-processor: snug adds at most a BOS before and an EOS after; tokenizers must add exactly those
    for text in ["hello", ""]:
        with_sp = tok.encode(text, add_special_tokens=True).ids
        without = tok.encode(text, add_special_tokens=False).ids
        ours = ([int(info["bos"])] if info["adds_bos"] == "1" else []) + without + \
            ([int(info["eos"])] if info["adds_eos"] == "1" else [])
        check(with_sp == ours, f"{name}: with special tokens {with_sp} != snug's {ours} on {text!r}")
    check("threads 3 same" in r.stdout, f"{name}: threads: {r.stdout.strip()[-200:]} {r.stderr[-500:]}")
    nids = sum(len(x) for x in hf_ids)
    print(f"{name}: {len(docs) - len(bad)}/{len(docs)} documents identical, {nids} ids; "
          f"decode {len(docs) - len(dbad)}/{len(docs)}; snug {total / secs / 1e6:.1f} MB/s (1 thread), "
          f"tokenizers encode_batch {total / hf_secs / 1e6:.1f} MB/s")


def main():
    t_start = time.time()
    rng = random.Random(20240607)
    target = float(os.environ.get("SNUG_TOK_CORPUS_MB", "5.5")) * 1e6
    docs = make_corpus(rng, target)
    texts = [d.decode("utf-8", errors="replace") for d in docs]
    total = sum(len(d) for d in docs)
    print(f"corpus: {len(docs)} documents, {total / 1e6:.2f} MB, "
          f"{sum(1 for d in docs if d != d.decode('utf-8', 'replace').encode())} with invalid UTF-8")

    keep = os.environ.get("SNUG_TOK_KEEP")
    tmp = keep or tempfile.mkdtemp(prefix="snug_tok_")
    os.makedirs(tmp, exist_ok=True)
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
            print(f"FAIL: {what}")

    try:
        exe = build_driver(tmp)
        # (jansson cannot load an object key holding U+0000, so keep that character out of the trained vocabularies)
        train_texts = [x.replace("\x00", "") for x in texts[: len(texts) // 3]]
        t0 = time.time()
        fams = build_families(train_texts)
        extra = build_extra_families(next(tok for name, tok, _ in fams if name == "smollm"))
        print(f"built {len(fams) + len(extra)} tokenizers in {time.time() - t0:.1f}s")
        docs_path = os.path.join(tmp, "docs.bin")
        write_docs(docs_path, docs)
        for name, tok, roundtrip in fams:
            run_family(exe, tmp, name, tok, roundtrip, docs, docs_path, texts, check)
        # the extra families see every tenth long document, all the short ones (the boundaries) and STRESS
        pick = [i for i in range(len(docs)) if i % 10 == 0 or len(docs[i]) < 64 or i >= len(docs) - len(STRESS)]
        sdocs, stexts = [docs[i] for i in pick], [texts[i] for i in pick]
        print(f"slice for the other pre-tokenizers: {len(sdocs)} documents, "
              f"{sum(len(d) for d in sdocs) / 1e6:.2f} MB")
        sdocs_path = os.path.join(tmp, "slice.bin")
        write_docs(sdocs_path, sdocs)
        for name, tok, roundtrip in extra:
            run_family(exe, tmp, name, tok, roundtrip, sdocs, sdocs_path, stexts, check)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_tokenizer_parity: {passed} passed, {failed} failed ({time.time() - t_start:.0f}s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

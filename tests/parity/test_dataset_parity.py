#!/usr/bin/env python3
"""test_dataset_parity.py: snug's alpaca, chat and input_output datasets against the same templates applied in Python
with the Hugging Face tokenizer, id for id and mask for mask.

Two tokenizers, both saved by the `tokenizers` package:
  - the committed GPT-2 style byte-level BPE (assets/tokenizer) plus the chatml and llama3 special tokens, and a
    variant of it whose post-processor prepends <|begin_of_text|> (a BOS the alpaca prompt must start with);
  - a Llama-3 style BPE (Split with the Llama-3 regex + ByteLevel, NFC) trained here on fortunes, with the same
    special tokens.
For each, `snug preprocess --dump` writes every example as input_ids + labels, with train_on_inputs off and on, and
the reference is:
  - alpaca: Axolotl's construction, tokenizer(prompt) (with the tokenizer's BOS) + tokenizer(output, no special
    tokens) + [EOS], prompt masked unless train_on_inputs, output and EOS supervised;
  - chat: transformers' apply_chat_template with the chatml / llama3 template written as Jinja with {% generation %}
    blocks around the assistant content and its end-of-turn token; the ids are the template's, the mask is
    `assistant_masks` (train_on_inputs: every token but <|begin_of_text|>);
  - input_output: Axolotl's RawInputOutputStrategy, each segment tokenizer(text, no special tokens) in turn, masked
    where its label is false unless train_on_inputs (special tokens written in the text are the tokens).
Prints "N passed, M failed" and exits non-zero on any failure.

Run with the venv python: ~/.cache/snug/venv/bin/python tests/parity/test_dataset_parity.py
Env: SNUG_BIN (the snug program; default build/snug), SNUG_SOURCE_DIR (repository root; default two folders up).
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

ROOT = os.environ.get("SNUG_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNUG = os.path.abspath(os.environ.get("SNUG_BIN", "build/snug"))
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")

# The Alpaca prompt as Axolotl's AlpacaPrompter writes it (src/axolotl/prompters.py).
ALPACA_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes the "
                   "request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")

# The chat templates in Jinja, with the supervised part marked for return_assistant_tokens_mask.
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
          "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
          "{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}")
LLAMA3 = ("{{ '<|begin_of_text|>' }}{% for m in messages %}"
          "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' }}"
          "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
          "{% else %}{{ m['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}")

passed, failed = 0, 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, file=sys.stderr)


# ---------------------------------------------------------------- tokenizers

def add_specials(tok):
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])


def gpt2_tokenizer(path, with_bos):
    tok = Tokenizer.from_file(os.path.join(ROOT, "assets/tokenizer/tokenizer.json"))
    add_specials(tok)
    if with_bos:
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B", special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(path)


def corpus():
    out = []
    d = "/usr/share/games/fortunes"
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            if not name.endswith(".dat") and os.path.isfile(p) and not os.path.islink(p):
                out += open(p, "rb").read().decode("utf-8", "replace").split("\n%\n")
    rng = random.Random(1)
    words = ["the", "answer", "is", "café", "naïve", "日本語", "😀", "x = 1\n", "  indented", "\t", "42", "3.14"]
    out += [" ".join(rng.choice(words) for _ in range(30)) for _ in range(2000)]
    return out


def llama3_tokenizer(path):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<|end_of_text|>"] + SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.save(path)


# ---------------------------------------------------------------- data

def alpaca_rows(rng):
    instr = ["Name a color.", "Translate to French: the cat", "Write  two\nlines.", "Résumé in 日本語?", "Add:",
             "Explain `x = 1`", " Leading space", "Trailing space ", "Emoji 😀 please"]
    inputs = ["", "", "2 + 2", "some\ttabs\tand  spaces", "line one\nline two", "ünïcödé", " x"]
    outputs = ["Blue.", " Le chat.", "one\ntwo", "4", "  spaced out", "\nstarts with a newline", "日本語です。",
               "ends with newline\n", "quote \" and backslash \\", "😀"]
    rows = []
    for i in range(60):
        r = {"instruction": rng.choice(instr), "output": rng.choice(outputs)}
        inp = rng.choice(inputs)
        if inp or i % 3:
            r["input"] = inp
        rows.append(r)
    return rows


def chat_rows(rng):
    sys_msgs = ["You are brief.", "Answer in French.", " Be kind. ", "Système: 日本語"]
    user = ["Hi!", "What is 2+2?", "Write code:\n```\nx = 1\n```", "  spaced  question  ", "Ça va ?", "😀😀",
            "multi\nline\n\ninput", "\n\nnewlines first", "a literal <|im_end|> and <|eot_id|> inside"]
    # replies that start with line breaks or spaces meet the template's own line break inside one pre-token
    assistant = ["Hello.", "4", "Sure:\n```python\nprint(1)\n```", " Bien, merci.", "Yes", "trailing spaces   ",
                 "日本語で答えます。", "tab\there", "\nstarts with a newline", "\n\n  two newlines, two spaces",
                 "   three spaces", "", "\u00a0no-break space", "says <|im_end|> literally", "\t\ttabs"]
    rows = []
    for i in range(120):
        msgs = []
        if i % 2:
            msgs.append({"role": "system", "content": rng.choice(sys_msgs)})
        for _ in range(1 + i % 3):
            msgs.append({"role": "user", "content": rng.choice(user)})
            msgs.append({"role": "assistant", "content": rng.choice(assistant)})
        rows.append({"messages": msgs})
    return rows


def io_rows(rng):
    parts = ["<|begin_of_text|>", "Question: ", "what is 2+2?", "\n", "Answer:", " 4", "<|eot_id|>", "  spaced ",
             "日本語", "😀", "", "line\nbreak", "<|im_start|>user\nHi<|im_end|>\n", " trailing "]
    rows = []
    for i in range(60):
        segs = [{"label": bool(rng.random() < 0.4), "text": rng.choice(parts)} for _ in range(1 + i % 5)]
        segs.append({"label": True, "text": rng.choice(parts[1:9])})
        rows.append({"segments": segs})
    return rows


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------- references

def ref_alpaca(tok, row, toi):
    inp = row.get("input") or ""
    prompt = (ALPACA_INPUT.format(instruction=row["instruction"], input=inp) if inp
              else ALPACA_NO_INPUT.format(instruction=row["instruction"]))
    p = tok(prompt, add_special_tokens=True)["input_ids"]  # the tokenizer's BOS, as Axolotl
    o = tok(row["output"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    bos = 1 if tok.bos_token_id is not None and p and p[0] == tok.bos_token_id else 0
    mask = [0] * bos + [1 if toi else 0] * (len(p) - bos) + [1] * len(o)
    return p + o, mask


def ref_chat(tok, row, template, toi):
    out = tok.apply_chat_template(row["messages"], chat_template=template, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    if toi:
        begin = tok.convert_tokens_to_ids("<|begin_of_text|>")
        mask = [0 if (i == 0 and t == begin and template is LLAMA3) else 1 for i, t in enumerate(ids)]
    return ids, mask


def ref_io(tok, row, toi):
    ids, mask = [], []
    for s in row["segments"]:
        t = tok(s["text"], add_special_tokens=False)["input_ids"]
        ids += t
        mask += [1 if (s["label"] or toi) else 0] * len(t)
    return ids, mask


# ---------------------------------------------------------------- snug

def snug_dump(work, tok_dir, data, typ, template, toi, name):
    cfg = os.path.join(work, name + ".yaml")
    with open(cfg, "w") as f:
        f.write(f"tokenizer: {tok_dir}\ndatasets:\n  - path: {data}\n    type: {typ}\n")
        if template:
            f.write(f"    chat_template: {template}\n")
        f.write(f"train_on_inputs: {'true' if toi else 'false'}\nsequence_len: 1024\n"
                f"dataset_prepared_path: {os.path.join(work, 'prep')}\n")
    dump = os.path.join(work, name + ".dump.jsonl")
    r = subprocess.run([SNUG, "preprocess", cfg, "--dump", dump], capture_output=True, text=True, cwd=work)
    if r.returncode != 0:
        check(False, f"{name}: snug preprocess failed ({r.returncode}): {r.stderr.strip()}")
        return None
    return [json.loads(line) for line in open(dump)]


def compare(name, got, rows, ref):
    if got is None:
        return
    check(len(got) == len(rows), f"{name}: {len(got)} examples, expected {len(rows)}")
    bad = 0
    for i, (g, row) in enumerate(zip(got, rows)):
        ids, mask = ref(row)
        gmask = [0 if l == -100 else 1 for l in g["labels"]]
        ok = (g["input_ids"] == ids and gmask == mask
              and all(lab in (-100, t) for lab, t in zip(g["labels"], g["input_ids"])))
        if not ok and bad < 2:
            print(f"{name} example {i}: {json.dumps(row, ensure_ascii=False)[:300]}\n  snug ids  {g['input_ids']}\n"
                  f"  ref ids   {ids}\n  snug mask {gmask}\n  ref mask  {mask}", file=sys.stderr)
        bad += not ok
        check(ok, f"{name}: example {i} differs")
    print(f"{name}: {len(got) - bad}/{len(got)} examples identical")


def main():
    work = tempfile.mkdtemp(prefix="snug_dataset_parity_")
    try:
        rng = random.Random(7)
        alpaca = os.path.join(work, "alpaca.jsonl")
        chat = os.path.join(work, "chat.jsonl")
        io = os.path.join(work, "io.jsonl")
        arows, crows, irows = alpaca_rows(rng), chat_rows(rng), io_rows(rng)
        write_jsonl(alpaca, arows)
        write_jsonl(chat, crows)
        write_jsonl(io, irows)
        families = {"gpt2": lambda p: gpt2_tokenizer(p, False), "gpt2-bos": lambda p: gpt2_tokenizer(p, True),
                    "llama3-bpe": llama3_tokenizer}
        for fam, make in families.items():
            tdir = os.path.join(work, fam)
            os.makedirs(tdir)
            make(os.path.join(tdir, "tokenizer.json"))
            eos = "<|endoftext|>" if fam.startswith("gpt2") else "<|end_of_text|>"
            with open(os.path.join(tdir, "tokenizer_config.json"), "w") as f:
                json.dump({"eos_token": eos}, f)
            bos = "<|begin_of_text|>" if fam == "gpt2-bos" else None
            tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tdir, "tokenizer.json"), eos_token=eos,
                                          bos_token=bos)
            for toi in (False, True):
                sfx = f"{fam}{' train_on_inputs' if toi else ''}"
                got = snug_dump(work, tdir, alpaca, "alpaca", None, toi, f"alpaca-{fam}-{int(toi)}")
                compare(f"alpaca {sfx}", got, arows, lambda r: ref_alpaca(tok, r, toi))
                got = snug_dump(work, tdir, io, "input_output", None, toi, f"io-{fam}-{int(toi)}")
                compare(f"input_output {sfx}", got, irows, lambda r: ref_io(tok, r, toi))
                for tname, tmpl in (("chatml", CHATML), ("llama3", LLAMA3)):
                    got = snug_dump(work, tdir, chat, "chat", tname, toi, f"chat-{tname}-{fam}-{int(toi)}")
                    compare(f"chat {tname} {sfx}", got, crows, lambda r: ref_chat(tok, r, tmpl, toi))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"test_dataset_parity: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

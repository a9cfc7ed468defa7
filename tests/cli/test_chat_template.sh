#!/usr/bin/env bash
# The tokenizer's own chat template through the program: `type: chat` renders with it by default (the data line
# names it), a built-in forced over it is named in the header and saved as the output folder's chat_template.jinja,
# chat_template_jinja (a file beside the YAML), tokenizer_default without a template refused, and `snug generate
# --chat` / `--messages` rendering a conversation through the saved folder's template, and a template that raises on a
# line reported with the file, the line and its message.
. "$(dirname "$0")/lib.sh"

cd "$W" || fatal "cd $W"

# A tokenizer with the chatml special tokens, and a template (written for this test) that adds a default system
# prompt: it renders differently from the built-in chatml.
mkdir -p "$W/tok" "$W/plain"
python3 - "$SRC/assets/tokenizer/tokenizer.json" "$W/tok" "$W/plain" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
n = max(max(t["model"]["vocab"].values()), max(a["id"] for a in t["added_tokens"])) + 1
for s in ["<|im_start|>", "<|im_end|>"]:
    t["added_tokens"].append({"id": n, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True})
    n += 1
for d in sys.argv[2:]:
    json.dump(t, open(d + "/tokenizer.json", "w"), ensure_ascii=False)
tmpl = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are kind.<|im_end|>\\n' }}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
json.dump({"eos_token": "<|im_end|>", "bos_token": {"content": "<|im_start|>"}, "chat_template": tmpl},
          open(sys.argv[2] + "/tokenizer_config.json", "w"))
json.dump({"eos_token": "<|im_end|>"}, open(sys.argv[3] + "/tokenizer_config.json", "w"))
with open(sys.argv[2] + "/../chat.jsonl", "w") as f:
    for i in range(8):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"Hi {i}"},
                                         {"role": "assistant", "content": f"Hello {i}."}]}) + "\n")
PY
printf '%s' "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{% endfor %}" > "$W/own.jinja"

base() {
  cat <<EOF
datasets:
  - path: chat.jsonl
    type: chat
sequence_len: 32
micro_batch_size: 2
max_steps: 1
sample_tokens: 0
dataset_prepared_path: $W/prep
EOF
}

# The default: the tokenizer's own template; the saved folder keeps the tokenizer's files as they are
{ base; echo "tokenizer: tok"; echo "output_dir: $W/out1"; } > "$W/own.yaml"
"$SNUG" train "$W/own.yaml" >"$W/t1" 2>&1 || bad "train with the tokenizer's template" "$W/t1"
grep -q "chat.jsonl (chat, template of .*tok/tokenizer_config.json)" "$W/t1" && ok ||
  bad "the data line does not name the tokenizer's template" "$W/t1"
! grep -q "chat template " "$W/t1" && ok || bad "a header note without a built-in chosen" "$W/t1"
[ ! -e "$W/out1/chat_template.jinja" ] && grep -q '"chat_template"' "$W/out1/tokenizer_config.json" && ok ||
  bad "the saved folder does not keep the tokenizer's own template"

# template files: chat_template.jinja and additional_chat_templates/tool_use.jinja, both kept by the saved folder
mkdir -p "$W/tokf/additional_chat_templates"
cp "$W/tok/tokenizer.json" "$W/tokf/"
printf '{"eos_token": "<|im_end|>"}' > "$W/tokf/tokenizer_config.json"
cp "$W/own.jinja" "$W/tokf/chat_template.jinja"
printf '%s' "{{ 'with tools' }}" > "$W/tokf/additional_chat_templates/tool_use.jinja"
{ base; echo "tokenizer: tokf"; echo "output_dir: $W/out6"; } > "$W/files.yaml"
"$SNUG" train "$W/files.yaml" >"$W/t7" 2>&1 && grep -q "chat.jsonl (chat, template of .*tokf/chat_template.jinja)" "$W/t7" &&
  cmp -s "$W/own.jinja" "$W/out6/chat_template.jinja" &&
  cmp -s "$W/tokf/additional_chat_templates/tool_use.jinja" "$W/out6/additional_chat_templates/tool_use.jinja" &&
  ok || bad "template files not used or not kept" "$W/t7"

# chatml forced: named in the header, saved as chat_template.jinja, dropped from tokenizer_config.json
{ base; echo "tokenizer: tok"; echo "chat_template: chatml"; echo "output_dir: $W/out2"; } > "$W/ml.yaml"
"$SNUG" train "$W/ml.yaml" >"$W/t2" 2>&1 || bad "train with chatml forced" "$W/t2"
grep -q "chat template  *chatml (chat_template: chatml), not the tokenizer's own in .*tokenizer_config.json, which renders differently" "$W/t2" &&
  ok || bad "the header does not name the built-in chosen over the tokenizer's template" "$W/t2"
grep -q "im_start" "$W/out2/chat_template.jinja" 2>/dev/null && ! grep -q '"chat_template"' "$W/out2/tokenizer_config.json" &&
  ok || bad "the saved folder does not keep the chatml template training used"

# chat_template_jinja: a file beside the YAML, implying chat_template: jinja; saved as chat_template.jinja
{ base; echo "tokenizer: tok"; echo "chat_template_jinja: own.jinja"; echo "output_dir: $W/out3"; } > "$W/j.yaml"
"$SNUG" train "$W/j.yaml" >"$W/t3" 2>&1 || bad "train with chat_template_jinja" "$W/t3"
grep -q "chat.jsonl (chat, template of .*own.jinja)" "$W/t3" && cmp -s "$W/own.jinja" "$W/out3/chat_template.jinja" &&
  ok || bad "chat_template_jinja not used or not saved" "$W/t3"

# tokenizer_default with a tokenizer that ships none: refused by name
{ base; echo "tokenizer: plain"; echo "chat_template: tokenizer_default"; echo "output_dir: $W/out4"; } > "$W/td.yaml"
"$SNUG" train "$W/td.yaml" >"$W/t4" 2>&1
[ $? -eq 2 ] && grep -q "tokenizer_default.*ships none" "$W/t4" && ok || bad "tokenizer_default without a template" "$W/t4"
# and the default falls back to chatml there
{ base; echo "tokenizer: plain"; echo "output_dir: $W/out5"; } > "$W/fb.yaml"
"$SNUG" train "$W/fb.yaml" >"$W/t5" 2>&1 && grep -q "chat.jsonl (chat, chatml)" "$W/t5" && ok ||
  bad "the default without a tokenizer template is not chatml" "$W/t5"

# a template that raises on a line: exit status 2, the file and line, the template's message and what else renders it
mkdir -p "$W/raising"
cp "$W/tok/tokenizer.json" "$W/raising/"
python3 - "$W/raising/tokenizer_config.json" <<'PY'
import json, sys
t = ("{% for m in messages %}{% if loop.first and m['role'] != 'user' %}"
     "{{ raise_exception('Conversations must start with a user message') }}{% endif %}{{ m['content'] }}{% endfor %}")
json.dump({"eos_token": "<|im_end|>", "chat_template": t}, open(sys.argv[1], "w"))
PY
printf '{"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]}\n' > "$W/starts.jsonl"
printf 'tokenizer: raising\ndatasets:\n  - path: starts.jsonl\n    type: chat\nsequence_len: 32\ndataset_prepared_path: %s\n' \
  "$W/prep" > "$W/raise.yaml"
"$SNUG" preprocess "$W/raise.yaml" >"$W/t6" 2>&1
[ $? -eq 2 ] && grep -q "starts.jsonl line 1: .*Conversations must start with a user message.*chat_template: chatml" "$W/t6" &&
  ok || bad "a template's raise_exception on a line" "$W/t6"

# generate --chat through the saved template; --messages; a bad messages file
"$SNUG" generate "$W/out1" --chat --prompt "Hi" --max_new_tokens 2 --temperature 0 >"$W/g1" 2>&1 && ok ||
  bad "generate --chat" "$W/g1"
printf '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}, {"role": "user", "content": "And?"}]}' > "$W/conv.json"
"$SNUG" generate "$W/out2" --messages "$W/conv.json" --max_new_tokens 2 --temperature 0 >"$W/g2" 2>&1 && ok ||
  bad "generate --messages" "$W/g2"
printf '[{"role": "user"' > "$W/broken.json"
"$SNUG" generate "$W/out1" --messages "$W/broken.json" >"$W/g3" 2>&1
[ $? -eq 2 ] && grep -q "broken.json line 1: invalid JSON" "$W/g3" && ok || bad "a broken --messages file" "$W/g3"
"$SNUG" generate --help 2>&1 | grep -q "^  chat: a switch" && ok || bad "generate --help does not list --chat"

finish

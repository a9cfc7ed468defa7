"""snug's Jinja interpreter (src/data/jinja_*.c) against Jinja2 in the environment transformers renders chat
templates with: every published template under tests/data/chat_templates, and a few written here for the syntax
the published ones use little ({% generation %}, macros, call blocks, filters, loop variables, slices, methods),
each rendered over a set of conversations (system, multi-turn, tool calls and results, empty content, unicode,
add_generation_prompt on and off, roles out of order). The text must equal Jinja2's byte for byte and the
generation spans transformers' assistant indices; where Jinja2 raises (raise_exception, an undefined attribute),
snug must fail too. The driver (tests/parity/jinja_driver.c) is compiled here with gcc."""
import copy
import json
import os
import subprocess
import sys
import tempfile

from transformers.utils.chat_template_utils import _compile_jinja_template

ROOT = os.environ.get("SNUG_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TEMPLATES = os.path.join(ROOT, "tests/data/chat_templates")
failures = []
passes = [0]
outcomes = {"rendered": 0, "raised": 0}


def check(ok, what):
    if ok:
        passes[0] += 1
    else:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def build_driver(tmp):
    srcs = [os.path.join(ROOT, "src/core/error.c"), os.path.join(ROOT, "src/core/json_util.c")]
    srcs += sorted(os.path.join(ROOT, "src/data", f) for f in os.listdir(os.path.join(ROOT, "src/data"))
                   if f.startswith("jinja") and f.endswith(".c"))
    srcs.append(os.path.join(ROOT, "tests/parity/jinja_driver.c"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "jansson", "libutf8proc"],
                           check=True, capture_output=True, text=True).stdout.split()
    exe = os.path.join(tmp, "jinja_driver")
    cmd = [os.environ.get("CC", "gcc"), "-std=c11", "-O1", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
           "-Wno-unused-parameter", "-I" + os.path.join(ROOT, "include"), "-I" + os.path.join(ROOT, "src")]
    cmd += srcs + flags + ["-lm", "-o", exe]
    subprocess.run(cmd, check=True)
    return exe


# ---------------------------------------------------------------- conversations

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "n": {"type": "integer"}},
                   "required": ["query"]}}}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello, who are you?"}
A1 = {"role": "assistant", "content": "I am an assistant. How can I help?"}
U2 = {"role": "user", "content": "What is 2 + 2?"}
A2 = {"role": "assistant", "content": "2 + 2 = 4."}
UNI = {"role": "user",
       "content": "Grüße aus Köln 👋 — 你好，世界! \"quotes\" 'single' back\\slash\ttab\nnew line  "}
AUNI = {"role": "assistant", "content": "  ¡Hola! ✓ ça va — 日本語 \u2028 done.\n"}
TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "abc123XYZ", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather",
               "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}
A_AFTER_TOOL = {"role": "assistant", "content": "It is 21 °C and clear in Paris."}


def conversations():
    base = {"bos_token": "<s>", "eos_token": "</s>", "date_string": "26 Jul 2024", "tools": None,
            "documents": None}
    convs = {
        "system-multi": [SYS, U1, A1, U2, A2],
        "no-system": [U1, A1, U2, A2],
        "single-user": [U1],
        "system-user": [SYS, U1],
        "unicode": [SYS, UNI, AUNI, U2],
        "empty-content": [{"role": "system", "content": ""}, {"role": "user", "content": ""},
                          {"role": "assistant", "content": ""}, U2],
        "assistant-first": [A1, U1],
        "two-users": [U1, U2],
        "think": [U1, {"role": "assistant", "content": "4", "reasoning_content": "2 and 2 make 4."}, U2,
                  {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\nIt is 4."}],
    }
    cases = []
    for name, msgs in convs.items():
        for agp in (False, True):
            cases.append((f"{name} agp={agp}", dict(base, messages=msgs, add_generation_prompt=agp)))
    tools = [WEATHER_TOOL, SEARCH_TOOL]
    tool_conv = [SYS, {"role": "user", "content": "What is the weather in Paris?"}, TOOL_CALL, TOOL_RESULT,
                 A_AFTER_TOOL]
    tool_str_args = copy.deepcopy(tool_conv)
    tool_str_args[2]["tool_calls"][0]["function"]["arguments"] = "{\"city\": \"Paris\"}"
    for agp in (False, True):
        cases.append((f"tools agp={agp}", dict(base, messages=tool_conv, tools=tools, add_generation_prompt=agp)))
        cases.append((f"tools-no-system agp={agp}", dict(base, messages=tool_conv[1:], tools=tools,
                                                           add_generation_prompt=agp)))
    cases.append(("tool-call-string-args", dict(base, messages=tool_str_args, tools=tools,
                                                add_generation_prompt=False)))
    cases.append(("tool-call-no-tools", dict(base, messages=tool_conv, add_generation_prompt=True)))
    cases.append(("no-thinking", dict(base, messages=[SYS, U1, A1, U2], add_generation_prompt=True,
                                      enable_thinking=False)))
    multimodal = [SYS, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in it?"}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "A cat 🐈."}]}, U2]
    for agp in (False, True):
        cases.append((f"content-parts agp={agp}", dict(base, messages=multimodal, add_generation_prompt=agp)))
    docs = [{"title": "Köln", "text": "Cologne is a city on the Rhine."}, {"title": "Paris", "text": "Capital."}]
    cases.append(("documents", dict(base, messages=[SYS, U1], documents=docs, add_generation_prompt=True)))
    uni_call = copy.deepcopy(tool_conv)
    uni_call[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Zürich 北京", "unit": None, "days": [1, 2.5]}
    uni_call[2]["content"] = None
    cases.append(("tool-call-unicode-null-content", dict(base, messages=uni_call, tools=tools,
                                                         add_generation_prompt=True)))
    cases.append(("functions", dict(base, messages=tool_conv, functions=json.dumps(tools), add_generation_prompt=True)))
    cases.append(("no-date-string", {"bos_token": "<s>", "eos_token": "</s>", "messages": [SYS, U1],
                                     "add_generation_prompt": True, "tools": None, "documents": None}))
    return cases


# ---------------------------------------------------------------- templates written here

OWN = {
    # ChatML with the assistant turns marked, as TRL's and Axolotl's generation-aware templates do
    "chatml-generation": "{% for message in messages %}{% if message['role'] == 'assistant' %}"
                         "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
                         "{% endgeneration %}{{ '\\n' }}{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                         "message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    # generation blocks nested in a macro, a block set, a filter block and each other: transformers measures each
    # from the top-level text rendered so far, in characters
    "generation-nested": "{% macro turn(m) %}<{% generation %}{{ m.content }}{% endgeneration %}>{% endmacro %}"
                         "{% for m in messages %}{{ m.role }}:{% if m.role == 'assistant' %}{{ turn(m) }}"
                         "{% set t %}{% generation %}é{{ m.content }}{% endgeneration %}{% endset %}{{ t }}"
                         "{% filter upper %}{% generation %}x{% generation %}{{ m.content }}{% endgeneration %}"
                         "{% endgeneration %}{% endfilter %}{% else %}{{ m.content }}{% endif %};{% endfor %}",
    "syntax": r"""{#- a comment -#}
{%- macro render(m, prefix='> ', upper=false) -%}
{{ prefix }}{{ m.role | upper if upper else m.role }}: {{ m.content | trim }}
{%- endmacro %}
{%- set ns = namespace(count=0, roles=[]) %}
{%- for m in messages if m.role != 'system' %}
  {%- set ns.count = ns.count + 1 %}
  {%- set ns.roles = ns.roles + [m.role] %}
[{{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} {{ loop.revindex0 }} {{ loop.first }} {{ loop.last }} {{ loop.cycle('odd', 'even') }} {{ loop.previtem.role if loop.previtem is defined else '-' }} {{ loop.nextitem.role if loop.nextitem is defined else '-' }}]
{{ render(m, upper=loop.first) }}
  {%- if m.content | length > 20 %}{% continue %}{% endif %}
  short:{{ m.content[:5] }}|{{ m.content[-3:] }}|{{ m.content[::2] }}|{{ m.content[::-1] }}
{%- else %}
no messages
{%- endfor %}
count={{ ns.count }} roles={{ ns.roles }} uniq={{ ns.roles | unique | list }} sorted={{ ns.roles | sort(reverse=true) }}
{%- set block %}  {{ messages | length }} messages  {% endset %}
block=[{{ block }}] trimmed=[{{ block | trim }}]
{% filter upper %}shout {{ messages[0].role }}{% endfilter %}
{% raw %}{{ not evaluated }} {% if %}{% endraw %}
{%- set a, b = 1, 2.5 %}
math: {{ a + b }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1e3 }} {{ 10 / 5 }} {{ 3 * 'ab' }} {{ [1] * 3 }} {{ 1_000 }}
cmp: {{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 'x' not in ['y'] }} {{ true and 'yes' or 'no' }} {{ none or 0 or '' or 'last' }} {{ not none }}
types: {{ none }} {{ true }} {{ [1, 'two', none, false, 3.5, {'k': [1, 2]}] }} {{ (1,) }} {{ (1, 'x') }} {{ {'a': 'it\'s', "b": "q\"uote"} }}
tests: {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby(3) }} {{ 9 is divisibleby 4 }} {{ 'x' is string }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer }} {{ true is boolean }} {{ {} is mapping }} {{ [] is iterable }} {{ none is none }} {{ undefined_thing is undefined }} {{ messages is sequence }} {{ 2 is eq 2 }} {{ 2 is ne 3 }} {{ 1 is lt 2 }} {{ 'a' is in 'abc' }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ true is true }} {{ false is false }} {{ none is sameas none }}
filters: {{ messages | map(attribute='role') | join(', ') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [1, 2, 3] | sum }} {{ [1, 5, 3] | max }} {{ [4, 2, 8] | min }} {{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | reverse }} {{ [1, 2] | reverse | list }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ '42' | int + 1 }} {{ '3.5' | float }} {{ 'x' | int }} {{ 7 | string ~ '!' }} {{ 'hello world' | title }} {{ 'hello' | capitalize }} {{ 'a-b' | replace('-', '+') }} {{ '<&>' | e }} {{ 'two words' | wordcount }} {{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ {'b': 1, 'a': 2} | dictsort }} {{ {'k': 'v'} | items | list }} {{ undefined_thing | default('dflt') }} {{ '' | default('empty', true) }} {{ [none, 1, '', 'a'] | select | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ ['a', 'b'] | map('upper') | list }} {{ 'line1\nline2\n\nline4' | indent(2) }} {{ 'x\ny' | indent(4, true) }} {{ messages[0] | tojson }} {{ messages[0] | tojson(indent=2) }} {{ {'n': [1, 2.0, true, none]} | tojson }} {{ 'é"\\' | tojson }} {{ {'z': 1, 'a': 2} | tojson(sort_keys=true) }} {{ [1, 2] | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }} {{ 'ab' | list }} {{ [1, [2, 3]] | tojson(separators=(',', ':')) }}
methods: {{ '  pad  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  l'.lstrip() }}|{{ 'r  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|{{ 'hello there'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.find('z') }}|{{ 'banana'.count('a') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\nb'.splitlines() }}|{{ '12'.isdigit() }}|{{ '{} and {name}'.format(1, name='x') }}
dict: {{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b') }} {{ {'a': 1}.get('b', 2) }} {{ {'a': 1, 'b': 2}.keys() | list }} {{ {'a': 1, 'b': 2}.values() | list }} {% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }};{% endfor %}
{%- with x = 5, y = 'w' %} with: {{ x }}{{ y }}{% endwith %}
{%- set d = dict(a=1, b='two') %} dictfn: {{ d }} {{ d.a }} {{ d['b'] }} {{ range(3) | list }} {{ range(1, 10, 3) | list }}
{%- macro wrap() %}<{{ caller() }}>{% endmacro %}
 call: {% call wrap() %}inside {{ messages | length }}{% endcall %}
{%- for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}
{% if messages[0].role == 'system' %}sys{% elif messages[0].role == 'user' %}usr{% else %}other{% endif %}
{{ 'cond' if messages else 'empty' }} {{ messages[99] is defined }} {{ messages[0].nothing is defined }} {{ messages[0]['role'] }}
  {%+ if true %}kept-indent{% endif %}
    {% if true %}stripped-indent{% endif %}
{{ "adjacent" 'strings' }} {{ '\u00e9\x41\n' | tojson }}
""",
    "markup": "{{ 'a<b'|safe + '<c>' }} {{ '<x>' + 'y&'|safe }} {{ ('<'|e) + '>' }} {{ ('<'|safe) ~ '>' }} "
              "{{ ('<p>'|safe + '&')|upper }} {{ '<'|safe is escaped }} {{ '<' is escaped }} {{ ('<'|e)|e }} "
              "{{ '<'|forceescape|forceescape }} {{ ('x'|safe) * 2 + '<' }} {{ none|selectattr('a')|list }} "
              "{{ none|map(attribute='a')|list }} {{ ''|select|list }}",
    # what |map, |select, |unique, |items yield are generators: truthy even when empty, used up by one iteration,
    # without len() or indexing; dict views and range() print as Python prints them
    "lazy": "{% set g = messages | map(attribute='role') %}{{ g | list }}{{ g | list }}"
            "{% if [] | select %}T{% endif %}{{ (messages | selectattr('role'))[0] is defined }}"
            "{{ {'a': 1}.items() }}{{ {'a': 1}.keys() | length }}{{ {'a': 1}.values() }}{{ range(3) }}"
            "{{ range(1, 9, 2) }}{{ range(4)[1] }}{{ [1, 2] | reverse | list }}{{ [3, 1] | select | sort }}"
            "{{ [1, 2] | select | reverse }}{{ [1, 2] | select | first }}{{ 'user' in messages | map(attribute='role') }}"
            "{% for x in messages | map(attribute='role') | unique %}{{ loop.index }}{{ x }}{% endfor %}"
            "{{ {'b': 2} | items | list }}{{ [1, 2, 3] | batch(2) | list }}{{ ({'a': 1}.items() | list)[0] }}"
            "{{ 'T' if (1 | select) }}{{ 'T' if (3 | unique) }}{{ 2.0 is even }}{{ 'AB' is upper }}{{ ['x'] is lower }}"
            "{{ true | round }}{{ 7 | round }}{{ 2.5 | round }}",
    # a continue inside a block set leaves the iteration before the assignment
    "loop-control": "{% for m in messages %}{% set t %}{{ m.role }}{% if loop.first %}{% continue %}{% endif %}"
                    "{% endset %}[{{ t }}]{% filter upper %}{% if loop.index == 3 %}{% break %}{% endif %}"
                    "{{ m.role }}{% endfilter %}{% endfor %}",
    "lazy-iterate": "{% for x in 1 | select %}{{ x }}{% endfor %}",
    "lazy-len": "{{ messages | map(attribute='role') | length }}",
    "lazy-last": "{{ messages | selectattr('role') | last }}",
    "lazy-tojson": "{{ messages | map(attribute='role') | tojson }}",
    "view-tojson": "{{ messages[0].items() | tojson }}",
    # Python's string semantics past ASCII: full case mappings, str.isprintable() in repr, splitlines' line breaks
    "unicode-strings": "{{ 'straße ﬁne İ'.upper() }}|{{ 'ß ﬁ'.title() }}|{{ 'ǆungla' | title }}|{{ 'ﬁne'.capitalize() }}"
                       "|{{ ['a\\u00a0b', '\\u3000', '\\u2028', 'é', '\\x7f'] }}|{{ 'a\\u2028b\\x1cc\\r\\nd'.splitlines() }}"
                       "|{{ 'x\\n\\ny\\n' | indent(2) }}|{{ '' | indent(2, true) }}|{{ 'hello\\u00a0wörld_1 x' | wordcount }}"
                       "|{{ '  a  b  '.split(None, 1) }}|{{ 'İ'.lower() | length }}",
    "printf": "{{ '%s-%d' % ('a', 2.7) }}|{{ '%s' % [1] }}|{{ '%r' % 'x' }}|{{ '%%s' | format() }}"
              "|{{ '%s %s' | format(1, none) }}|{{ 'a' % [1] }}|{{ 'n=%i' % messages | length }}",
    "underscore": "{{ {'_id': 7, 'a': 1}._id }}|{{ messages[0].__class__ }}|{{ {'a': 1}._nope is defined }}",
    "underscore-use": "{{ messages[0].__class__.__name__ }}",
    "printf-extra": "{{ 'a' % 1 }}",
    "undefined-attr": "{{ messages[0].content.nothing.deeper }}",
    "raise": "{% if messages | length > 1 %}"
             "{{ raise_exception('Only one message is supported, got ' ~ messages | length) }}{% endif %}ok",
    "type-error": "{{ messages[0].content + 1 }}",
}


# ---------------------------------------------------------------- running

def render_jinja2(compiled, case):
    """Text and generation spans (in bytes) as transformers renders them, or the exception."""
    blocks, spans = [], []
    try:
        with compiled.environment.activate_tracker(blocks, spans):
            for block in compiled.generate(**copy.deepcopy(case)):
                blocks.append(block)
            text = "".join(blocks)
    except Exception as exc:  # noqa: BLE001 - any failure must be a failure in snug too
        return None, None, exc
    to_b = lambda i: len(text[:i].encode("utf-8"))  # noqa: E731
    return text, [[to_b(b), to_b(e)] for b, e in spans], None


# the templates above that Jinja2 renders for every conversation whose contents are strings (a check that failed on
# both sides would prove nothing)
MUST_RENDER = {"chatml-generation", "generation-nested", "syntax", "markup", "lazy", "loop-control", "unicode-strings",
               "printf", "underscore"}


def run_template(exe, tmp, name, source, cases):
    path = os.path.join(tmp, "t.jinja")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    with open(os.path.join(tmp, "cases.json"), "w", encoding="utf-8") as f:
        json.dump([c for _, c in cases], f, ensure_ascii=False)
    res = subprocess.run([exe, path, os.path.join(tmp, "cases.json")], capture_output=True, text=True)
    if res.returncode != 0:
        check(False, f"{name}: the driver failed: {res.stderr.strip()}")
        return False
    got = json.loads(res.stdout)
    try:
        compiled = _compile_jinja_template(source)
        compile_exc = None
    except Exception as exc:  # noqa: BLE001
        compiled, compile_exc = None, exc
    same = True
    for (cname, case), out in zip(cases, got):
        what = f"{name} [{cname}]"
        if compiled is None:
            ok = "error" in out
            check(ok, f"{what}: Jinja2 fails to compile ({compile_exc}) but snug compiles it")
            same &= ok
            continue
        text, spans, exc = render_jinja2(compiled, case)
        plain = all(isinstance(m.get("content"), str) for m in case["messages"])
        if exc is not None and name in MUST_RENDER and plain:
            check(False, f"{what}: Jinja2 raises {type(exc).__name__}: {exc} on a template written to render")
            same = False
            continue
        outcomes["raised" if exc is not None else "rendered"] += 1
        if exc is not None:
            ok = "error" in out
            check(ok, f"{what}: Jinja2 raises {type(exc).__name__}: {exc}, snug renders")
            if ok and "raise_exception" in source and type(exc).__name__ == "TemplateError":
                ok = str(exc) in out["error"]
                check(ok, f"{what}: snug's error does not carry the template's message {str(exc)!r}: {out['error']}")
            same &= ok
            continue
        if "error" in out:
            check(False, f"{what}: snug fails ({out['error']}), Jinja2 renders")
            same = False
            continue
        ok = out["text"] == text
        if not ok:
            at = next((i for i, (x, y) in enumerate(zip(out["text"], text)) if x != y),
                      min(len(text), len(out["text"])))
            check(False, f"{what}: text differs at character {at}: snug {out['text'][max(0, at - 30):at + 40]!r} "
                         f"Jinja2 {text[max(0, at - 30):at + 40]!r}")
            same = False
            continue
        ok = out["spans"] == spans
        check(ok, f"{what}: generation spans differ: snug {out['spans']} transformers {spans}")
        same &= ok
    return same


def main():
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_driver(tmp)
        cases = conversations()
        identical, differ = [], []
        for fname in sorted(os.listdir(TEMPLATES)):
            if not fname.endswith(".jinja"):
                continue
            with open(os.path.join(TEMPLATES, fname), encoding="utf-8") as f:
                source = f.read()
            (identical if run_template(exe, tmp, fname, source, cases) else differ).append(fname)
        for name, source in OWN.items():
            (identical if run_template(exe, tmp, name, source, cases) else differ).append(name)
        print(f"{len(identical)} templates render identically to Jinja2 over {len(cases)} conversations each "
              f"({outcomes['rendered']} renders equal, {outcomes['raised']} where both raise)")
        if differ:
            print("differ:", ", ".join(differ))
    # the summary line of tests/parity/common.py's finish (which this test does not import: it needs no torch)
    print(f"test_jinja_parity: {passes[0]} passed, {len(failures)} failed")
    sys.exit(1 if failures or not passes[0] else 0)


if __name__ == "__main__":
    main()

/* test_jinja.c: the Jinja interpreter (data/jinja.h) on small templates whose expected text and generation spans
 * Jinja2 3.1.6 produced in transformers' chat-template environment (trim_blocks, lstrip_blocks, loopcontrols, the
 * generation tag), and on the failures: syntax errors and unknown filters at compile time, raise_exception, an
 * undefined object's attribute and type errors at render time, each naming the line.
 * tests/parity/test_jinja_parity.py compares published chat templates at scale. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "data/jinja.h"

typedef struct jcase {
    const char *name, *src, *vars, *want;
    size_t nspans;
    snug_jinja_span spans[4];
} jcase;

/* a conversation the cases below render */
#define MSGS                                                                                                       \
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "                  \
    "\"content\": \"Hi \342\230\203\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}], "                  \
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}"

static const jcase CASES[] = {
    {"text only",
     "plain text\n",
     NULL,
     "plain text", 0, {}},
    {"trim_blocks",
     "{% if true %}\nyes\n{% endif %}\nend",
     NULL,
     "yes\nend", 0, {}},
    {"lstrip_blocks",
     "a\n    {% if true %}\n    b\n    {% endif %}\nc",
     NULL,
     "a\n    b\nc", 0, {}},
    {"whitespace control",
     "a  {{- ' b ' -}}  c\n  {%- if true -%}  d  {%- endif %}",
     NULL,
     "a b cd", 0, {}},
    {"plus keeps",
     "x\n  {%+ if true %}y{% endif %}",
     NULL,
     "x\n  y", 0, {}},
    {"comment trims",
     "a\n{# note #}\nb {#- x -#} c",
     NULL,
     "a\nbc", 0, {}},
    {"raw",
     "{% raw %}{{ x }}{% endraw %}",
     NULL,
     "{{ x }}", 0, {}},
    {"string escapes",
     "{{ 'a\\tb\\n\\u00e9\\x41' }}|{{ \"it's\" }}",
     NULL,
     "a\tb\n\303\251A|it's", 0, {}},
    {"python str of values",
     "{{ none }} {{ true }} {{ [1, 'a', none] }} {{ {'k': 1.5} }} {{ (1,) }} {{ 3 / 2 }} {{ 4 / 2 }}",
     NULL,
     "None True [1, 'a', None] {'k': 1.5} (1,) 1.5 2.0", 0, {}},
    {"arithmetic",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 8 }} {{ 'ab' * 2 }} {{ 1 + 2.5 }}",
     NULL,
     "3 -4 2 256 abab 3.5", 0, {}},
    {"undefined renders empty",
     "[{{ nothing }}][{{ nothing is defined }}][{% for x in nothing %}x{% endfor %}][{{ nothing | length }}]",
     NULL,
     "[][False][][0]", 0, {}},
    {"messages",
     "{% for m in messages %}{{ m.role }}={{ m['content'] }};{% endfor %}",
     MSGS,
     "system=Be brief.;user=Hi \342\230\203;assistant=Hello!;", 0, {}},
    {"loop variables",
     "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '!' if loop.last }}{{ loop.cycle('a', 'b"
     "') }} {% endfor %}",
     MSGS,
     "1/3a 2/3b 3/3!a ", 0, {}},
    {"loop filter and else",
     "{% for m in messages if m.role == 'user' %}{{ loop.length }}{% else %}none{% endfor %}{% for x in []"
     " %}x{% else %}empty{% endfor %}",
     MSGS,
     "1empty", 0, {}},
    {"break continue",
     "{% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}"
     "{{ i }}{% endfor %}",
     NULL,
     "023", 0, {}},
    {"namespace",
     "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
     MSGS,
     "3", 0, {}},
    {"loop scope",
     "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
     NULL,
     "231", 0, {}},
    {"block set",
     "{% set s %} {{ 1 + 1 }} {% endset %}[{{ s }}]",
     NULL,
     "[ 2 ]", 0, {}},
    {"macro",
     "{% macro tag(name, v='x') %}<{{ name }}:{{ v }}>{% endmacro %}{{ tag('a') }}{{ tag('b', v='y') }}{{ "
     "tag(v='z', name='c') }}",
     NULL,
     "<a:x><b:y><c:z>", 0, {}},
    {"call block",
     "{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}in{% endcall %}",
     NULL,
     "[in]", 0, {}},
    {"filter block",
     "{% filter upper %}shout{% endfilter %}",
     NULL,
     "SHOUT", 0, {}},
    {"tuple unpacking",
     "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}{% set p, q = 'xy' %}{{ q }}{{ p }}",
     NULL,
     "a1b2yx", 0, {}},
    {"slices",
     "{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ [1, 2, 3, 4][-2:] }} {{ 'h\303\251llo'[1] }} {{ [1, 2, 3][-1] }}",
     NULL,
     "el olleh [3, 4] \303\251 3", 0, {}},
    {"string methods",
     "{{ '  a b  '.strip() }}|{{ 'x,y'.split(',') }}|{{ 'abc'.startswith('ab') }}|{{ 'Hi'.upper() }}|{{ 'a"
     "-b'.replace('-', '+') }}|{{ 'aXa'.lstrip('a') }}",
     NULL,
     "a b|['x', 'y']|True|HI|a+b|Xa", 0, {}},
    {"filters",
     "{{ ' t ' | trim }}|{{ [3, 1, 2] | sort | join(',') }}|{{ messages | map(attribute='role') | list }}|"
     "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ x | default('d') }}|{{ [1,"
     " 1, 2] | unique | list }}",
     MSGS,
     "t|1,2,3|['system', 'user', 'assistant']|1|d|[1, 2]", 0, {}},
    {"tojson",
     "{{ messages[1] | tojson }}|{{ {'a': [1, 2.0, true, none]} | tojson(indent=2) }}",
     MSGS,
     "{\"role\": \"user\", \"content\": \"Hi \342\230\203\"}|{\n  \"a\": [\n    1,\n    2.0,\n    true,\n "
     "   null\n  ]\n}", 0, {}},
    {"tests",
     "{{ 3 is odd }}{{ 'x' is string }}{{ none is none }}{{ 1 is number }}{{ {} is mapping }}{{ x is undef"
     "ined }}{{ 6 is divisibleby 3 }}",
     NULL,
     "TrueTrueTrueTrueTrueTrueTrue", 0, {}},
    {"inline if",
     "{{ 'a' if false }}|{{ 'b' if false else 'c' }}|{{ 1 and 0 or 'z' }}",
     NULL,
     "|c|z", 0, {}},
    {"generation",
     "{% for m in messages %}{% if m.role == 'assistant' %}A:{% generation %}{{ m.content }}{% endgenerati"
     "on %}{% else %}{{ m.role }}:{{ m.content }};{% endif %}{% endfor %}",
     MSGS,
     "system:Be brief.;user:Hi \342\230\203;A:Hello!", 1, {{31, 37}}},
};

/* Renders src with vars (JSON text or NULL); returns the status and fills *o and *e. */
static int render(const char *src, const char *vars, snug_jinja_out *o, snug_error *e) {
    snug_jinja *t = NULL;
    memset(o, 0, sizeof *o);
    int rc = snug_jinja_compile(src, strlen(src), "test.jinja", &t, e);
    if (rc)
        return rc;
    json_t *v = NULL;
    if (vars) {
        json_error_t je;
        v = json_loads(vars, 0, &je);
        if (!v) {
            fprintf(stderr, "bad JSON in the test: %s\n", je.text);
            exit(1);
        }
    }
    rc = snug_jinja_render(t, v, o, e);
    json_decref(v);
    snug_jinja_free(t);
    return rc;
}

static void expect_error(const char *src, const char *vars, int code, const char *needle) {
    snug_jinja_out o;
    snug_error e = {0};
    int rc = render(src, vars, &o, &e);
    CHECKF(rc == code, "%s: status %d, want %d (%s)", src, rc, code, e.msg);
    CHECKF(rc == 0 || strstr(e.msg, needle) != NULL, "%s: error '%s' lacks '%s'", src, e.msg, needle);
    CHECKF(o.text == NULL && o.nspans == 0, "%s: output left after a failure", src);
    snug_jinja_out_free(&o);
}

int main(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const jcase *c = &CASES[i];
        snug_jinja_out o;
        snug_error e = {0};
        int rc = render(c->src, c->vars, &o, &e);
        CHECKF(rc == 0, "%s: %s", c->name, e.msg);
        if (rc)
            continue;
        CHECKF(o.len == strlen(c->want) && memcmp(o.text, c->want, o.len) == 0, "%s: got [%s] want [%s]", c->name,
               o.text, c->want);
        CHECKF(o.text[o.len] == 0, "%s: text not NUL-terminated", c->name);
        CHECKF(o.nspans == c->nspans, "%s: %zu spans, want %zu", c->name, o.nspans, c->nspans);
        for (size_t k = 0; k < o.nspans && k < c->nspans; k++)
            CHECKF(o.spans[k].begin == c->spans[k].begin && o.spans[k].end == c->spans[k].end,
                   "%s: span %zu is [%zu, %zu), want [%zu, %zu)", c->name, k, o.spans[k].begin, o.spans[k].end,
                   c->spans[k].begin, c->spans[k].end);
        snug_jinja_out_free(&o);
    }

    /* compile-time failures name the line and the construct */
    expect_error("a\n{{ x | nosuchfilter }}", NULL, SNUG_EINPUT, "line 2: no filter named 'nosuchfilter'");
    expect_error("{% for x in y %}{{ x is nosuchtest }}{% endfor %}", NULL, SNUG_EINPUT, "no test named 'nosuchtest'");
    /* inside an if, as in Jinja2, an unknown filter or test fails only when it runs */
    expect_error("{% if true %}{% for x in [1] %}{{ x | nosuch }}{% endfor %}{% endif %}", NULL, SNUG_EINPUT,
                 "no filter named 'nosuch'");
    expect_error("{% if x is string %}\n{{ x | from_json }}{% endif %}", "{\"x\": \"1\"}", SNUG_EINPUT,
                 "line 2: no filter named 'from_json'");
    {
        snug_jinja_out o;
        snug_error e = {0};
        CHECK(render("{% if x is string %}{{ x | from_json }}{% else %}{{ y | nosuch if y }}ok{% endif %}",
                     "{\"x\": 1}", &o, &e) == 0);
        CHECKF(o.text && !strcmp(o.text, "ok"), "a deferred unknown filter: %s %s", o.text ? o.text : "", e.msg);
        snug_jinja_out_free(&o);
    }
    expect_error("\n\n{% include 'other.jinja' %}", NULL, SNUG_EINPUT, "line 3: unknown or unsupported statement");
    expect_error("{% if true %}open", NULL, SNUG_EINPUT, "needs {% endif %}");
    expect_error("{% endfor %}", NULL, SNUG_EINPUT, "unexpected '{% endfor %}'");
    expect_error("{{ 'unterminated }}", NULL, SNUG_EINPUT, "unterminated string");
    expect_error("{{ 1 +", NULL, SNUG_EINPUT, "line 1");
    expect_error("{{ x", NULL, SNUG_EINPUT, "not closed");
    expect_error("{% for x in y recursive %}{% endfor %}", NULL, SNUG_EINPUT, "recursive for loops");
    expect_error("{% if true %}{% break %}{% endif %}", NULL, SNUG_EINPUT, "{% break %} outside a for loop");
    expect_error("{% for x in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}", NULL, SNUG_EINPUT,
                 "{% continue %} outside a for loop");
    expect_error("{% for x in [] %}{% else %}{% break %}{% endfor %}", NULL, SNUG_EINPUT, "outside a for loop");
    expect_error("{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}", NULL, SNUG_EINPUT,
                 "never calls caller()");
    /* render-time failures */
    expect_error("ok\n{{ raise_exception('Conversation roles must alternate') }}", NULL, SNUG_EINPUT,
                 "line 2: the template raised an error: Conversation roles must alternate");
    expect_error("{{ nothing.attr }}", NULL, SNUG_EINPUT, "'nothing' is undefined");
    expect_error("{{ m.a.b }}", "{\"m\": {}}", SNUG_EINPUT, "'dict object' has no attribute 'a'");
    expect_error("{{ 'a' + 1 }}", NULL, SNUG_EINPUT, "unsupported operand type(s) for +: 'str' and 'int'");
    expect_error("{{ 1 // 0 }}", NULL, SNUG_EINPUT, "division");
    expect_error("{{ 2 ** 64 }}", NULL, SNUG_EINPUT, "integer overflow");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, SNUG_EINPUT, "integer overflow");
    expect_error("{{ undefined_fn(1) }}", NULL, SNUG_EINPUT, "'undefined_fn' is undefined");
    expect_error("{{ 'x'.nosuchmethod() }}", NULL, SNUG_EINPUT, "has no attribute 'nosuchmethod'");
    expect_error("{% set x = 1 %}{% set x.y = 2 %}", NULL, SNUG_EINPUT, "only a namespace()");
    expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, SNUG_EINPUT, "nested too deeply");
    expect_error("{{ x }}", "[1]", SNUG_EINPUT, "must be a JSON object");

    /* whether a template marks what the assistant generates */
    {
        const char *with = "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                           "{% endgeneration %}{% endif %}{% endfor %}",
                   *without = "{# {% generation %} #}{% raw %}{% generation %}{% endraw %}";
        snug_jinja *t = NULL;
        snug_error e = {0};
        CHECK(snug_jinja_compile(with, strlen(with), NULL, &t, &e) == 0 && snug_jinja_has_generation(t));
        snug_jinja_free(t);
        CHECK(snug_jinja_compile(without, strlen(without), NULL, &t, &e) == 0 && !snug_jinja_has_generation(t));
        snug_jinja_free(t);
    }
    /* strftime_now is today's date, as datetime.now().strftime */
    {
        snug_jinja_out o;
        snug_error e = {0};
        CHECK(render("{{ strftime_now('%Y') }}", NULL, &o, &e) == 0);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char want[16];
        strftime(want, sizeof want, "%Y", &tm);
        CHECKF(o.text && strcmp(o.text, want) == 0, "strftime_now: %s, want %s", o.text ? o.text : "(none)", want);
        snug_jinja_out_free(&o);
    }
    /* one compiled template renders many times, with different variables, and NULL for none */
    {
        snug_jinja *t = NULL;
        snug_error e = {0};
        const char *src = "{{ n | default('none') }}";
        CHECK(snug_jinja_compile(src, strlen(src), NULL, &t, &e) == 0);
        for (int i = 0; i < 3; i++) {
            json_t *v = i ? json_pack("{s:i}", "n", i) : NULL;
            snug_jinja_out o;
            CHECK(snug_jinja_render(t, v, &o, &e) == 0);
            char want[16];
            snprintf(want, sizeof want, "%d", i);
            CHECKF(o.text && strcmp(o.text, i ? want : "none") == 0, "render %d: %s", i, o.text ? o.text : "");
            snug_jinja_out_free(&o);
            json_decref(v);
        }
        snug_jinja_free(t);
        snug_jinja_free(NULL);
        snug_jinja_out_free(NULL);
    }
    return check_finish("test_jinja");
}

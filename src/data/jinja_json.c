/* jinja_json.c: values to and from JSON for the Jinja interpreter: the render's variables from jansson (objects keep
 * their key order), and tojson as transformers defines it, json.dumps(x, ensure_ascii=False, indent=None,
 * separators=None, sort_keys=False): separators ", " and ": " ("," and ": " with an indent), floats as Python's
 * repr, non-ASCII kept, control characters as \u00XX. */
#include <string.h>

#include "core/json_util.h"
#include "data/jinja_impl.h"

jv jv_from_json(jrender *r, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = jd_new(r, json_object_size(j));
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)j, k, x) {
            d->k[d->n] = jv_str(k, strlen(k));
            d->v[d->n++] = jv_from_json(r, x);
        }
        jv v = {JV_DICT, 0, {.d = d}, 0};
        return v;
    }
    case JSON_ARRAY: {
        jv v = jv_list(r, json_array_size(j), 0);
        for (size_t i = 0; i < v.u.l->n; i++)
            v.u.l->v[i] = jv_from_json(r, json_array_get(j, i));
        return v;
    }
    case JSON_STRING: return jv_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int(json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    default: return jv_none();
    }
}

/* ---- tojson ---- */
static void json_str(jrender *r, jbuf *b, const char *s, size_t n, int ascii) {
    jb_putc(&r->a, b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        switch (ch) {
        case '"': jb_put(&r->a, b, "\\\"", 2); break;
        case '\\': jb_put(&r->a, b, "\\\\", 2); break;
        case '\n': jb_put(&r->a, b, "\\n", 2); break;
        case '\r': jb_put(&r->a, b, "\\r", 2); break;
        case '\t': jb_put(&r->a, b, "\\t", 2); break;
        case '\b': jb_put(&r->a, b, "\\b", 2); break;
        case '\f': jb_put(&r->a, b, "\\f", 2); break;
        default:
            if (ch < 0x20) {
                jb_printf(&r->a, b, "\\u%04x", ch);
            } else if (ch >= 0x80 && ascii) {
                unsigned cp = 0;
                int k = ch >= 0xF0 ? 3 : ch >= 0xE0 ? 2 : 1;
                cp = ch & (0x3F >> k);
                for (int m = 0; m < k && i + 1 < n; m++)
                    cp = (cp << 6) | ((unsigned char)s[++i] & 0x3F);
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    jb_printf(&r->a, b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
                } else {
                    jb_printf(&r->a, b, "\\u%04x", cp);
                }
            } else {
                jb_putc(&r->a, b, (char)ch);
            }
        }
    }
    jb_putc(&r->a, b, '"');
}

static void newline_indent(jrender *r, jbuf *b, int indent, int level) {
    jb_putc(&r->a, b, '\n');
    for (int i = 0; i < indent * level; i++)
        jb_putc(&r->a, b, ' ');
}

void jv_tojson(jrender *r, int line, jbuf *b, const jv *v, int indent, int level, int sort_keys, int ascii,
               const char *item_sep, const char *key_sep) {
    switch (v->t) {
    case JV_NONE: jb_put(&r->a, b, "null", 4); return;
    case JV_BOOL: jb_put(&r->a, b, v->u.b ? "true" : "false", v->u.b ? 4 : 5); return;
    case JV_INT: jb_printf(&r->a, b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT: {
        char tmp[32];
        int k = snug_json_py_float(v->u.f, tmp);
        jb_put(&r->a, b, tmp, (size_t)k);
        return;
    }
    case JV_STR: json_str(r, b, v->u.s, v->n, ascii); return;
    case JV_LIST: {
        const jlist *l = v->u.l;
        if (l->kind != JL_LIST)
            jr_fail(r, line, "tojson: Object of type %s is not JSON serializable", jl_pyname(l));
        jb_putc(&r->a, b, '[');
        if (!l->n) {
            jb_putc(&r->a, b, ']');
            return;
        }
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                jb_put(&r->a, b, item_sep, strlen(item_sep));
            if (indent >= 0)
                newline_indent(r, b, indent, level + 1);
            jv_tojson(r, line, b, &l->v[i], indent, level + 1, sort_keys, ascii, item_sep, key_sep);
        }
        if (indent >= 0)
            newline_indent(r, b, indent, level);
        jb_putc(&r->a, b, ']');
        return;
    }
    case JV_DICT: {
        const jdict *d = v->u.d;
        jb_putc(&r->a, b, '{');
        if (!d->n) {
            jb_putc(&r->a, b, '}');
            return;
        }
        size_t *ord = ja_alloc(&r->a, d->n * sizeof *ord);
        for (size_t i = 0; i < d->n; i++)
            ord[i] = i;
        if (sort_keys) /* insertion sort: dicts in templates are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && jv_compare(r, line, &d->k[ord[j - 1]], &d->k[ord[j]]) > 0; j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        for (size_t i = 0; i < d->n; i++) {
            const jv *k = &d->k[ord[i]];
            if (i)
                jb_put(&r->a, b, item_sep, strlen(item_sep));
            if (indent >= 0)
                newline_indent(r, b, indent, level + 1);
            if (k->t == JV_STR) {
                json_str(r, b, k->u.s, k->n, ascii);
            } else if (k->t == JV_INT || k->t == JV_FLOAT || k->t == JV_BOOL || k->t == JV_NONE) {
                jbuf kb = {0};
                jv_tojson(r, line, &kb, k, -1, 0, 0, ascii, item_sep, key_sep);
                json_str(r, b, kb.p, kb.n, ascii);
            } else {
                jr_fail(r, line, "tojson: keys must be str, int, float, bool or None, not %s", jv_type_name(k));
            }
            jb_put(&r->a, b, key_sep, strlen(key_sep));
            jv_tojson(r, line, b, &d->v[ord[i]], indent, level + 1, sort_keys, ascii, item_sep, key_sep);
        }
        if (indent >= 0)
            newline_indent(r, b, indent, level);
        jb_putc(&r->a, b, '}');
        return;
    }
    default:
        jr_fail(r, line, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

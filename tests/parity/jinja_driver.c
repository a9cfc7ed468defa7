/* jinja_driver.c: renders one chat template with snug's Jinja interpreter for test_jinja_parity.py.
 *
 *   jinja_driver TEMPLATE CASES_JSON
 *
 * CASES_JSON holds a JSON array of variable objects (messages, add_generation_prompt, ...). Prints a JSON array
 * with, per case, {"text": ..., "spans": [[begin, end], ...]} (byte offsets of the {% generation %} output) or
 * {"error": message, "code": status} when compiling or rendering fails. */
#include <stdio.h>
#include <stdlib.h>

#include "data/jinja.h"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)len + 1);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p)
        p[len] = 0;
    *n = (size_t)len;
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: jinja_driver TEMPLATE CASES_JSON\n");
        return 2;
    }
    size_t n;
    char *src = slurp(argv[1], &n);
    json_error_t jerr;
    json_t *cases = json_load_file(argv[2], 0, &jerr);
    if (!src || !json_is_array(cases)) {
        fprintf(stderr, "cannot read %s or %s\n", argv[1], argv[2]);
        return 2;
    }
    snug_error e = {0};
    snug_jinja *t = NULL;
    int crc = snug_jinja_compile(src, n, argv[1], &t, &e);
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *res = json_object();
        if (crc) {
            json_object_set_new(res, "error", json_string(e.msg));
            json_object_set_new(res, "code", json_integer(crc));
        } else {
            snug_jinja_out o;
            snug_error re = {0};
            int rc = snug_jinja_render(t, json_array_get(cases, i), &o, &re);
            if (rc) {
                json_object_set_new(res, "error", json_string(re.msg));
                json_object_set_new(res, "code", json_integer(rc));
            } else {
                json_object_set_new(res, "text", json_stringn(o.text, o.len));
                json_t *spans = json_array();
                for (size_t k = 0; k < o.nspans; k++)
                    json_array_append_new(spans, json_pack("[II]", (json_int_t)o.spans[k].begin,
                                                           (json_int_t)o.spans[k].end));
                json_object_set_new(res, "spans", spans);
                snug_jinja_out_free(&o);
            }
        }
        json_array_append_new(out, res);
    }
    char *s = json_dumps(out, JSON_ENSURE_ASCII | JSON_COMPACT);
    fputs(s, stdout);
    free(s);
    json_decref(out);
    json_decref(cases);
    snug_jinja_free(t);
    free(src);
    return 0;
}

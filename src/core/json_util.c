/* json_util.c: see json_util.h. */
#include "core/json_util.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *snug_json_type_name(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int snug_json_is_huge(const json_t *j) {
    if (!json_is_real(j))
        return 0;
    double v = json_real_value(j);
    return v >= 0x1p63 || v < -0x1p63; /* json_int_t is 64 bits */
}

/* One rewrite of a number literal: the bytes [at, at + old_len) of the original text become rep. */
typedef struct num_edit {
    size_t at, old_len;
    const char *rep;
    int line; /* 1-based, as jansson counts */
} num_edit;

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* How the number literal s[0..n) must be rewritten for jansson to take it, or NULL when it takes it as it is. */
static const char *rewrite_of(const char *s, size_t n, int is_int) {
    char small[64], *t = n < sizeof small ? small : malloc(n + 1);
    if (!t)
        return NULL; /* the second decode then fails on it as the first did */
    memcpy(t, s, n);
    t[n] = '\0';
    const char *rep = NULL;
    errno = 0;
    if (is_int)
        (void)strtoll(t, NULL, 10);
    if (!is_int || errno == ERANGE) {
        errno = 0;
        double d = strtod(t, NULL);
        if (errno == ERANGE && (d > DBL_MAX || d < -DBL_MAX))
            rep = s[0] == '-' ? "-1.7976931348623157e308" : "1.7976931348623157e308";
        else if (is_int)
            rep = ".0"; /* appended: the same value, read as a real */
    }
    if (t != small)
        free(t);
    return rep;
}

/* The rewrites the number literals of buf need (outside strings), in text order; returns how many, -1 when out of
 * memory. */
static long find_edits(const char *buf, size_t len, num_edit **out) {
    num_edit *v = NULL;
    size_t n = 0, cap = 0;
    int line = 1;
    for (size_t i = 0; i < len;) {
        char c = buf[i];
        if (c == '\n')
            line++;
        if (c == '"') {
            for (i++; i < len && buf[i] != '"'; i++) {
                if (buf[i] == '\\')
                    i++;
                else if (buf[i] == '\n')
                    line++;
            }
            i++;
            continue;
        }
        if (c != '-' && !is_digit(c)) {
            i++;
            continue;
        }
        size_t start = i++;
        while (i < len && is_digit(buf[i]))
            i++;
        int is_int = !(i < len && (buf[i] == '.' || buf[i] == 'e' || buf[i] == 'E'));
        while (i < len && (is_digit(buf[i]) || buf[i] == '.' || buf[i] == 'e' || buf[i] == 'E' || buf[i] == '+' ||
                           buf[i] == '-'))
            i++;
        const char *rep = rewrite_of(buf + start, i - start, is_int);
        if (!rep)
            continue;
        if (n == cap) {
            num_edit *g = realloc(v, (cap = cap ? 2 * cap : 8) * sizeof *v);
            if (!g) {
                free(v);
                return -1;
            }
            v = g;
        }
        int append = rep[0] == '.';
        v[n++] = (num_edit){.at = append ? i : start, .old_len = append ? 0 : i - start, .rep = rep, .line = line};
    }
    *out = v;
    return (long)n;
}

/* Moves an error found in the rewritten text back to where it is in the original. */
static void map_error(json_error_t *err, const num_edit *ed, long n) {
    size_t pos = (size_t)err->position;
    long shift = 0, col_shift = 0; /* bytes the edits before the error added */
    for (long k = 0; k < n; k++) {
        size_t rep_len = strlen(ed[k].rep), new_end = ed[k].at + (size_t)shift + rep_len;
        if (new_end > pos)
            break;
        long d = (long)rep_len - (long)ed[k].old_len;
        shift += d;
        if (ed[k].line == err->line)
            col_shift += d;
    }
    err->position -= (int)shift;
    err->column -= (int)col_shift;
}

json_t *snug_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err) {
    json_t *root = json_loadb(buf, len, flags, err);
    if (root || json_error_code(err) != json_error_numeric_overflow)
        return root;
    num_edit *ed = NULL;
    long n = find_edits(buf, len, &ed);
    if (n <= 0) /* out of memory, or nothing to rewrite: keep the first error */
        return NULL;
    size_t cap = len;
    for (long k = 0; k < n; k++)
        cap += strlen(ed[k].rep);
    char *text = malloc(cap ? cap : 1);
    if (!text) {
        free(ed);
        return NULL;
    }
    size_t w = 0, r = 0;
    for (long k = 0; k < n; k++) {
        memcpy(text + w, buf + r, ed[k].at - r);
        w += ed[k].at - r;
        size_t rl = strlen(ed[k].rep);
        memcpy(text + w, ed[k].rep, rl);
        w += rl;
        r = ed[k].at + ed[k].old_len;
    }
    memcpy(text + w, buf + r, len - r);
    w += len - r;
    json_error_t again;
    root = json_loadb(text, w, flags, &again);
    if (!root) {
        map_error(&again, ed, n);
        *err = again;
    }
    free(text);
    free(ed);
    return root;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Python's float repr */

/* v as D * 10^E with D of exactly p digits, correctly rounded (printf rounds exactly); 0 when v reads back. */
static int digits_of(double v, int p, unsigned long long *D, int *E) {
    char s[48];
    snprintf(s, sizeof s, "%.*e", p - 1, v);
    unsigned long long d = 0;
    const char *c = s;
    for (; *c && *c != 'e'; c++)
        if (is_digit(*c))
            d = d * 10 + (unsigned long long)(*c - '0');
    *D = d;
    *E = atoi(c + 1) - (p - 1);
    return strtod(s, NULL) == v;
}

static double value_of(unsigned long long D, int E) {
    char s[48];
    snprintf(s, sizeof s, "%llue%d", D, E);
    return strtod(s, NULL);
}

int snug_json_py_float(double v, char buf[32]) {
    if (v != v)
        return snprintf(buf, 32, "NaN");
    if (v > DBL_MAX || v < -DBL_MAX)
        return snprintf(buf, 32, v > 0 ? "Infinity" : "-Infinity");
    int neg = signbit(v) != 0;
    double a = neg ? -v : v;
    unsigned long long D = 0;
    int E = 0;
    if (a == 0) {
        D = 0;
    } else {
        /* the shortest p whose nearest p-digit decimal reads back; when it does not, its neighbour on v's other side
         * may (v a power of two, where the interval of values reading back is lopsided): the closest wins first */
        for (int p = 1; p <= 17; p++) {
            if (digits_of(a, p, &D, &E))
                break;
            unsigned long long other = value_of(D, E) > a ? D - 1 : D + 1;
            if (other > 0 && value_of(other, E) == a) {
                D = other;
                break;
            }
        }
        while (D % 10 == 0) {
            D /= 10;
            E++;
        }
    }
    char ds[24];
    int nd = snprintf(ds, sizeof ds, "%llu", D);
    int decpt = E + nd; /* v = 0.ds * 10^decpt */
    char *o = buf;
    if (neg)
        *o++ = '-';
    if (a != 0 && (decpt <= -4 || decpt > 16)) {
        *o++ = ds[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, ds + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        int x = decpt - 1;
        o += sprintf(o, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    } else if (a == 0) {
        o += sprintf(o, "0.0");
    } else if (decpt <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int k = 0; k < -decpt; k++)
            *o++ = '0';
        memcpy(o, ds, (size_t)nd);
        o += nd;
    } else if (decpt >= nd) {
        memcpy(o, ds, (size_t)nd);
        o += nd;
        for (int k = 0; k < decpt - nd; k++)
            *o++ = '0';
        o += sprintf(o, ".0");
    } else {
        memcpy(o, ds, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, ds + decpt, (size_t)(nd - decpt));
        o += nd - decpt;
    }
    *o = '\0';
    return (int)(o - buf);
}

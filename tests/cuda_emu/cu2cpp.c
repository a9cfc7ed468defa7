/* cu2cpp.c: turns a .cu file into host C++ for the emulated CUDA runtime, changing only the two constructs a host
 * compiler cannot take or cannot give their GPU meaning, and never a line's number (a sanitizer's report names the
 * .cu file's own line):
 *
 *   kernel<<<grid, block[, smem[, stream]]>>>(args)
 *       -> ::snug_emu::launch<kernel>(__FILE__, __LINE__, grid, block[, smem[, stream]])(args)
 *   __shared__ [__align__(N)] T a[D1][D2], b[D];      (one array per block, whichever thread reaches it first)
 *       -> T (&a)[D1][D2] = ::snug_emu::shared<T[D1][D2]>(N, "a", __LINE__); T (&b)[D] = ...;
 *   extern __shared__ [__align__(N)] T s[];            (the launch's dynamic shared memory)
 *       -> T *s = (T *)::snug_emu::dynamic_shared(N);
 *
 * Everything else (the device functions, the intrinsics, __syncthreads...) is left to the emulator's headers.
 * Comments and literals are copied untouched.
 *
 *     cu2cpp IN.cu OUT.cpp */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *s;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s) {
            fprintf(stderr, "cu2cpp: out of memory\n");
            exit(1);
        }
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

static const char *path;
static int lineno(const char *src, const char *at) {
    int l = 1;
    for (const char *p = src; p < at; p++)
        l += *p == '\n';
    return l;
}
static void die(const char *src, const char *at, const char *why) {
    fprintf(stderr, "%s:%d: cu2cpp: %s\n", path, lineno(src, at), why);
    exit(1);
}

static int ident(int c) { return isalnum(c) || c == '_'; }

/* Length of a comment or literal starting at p (0 when p starts neither). */
static size_t skip_opaque(const char *p) {
    const char *q = p;
    if (p[0] == '/' && p[1] == '/') {
        while (*q && *q != '\n')
            q++;
        return (size_t)(q - p);
    }
    if (p[0] == '/' && p[1] == '*') {
        q = strstr(p + 2, "*/");
        return q ? (size_t)(q + 2 - p) : strlen(p);
    }
    if (*p == '"' || *p == '\'') {
        char quote = *p;
        for (q = p + 1; *q && *q != quote; q++)
            if (*q == '\\' && q[1])
                q++;
        return (size_t)(q + (*q ? 1 : 0) - p);
    }
    return 0;
}

/* The kernel expression that ends the output: an identifier (with ::) and an optional <template arguments>. Returns
 * its start offset in out. */
static size_t kernel_start(const buf *out, const char *src, const char *at) {
    size_t i = out->n;
    while (i > 0 && isspace((unsigned char)out->s[i - 1]))
        i--;
    if (i > 0 && out->s[i - 1] == '>') {
        int depth = 0;
        while (i > 0) {
            char c = out->s[--i];
            depth += c == '>' ? 1 : c == '<' ? -1 : 0;
            if (depth == 0)
                break;
        }
        if (depth)
            die(src, at, "unbalanced template arguments before <<<");
    }
    while (i > 0 && (ident((unsigned char)out->s[i - 1]) || out->s[i - 1] == ':'))
        i--;
    if (i == out->n)
        die(src, at, "no kernel name before <<<");
    return i;
}

/* Copies p .. end to out, but a run of whitespace that holds a newline keeps its newlines only (line numbers). */
static void put_trim(buf *out, const char *p, const char *end) {
    while (p < end && isspace((unsigned char)*p))
        p++;
    while (end > p && isspace((unsigned char)end[-1]))
        end--;
    put(out, p, (size_t)(end - p));
}

/* Translates `__shared__ ... ;` at p (just after the keyword); returns the position after the ';'. */
static const char *shared_decl(buf *out, const char *src, const char *p, int is_extern) {
    const char *semi = p;
    int depth = 0;
    for (; *semi && !(*semi == ';' && depth == 0); semi++)
        depth += (*semi == '(' || *semi == '[') - (*semi == ')' || *semi == ']');
    if (!*semi)
        die(src, p, "__shared__ declaration without ';'");
    int newlines = 0;
    for (const char *q = p; q < semi; q++)
        newlines += *q == '\n';
    const char *q = p;
    while (isspace((unsigned char)*q))
        q++;
    char align[64] = "0";
    if (!strncmp(q, "__align__", 9)) {
        const char *open = strchr(q, '('), *close = open ? strchr(open, ')') : NULL;
        if (!close || close > semi || (size_t)(close - open) >= sizeof align)
            die(src, q, "malformed __align__");
        memcpy(align, open + 1, (size_t)(close - open - 1));
        align[close - open - 1] = 0;
        q = close + 1;
    }
    /* declarators split at top-level commas; the first carries the type */
    const char *parts[16], *ends[16];
    int np = 0;
    depth = 0;
    parts[np] = q;
    for (const char *r = q; r < semi; r++) {
        depth += (*r == '(' || *r == '[') - (*r == ')' || *r == ']');
        if (*r == ',' && depth == 0) {
            if (np == 15)
                die(src, r, "too many declarators");
            ends[np++] = r;
            parts[np] = r + 1;
        }
    }
    ends[np++] = semi;
    char type[256] = "";
    for (int k = 0; k < np; k++) {
        const char *a = parts[k], *e = ends[k];
        while (a < e && isspace((unsigned char)*a))
            a++;
        while (e > a && isspace((unsigned char)e[-1]))
            e--;
        const char *dims = memchr(a, '[', (size_t)(e - a));
        if (!dims)
            dims = e;
        const char *ne = dims;
        while (ne > a && isspace((unsigned char)ne[-1]))
            ne--;
        const char *nb = ne;
        while (nb > a && ident((unsigned char)nb[-1]))
            nb--;
        if (nb == ne)
            die(src, a, "cannot find the name of a __shared__ variable");
        if (k == 0) {
            const char *te = nb;
            while (te > a && isspace((unsigned char)te[-1]))
                te--;
            if (te == a || (size_t)(te - a) >= sizeof type)
                die(src, a, "cannot find the type of a __shared__ variable");
            memcpy(type, a, (size_t)(te - a));
            type[te - a] = 0;
        }
        char name[128];
        if ((size_t)(ne - nb) >= sizeof name)
            die(src, a, "name too long");
        memcpy(name, nb, (size_t)(ne - nb));
        name[ne - nb] = 0;
        char line[1024];
        if (is_extern) {
            if (np != 1 || strncmp(dims, "[]", 2))
                die(src, a, "extern __shared__ must declare one array of unknown size");
            snprintf(line, sizeof line, "%s *%s = (%s *)::snug_emu::dynamic_shared(%s);", type, name, type, align);
        } else {
            char d[256];
            size_t dl = (size_t)(e - dims);
            if (dl >= sizeof d)
                die(src, a, "dimensions too long");
            memcpy(d, dims, dl);
            d[dl] = 0;
            if (dl)
                snprintf(line, sizeof line, "%s (&%s)%s = ::snug_emu::shared<%s%s>(%s, \"%s\", __LINE__);", type,
                         name, d, type, d, align, name);
            else
                snprintf(line, sizeof line, "%s &%s = ::snug_emu::shared<%s>(%s, \"%s\", __LINE__);", type, name,
                         type, align, name);
        }
        if (k)
            puts_(out, " ");
        puts_(out, line);
    }
    for (int i = 0; i < newlines; i++)
        puts_(out, "\n");
    return semi + 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: cu2cpp IN.cu OUT.cpp\n");
        return 2;
    }
    path = argv[1];
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    buf in = {0}, out = {0};
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        put(&in, chunk, got);
    fclose(f);
    if (!in.s)
        put(&in, "", 0);
    char hdr[4200];
    snprintf(hdr, sizeof hdr, "#line 1 \"%s\"\n", argv[1]);
    puts_(&out, hdr);
    const char *src = in.s, *p = src;
    int launches = 0, shared = 0;
    while (*p) {
        size_t op = skip_opaque(p);
        if (op) {
            put(&out, p, op);
            p += op;
            continue;
        }
        if (!strncmp(p, "<<<", 3)) {
            size_t k = kernel_start(&out, src, p);
            char kernel[512];
            size_t kl = out.n - k;
            if (kl >= sizeof kernel)
                die(src, p, "kernel expression too long");
            memcpy(kernel, out.s + k, kl);
            kernel[kl] = 0;
            out.n = k;
            const char *close = strstr(p + 3, ">>>");
            if (!close)
                die(src, p, "<<< without >>>");
            puts_(&out, "::snug_emu::launch<");
            put_trim(&out, kernel, kernel + kl);
            puts_(&out, ">(__FILE__, __LINE__, ");
            put(&out, p + 3, (size_t)(close - p - 3));
            puts_(&out, ")");
            p = close + 3;
            launches++;
            continue;
        }
        if (!strncmp(p, "__shared__", 10) && (p == src || !ident((unsigned char)p[-1])) &&
            !ident((unsigned char)p[10])) {
            /* `extern` just before it: take it back from the output */
            size_t i = out.n;
            while (i > 0 && isspace((unsigned char)out.s[i - 1]))
                i--;
            int is_extern = i >= 6 && !strncmp(out.s + i - 6, "extern", 6) &&
                            (i == 6 || !ident((unsigned char)out.s[i - 7]));
            if (is_extern)
                out.n = i - 6;
            p = shared_decl(&out, src, p + 10, is_extern);
            shared++;
            continue;
        }
        put(&out, p, 1);
        p++;
    }
    FILE *o = fopen(argv[2], "wb");
    if (!o || fwrite(out.s, 1, out.n, o) != out.n || fclose(o)) {
        perror(argv[2]);
        return 1;
    }
    free(in.s);
    free(out.s);
    return 0;
}

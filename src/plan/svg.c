/* svg.c: the stacked bar chart of a memory plan (see svg.h). Plain SVG 1.1 text, no scripts or external fonts, so
 * browsers, rsvg-convert and ImageMagick render it alike. */
#include "plan/svg.h"

#include <fcntl.h>
#include <stdarg.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fileio.h"

extern char **environ;

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Categories first, then the runtime overhead (Tableau 10 colours: distinct, and readable in grey). */
static const char *const colours[SNUG_MEM_NCAT + 1] = {
    "#4e79a7", "#a0cbe8", "#f28e2b", "#e15759", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#76b7b2", "#bab0ac", "#9c9c9c",
};

typedef struct buf {
    char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap ? b->cap * 2 : 8192) + (size_t)k;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

/* Text with &, <, > and quotes escaped. */
static void put_text(buf *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': put(b, "&amp;"); break;
        case '<': put(b, "&lt;"); break;
        case '>': put(b, "&gt;"); break;
        case '"': put(b, "&quot;"); break;
        default: put(b, "%c", *s); break;
        }
    }
}

/* A tick step of 1, 2 or 5 x 10^k GiB giving at most 10 ticks up to max. */
static double tick_step(double max_gib) {
    double mag = pow(10.0, floor(log10(max_gib > 0 ? max_gib : 1.0)));
    const double m[] = {0.1, 0.2, 0.5, 1, 2, 5, 10};
    for (int i = 0; i < 7; i++)
        if (max_gib / (m[i] * mag) <= 10)
            return m[i] * mag;
    return 10 * mag;
}

static void fmt_gib(char *s, size_t n, double gib) {
    if (gib >= 1 && fabs(gib - floor(gib + 0.5)) < 1e-9)
        snprintf(s, n, "%.0f GiB", gib);
    else if (gib >= 100)
        snprintf(s, n, "%.0f GiB", gib);
    else if (gib >= 10)
        snprintf(s, n, "%.1f GiB", gib);
    else if (gib >= 1)
        snprintf(s, n, "%.2f GiB", gib);
    else
        snprintf(s, n, "%.0f MiB", gib * 1024);
}

/* Where a long label breaks into two lines: the last space before `at` characters, 0 when it fits on one. */
static size_t label_break(const char *s, size_t at) {
    size_t n = strlen(s), best = 0;
    if (n <= at)
        return 0;
    for (size_t i = 1; i < n && i <= at; i++)
        if (s[i] == ' ')
            best = i;
    return best;
}

/* Approximate width in pixels of text at font-size 11 (DejaVu Sans averages about 6.6 px per character). */
static double text_w(const char *s) { return 6.6 * (double)strlen(s); }

int snug_svg_write(const char *path, const char *title, const snug_svg_bar *bars, int nbars,
                   const snug_svg_line *lines, int nlines, snug_error *e) {
    const double W = 1040, LW = 390, x0 = LW + 12, PW = W - x0 - 90, bar_h = 20;
    const size_t LABEL_CHARS = 58;
    double maxb = 0;
    int wrapped = 0;
    for (int i = 0; i < nbars; i++) {
        double t = bars[i].overhead;
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            t += bars[i].bytes[c];
        if (t > maxb)
            maxb = t;
        wrapped |= label_break(bars[i].label, LABEL_CHARS) > 0;
    }
    double step = tick_step(maxb / GIB * 1.05), xmax = ceil(maxb / GIB * 1.05 / step) * step;
    if (xmax <= 0)
        xmax = step;

    /* GPU labels: each on the first row where it does not overlap a label already placed */
    enum { MAXROWS = 4 };
    double row_end[MAXROWS], lx[64];
    int lrow[64], nrows = 1, nl = nlines < 64 ? nlines : 64, crowded = 0;
    for (int r = 0; r < MAXROWS; r++)
        row_end[r] = -1e9;
    for (int i = 0; i < nl; i++) {
        lrow[i] = -1;
        double gib = lines[i].bytes / GIB;
        if (gib > xmax)
            continue;
        lx[i] = x0 + gib / xmax * PW;
        double half = text_w(lines[i].label) / 2 + 4;
        int r = 0;
        while (r < MAXROWS && lx[i] - half < row_end[r])
            r++;
        if (r == MAXROWS) { /* crowded: the line is drawn, its name goes to the caption */
            lrow[i] = MAXROWS;
            crowded = 1;
            continue;
        }
        lrow[i] = r;
        row_end[r] = lx[i] + half;
        if (r + 1 > nrows)
            nrows = r + 1;
    }
    if (crowded) { /* name none at the top rather than some: the caption names them all */
        for (int i = 0; i < nl; i++)
            if (lrow[i] >= 0)
                lrow[i] = MAXROWS;
        nrows = 0;
    }
    const double pitch = wrapped ? 36 : 30, y0 = 52 + 14 * nrows;
    double H = y0 + nbars * pitch + 100 + (crowded ? 20 : 0);
    buf b = {0};
    put(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    put(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n", W, H, W, H);
    put(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    put(&b, "<text x=\"16\" y=\"26\" font-size=\"16\" font-weight=\"bold\">");
    put_text(&b, title);
    put(&b, "</text>\n");

    /* grid and axis */
    double yb = y0 + nbars * pitch;
    for (double t = 0; t <= xmax + 1e-9; t += step) {
        double x = x0 + t / xmax * PW;
        char s[32];
        fmt_gib(s, sizeof s, t);
        put(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", x, y0 - 8, x, yb);
        put(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\">%s</text>\n", x, yb + 16,
            t == 0 ? "0" : s);
    }
    put(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\"/>\n", x0, yb, x0 + PW, yb);

    /* bars */
    for (int i = 0; i < nbars; i++) {
        double y = y0 + i * pitch + (pitch - bar_h) / 2 - 4, x = x0, total = 0;
        size_t brk = label_break(bars[i].label, LABEL_CHARS);
        put(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\"%s>", LW, y + bar_h - 5 - (brk ? 7 : 0),
            i == 0 ? " font-weight=\"bold\"" : "");
        if (brk) {
            char first[256];
            snprintf(first, sizeof first, "%.*s", (int)brk, bars[i].label);
            put_text(&b, first);
            put(&b, "<tspan x=\"%.1f\" dy=\"14\">", LW);
            put_text(&b, bars[i].label + brk + 1);
            put(&b, "</tspan>");
        } else {
            put_text(&b, bars[i].label);
        }
        put(&b, "</text>\n");
        for (int c = 0; c <= SNUG_MEM_NCAT; c++) {
            double v = c < SNUG_MEM_NCAT ? bars[i].bytes[c] : bars[i].overhead;
            total += v;
            double w = v / GIB / xmax * PW;
            if (w <= 0)
                continue;
            put(&b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\"/>\n", x, y, w, bar_h,
                colours[c]);
            x += w;
        }
        char s[32];
        fmt_gib(s, sizeof s, total / GIB);
        put(&b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x + 5, y + bar_h - 5, s);
    }

    /* GPU memory lines */
    for (int i = 0; i < nl; i++) {
        if (lrow[i] < 0)
            continue;
        double ly = 48 + 14 * lrow[i];
        put(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" stroke-dasharray=\"4,3\"/>\n",
            lx[i], lrow[i] == MAXROWS ? y0 - 8 : ly + 3, lx[i], yb);
        if (lrow[i] == MAXROWS)
            continue;
        put(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#c00\" font-size=\"11\">", lx[i], ly);
        put_text(&b, lines[i].label);
        put(&b, "</text>\n");
    }

    if (crowded) { /* the lines too close to name one by one */
        put(&b, "<text x=\"16\" y=\"%.1f\" fill=\"#c00\" font-size=\"11\">red dashed lines, left to right, the "
                "memory of: ", yb + 34);
        for (int i = 0, k = 0; i < nl; i++)
            if (lrow[i] >= 0) {
                put(&b, "%s", k++ ? ", " : "");
                put_text(&b, lines[i].label);
            }
        put(&b, "</text>\n");
    }

    /* legend */
    double ly = yb + 40 + (crowded ? 20 : 0);
    for (int c = 0; c <= SNUG_MEM_NCAT; c++) {
        double lx0 = 16 + (c % 4) * 250, y = ly + (c / 4) * 20;
        put(&b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" fill=\"%s\"/>\n", lx0, y - 11, colours[c]);
        put(&b, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", lx0 + 20, y,
            c < SNUG_MEM_NCAT ? snug_category_name((snug_category)c) : "runtime overhead");
    }
    put(&b, "</svg>\n");
    if (b.oom) {
        free(b.p);
        return snug_fail(e, SNUG_ENOMEM, "out of memory drawing %s", path);
    }
    int rc = snug_write_file_atomic(path, b.p, b.n, e);
    free(b.p);
    return rc;
}

/* Runs argv with its output discarded; returns its exit status, or -1 when it cannot start. */
static int run_quiet(char *const argv[]) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    int st;
    if (waitpid(pid, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int png_written(const char *png) {
    struct stat st;
    unsigned char sig[8] = {0};
    FILE *f = fopen(png, "rb");
    if (!f)
        return 0;
    size_t n = fread(sig, 1, sizeof sig, f);
    fclose(f);
    return stat(png, &st) == 0 && n == 8 && memcmp(sig, "\x89PNG\r\n\x1a\n", 8) == 0;
}

int snug_svg_to_png(const char *svg_path, const char *png_path) {
    char *rsvg[] = {"rsvg-convert", "--background-color=white", "-o", (char *)png_path, (char *)svg_path, NULL};
    if (run_quiet(rsvg) == 0 && png_written(png_path))
        return 0;
    char *magick[] = {"convert", (char *)svg_path, (char *)png_path, NULL};
    if (run_quiet(magick) == 0 && png_written(png_path))
        return 0;
    unlink(png_path); /* nothing half-written left behind */
    return 1;
}

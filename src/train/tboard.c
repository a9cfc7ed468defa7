/* tboard.c: TensorBoard event files (see tboard.h). */
#include "train/tboard.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/fileio.h"

uint32_t snug_crc32c(const void *p, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) { /* the reflected Castagnoli polynomial 0x82F63B78, a byte at a time */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    const unsigned char *b = p;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        c = table[(c ^ b[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t snug_crc32c_masked(const void *p, size_t n) {
    uint32_t c = snug_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/* ---- protobuf: the few encodings an Event needs ---- */

typedef struct pbuf {
    unsigned char b[4096];
    size_t n;
    int over; /* it did not fit */
} pbuf;

static void put_bytes(pbuf *p, const void *src, size_t n) {
    if (p->n + n > sizeof p->b) {
        p->over = 1;
        return;
    }
    memcpy(p->b + p->n, src, n);
    p->n += n;
}

static void put_varint(pbuf *p, uint64_t v) {
    unsigned char t[10];
    size_t k = 0;
    do {
        t[k++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put_bytes(p, t, k);
}

static void put_le(pbuf *p, uint64_t v, int bytes) {
    unsigned char t[8];
    for (int i = 0; i < bytes; i++)
        t[i] = (unsigned char)(v >> (8 * i));
    put_bytes(p, t, (size_t)bytes);
}

/* field number f with wire type w */
static void put_key(pbuf *p, int f, int w) { put_varint(p, (uint64_t)(f << 3 | w)); }

static void put_double(pbuf *p, int f, double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    put_key(p, f, 1);
    put_le(p, u, 8);
}

static void put_float(pbuf *p, int f, float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    put_key(p, f, 5);
    put_le(p, u, 4);
}

static void put_len(pbuf *p, int f, const void *src, size_t n) {
    put_key(p, f, 2);
    put_varint(p, n);
    put_bytes(p, src, n);
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- records ---- */

static int write_record(snug_tboard *tb, const pbuf *ev, snug_error *e) {
    if (ev->over)
        return snug_fail(e, SNUG_EINTERNAL, "%s: an event of more than %zu bytes", tb->path, sizeof ev->b);
    unsigned char head[12];
    uint64_t len = ev->n;
    for (int i = 0; i < 8; i++)
        head[i] = (unsigned char)(len >> (8 * i));
    uint32_t hc = snug_crc32c_masked(head, 8), dc = snug_crc32c_masked(ev->b, ev->n);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (unsigned char)(hc >> (8 * i));
    unsigned char tail[4];
    for (int i = 0; i < 4; i++)
        tail[i] = (unsigned char)(dc >> (8 * i));
    if (fwrite(head, 1, 12, tb->f) != 12 || fwrite(ev->b, 1, ev->n, tb->f) != ev->n || fwrite(tail, 1, 4, tb->f) != 4 ||
        fflush(tb->f))
        return snug_fail(e, SNUG_EIO, "%s: cannot write the TensorBoard event: %s", tb->path, strerror(errno));
    return 0;
}

int snug_tboard_open(snug_tboard *tb, const char *dir, snug_error *e) {
    memset(tb, 0, sizeof *tb);
    SNUG_TRY(snug_mkdirs(dir, e));
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    double now = wall_now();
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s.%d.0", dir, (long long)now, host,
             (int)getpid());
    if (!(tb->f = fopen(tb->path, "wb")))
        return snug_fail(e, SNUG_EIO, "%s: cannot create the TensorBoard event file: %s; check logging_dir", tb->path,
                         strerror(errno));
    pbuf ev = {.n = 0};
    put_double(&ev, 1, now);
    static const char version[] = "brain.Event:2";
    put_len(&ev, 3, version, sizeof version - 1);
    int rc = write_record(tb, &ev, e);
    if (rc)
        snug_tboard_close(tb);
    return rc;
}

int snug_tboard_scalars(snug_tboard *tb, int64_t step, const char *const *tags, const double *values, int n,
                        snug_error *e) {
    if (!tb->f)
        return 0;
    pbuf sum = {.n = 0}, val, ev = {.n = 0};
    for (int i = 0; i < n; i++) {
        val.n = 0, val.over = 0;
        put_len(&val, 1, tags[i], strlen(tags[i]));
        put_float(&val, 2, (float)values[i]);
        put_len(&sum, 1, val.b, val.n);
        sum.over |= val.over;
    }
    put_double(&ev, 1, wall_now());
    put_key(&ev, 2, 0);
    put_varint(&ev, (uint64_t)step);
    put_len(&ev, 5, sum.b, sum.n);
    ev.over |= sum.over;
    return write_record(tb, &ev, e);
}

void snug_tboard_close(snug_tboard *tb) {
    if (tb->f)
        fclose(tb->f);
    tb->f = NULL;
}

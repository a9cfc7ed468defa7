/* fileio.c: atomic writes (temporary file, fsync, rename, fsync of the folder) and whole-file reads (see fileio.h).
 *
 * A checkpoint or config is either the old file or the new one, never half of each, even after a crash. */
#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

enum { IO_ALIGN = 4096 }; /* what O_DIRECT asks of buffers, offsets and sizes on every file system snug meets */

int snug_atomic_open(snug_atomic_file *af, const char *path, const snug_write_opts *opts, snug_error *e) {
    memset(af, 0, sizeof *af);
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof af->path)
        return snug_fail(e, SNUG_EINPUT, "cannot write \"%.200s\": the path is empty or longer than %zu bytes; "
                         "use a shorter path", path, sizeof af->path - 1);
    memcpy(af->path, path, n + 1);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid());
    af->cap = opts && opts->direct ? (size_t)8 << 20 : (size_t)64 << 10;
    af->buf = aligned_alloc(IO_ALIGN, af->cap);
    if (!af->buf) {
        af->tmp[0] = '\0';
        return snug_fail(e, SNUG_ENOMEM, "out of host memory writing %s", path);
    }
    af->fd = open(af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (af->fd < 0) {
        int err = errno;
        free(af->buf);
        af->buf = NULL;
        af->tmp[0] = '\0';
        return snug_fail(e, SNUG_EIO, "cannot create %s.tmp.%ld: %s; check that the folder exists and is writable",
                         path, (long)getpid(), strerror(err));
    }
    /* a file system without direct I/O (tmpfs) refuses the flag: the file is then written through the page cache */
    int fl = opts && opts->direct ? fcntl(af->fd, F_GETFL) : -1;
    af->direct = fl >= 0 && fcntl(af->fd, F_SETFL, fl | O_DIRECT) == 0;
    af->hash = opts ? opts->hash : NULL;
    return 0;
}

static int direct_off(snug_atomic_file *af) {
    int fl = fcntl(af->fd, F_GETFL);
    af->direct = 0;
    return fl >= 0 ? fcntl(af->fd, F_SETFL, fl & ~O_DIRECT) : -1;
}

/* n bytes to the file as they are (whole aligned blocks from an aligned p while direct). */
static int put(snug_atomic_file *af, const unsigned char *p, size_t n, snug_error *e) {
    while (n) {
        ssize_t w = write(af->fd, p, n < ((size_t)1 << 30) ? n : (size_t)1 << 30);
        if (w < 0 && errno == EINTR)
            continue;
        /* a direct write refused (a short write left the offset unaligned, a device with larger blocks): the rest
         * goes through the page cache */
        if (w < 0 && errno == EINVAL && af->direct && direct_off(af) == 0)
            continue;
        if (w <= 0) {
            int err = w < 0 ? errno : ENOSPC;
            snug_fail(e, SNUG_EIO, "cannot write %s: %s; check free disk space and permissions", af->tmp,
                      strerror(err));
            snug_atomic_abort(af);
            return SNUG_EIO;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int snug_atomic_write(snug_atomic_file *af, const void *data, size_t n, snug_error *e) {
    if (!af->buf)
        return snug_fail(e, SNUG_EINTERNAL, "writing %s: the file is not open (write after commit or abort)",
                         af->path);
    if (af->hash)
        snug_hash_update(af->hash, data, n);
    const unsigned char *p = data;
    while (n) {
        if (af->direct && !af->len && n >= IO_ALIGN && (uintptr_t)p % IO_ALIGN == 0) {
            size_t k = n / IO_ALIGN * IO_ALIGN; /* from the caller's memory to the disk, copied nowhere */
            SNUG_TRY(put(af, p, k, e));
            p += k;
            n -= k;
            continue;
        }
        size_t k = n < af->cap - af->len ? n : af->cap - af->len;
        memcpy(af->buf + af->len, p, k);
        af->len += k;
        p += k;
        n -= k;
        if (af->len == af->cap) {
            SNUG_TRY(put(af, af->buf, af->len, e));
            af->len = 0;
        }
    }
    return 0;
}

/* Makes the rename durable. Some file systems cannot fsync a folder (EINVAL); the rename is still done. */
static int fsync_parent(const char *path, snug_error *e) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return 0;
    int rc = fsync(fd), err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL && err != ENOTSUP)
        return snug_fail(e, SNUG_EIO, "cannot fsync folder %s after writing %s: %s", dir, path, strerror(err));
    return 0;
}

int snug_atomic_commit(snug_atomic_file *af, snug_error *e) {
    if (!af->buf)
        return snug_fail(e, SNUG_EINTERNAL, "committing %s: the file is not open", af->path);
    /* what is left: its whole blocks directly, the tail (which O_DIRECT cannot take) through the page cache */
    size_t whole = af->direct ? af->len / IO_ALIGN * IO_ALIGN : 0;
    SNUG_TRY(put(af, af->buf, whole, e));
    if (af->direct && af->len > whole && direct_off(af) != 0) {
        int err = errno;
        snug_fail(e, SNUG_EIO, "cannot write %s: %s", af->tmp, strerror(err));
        snug_atomic_abort(af);
        return SNUG_EIO;
    }
    SNUG_TRY(put(af, af->buf + whole, af->len - whole, e));
    if (fsync(af->fd) != 0) {
        int err = errno;
        snug_fail(e, SNUG_EIO, "cannot write %s: %s; check free disk space and permissions", af->tmp,
                  strerror(err));
        snug_atomic_abort(af);
        return SNUG_EIO;
    }
    int rc = close(af->fd);
    free(af->buf);
    af->buf = NULL;
    if (rc != 0) {
        int err = errno;
        snug_fail(e, SNUG_EIO, "cannot close %s: %s; check free disk space", af->tmp, strerror(err));
        snug_atomic_abort(af);
        return SNUG_EIO;
    }
    if (rename(af->tmp, af->path) != 0) {
        int err = errno;
        snug_fail(e, SNUG_EIO, "cannot rename %s to %s: %s", af->tmp, af->path, strerror(err));
        snug_atomic_abort(af);
        return SNUG_EIO;
    }
    af->tmp[0] = '\0';
    return fsync_parent(af->path, e);
}

/* Safe to call more than once, and after a failed write or commit (which already aborted). */
void snug_atomic_abort(snug_atomic_file *af) {
    if (af->buf) {
        close(af->fd);
        free(af->buf);
        af->buf = NULL;
    }
    if (af->tmp[0]) {
        unlink(af->tmp);
        af->tmp[0] = '\0';
    }
}

int snug_write_file_atomic(const char *path, const void *data, size_t n, snug_error *e) {
    snug_atomic_file af;
    SNUG_TRY(snug_atomic_open(&af, path, NULL, e));
    SNUG_TRY(snug_atomic_write(&af, data, n, e));
    return snug_atomic_commit(&af, e);
}

int snug_read_file(const char *path, char **out, size_t *len, snug_error *e) {
    *out = NULL;
    if (len)
        *len = 0;
    struct stat ds;
    if (stat(path, &ds) == 0 && S_ISDIR(ds.st_mode))
        return snug_fail(e, SNUG_EINPUT, "%s is a folder where a file was expected; check the path", path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int err = errno;
        return snug_fail(e, SNUG_EIO, "cannot open %s: %s; check the path", path, strerror(err));
    }
    /* Read in growing chunks rather than trusting the size: works for pipes and /proc files too. */
    size_t cap = 1 << 16, n = 0;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size + 1 > cap)
        cap = (size_t)st.st_size + 1;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return snug_fail(e, SNUG_ENOMEM, "out of memory reading %s (%zu bytes)", path, cap);
        }
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1)
            break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger)
            free(buf);
        buf = bigger;
        cap *= 2;
    }
    int bad = ferror(f), err = errno;
    fclose(f);
    if (bad) {
        free(buf);
        return snug_fail(e, SNUG_EIO, "cannot read %s: %s", path, strerror(err));
    }
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return 0;
}

int snug_copy_file(const char *src, const char *dst, snug_error *e) {
    FILE *in = fopen(src, "rb");
    if (!in) {
        int err = errno;
        return snug_fail(e, SNUG_EIO, "cannot open %s: %s; check the path", src, strerror(err));
    }
    snug_atomic_file af;
    int rc = snug_atomic_open(&af, dst, NULL, e);
    char buf[1 << 16];
    while (rc == 0) {
        size_t n = fread(buf, 1, sizeof buf, in);
        if (n == 0) {
            if (ferror(in)) {
                rc = snug_fail(e, SNUG_EIO, "cannot read %s: %s", src, strerror(errno));
                snug_atomic_abort(&af);
            }
            break;
        }
        rc = snug_atomic_write(&af, buf, n, e);
    }
    fclose(in);
    return rc ? rc : snug_atomic_commit(&af, e);
}

int snug_mkdirs(const char *path, snug_error *e) {
    char p[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof p)
        return snug_fail(e, SNUG_EINPUT, "cannot create folder \"%.200s\": the path is empty or too long", path);
    memcpy(p, path, n + 1);
    /* Create every prefix that ends before a '/', then the whole path. */
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            int err = errno;
            return snug_fail(e, SNUG_EIO, "cannot create folder %s (for %s): %s; check permissions", p, path,
                             strerror(err));
        }
        p[i] = c;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return snug_fail(e, SNUG_EIO, "cannot create folder %s: a file of that name is in the way; remove it or "
                         "choose another path", path);
    return 0;
}

int snug_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int snug_is_plain_name(const char *name) {
    return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* fileio.h: atomic file writes and whole-file reads with errors that name the file. */
#ifndef SNUG_FILEIO_H
#define SNUG_FILEIO_H

#include <stdio.h>
#include <stddef.h>

#include "core/error.h"
#include "core/hash.h"

/* Writing a file atomically: data goes to "<path>.tmp.<pid>", is fsync'ed, then renamed over path. A failed or
 * abandoned write leaves path untouched and removes the temporary file. */
typedef struct snug_write_opts {
    int direct;         /* O_DIRECT where the file system takes it: whole 4096-byte blocks go to the disk without a
                         * copy into the page cache (from the caller's memory when it is 4096-aligned): for large files
                         * that this process does not read again */
    snug_hasher *hash;  /* when set, every byte written is hashed into it: the file's hash without reading it back */
} snug_write_opts;

typedef struct snug_atomic_file {
    int fd;
    int direct;          /* O_DIRECT is on */
    snug_hasher *hash;
    unsigned char *buf;  /* (cap) bytes not yet written, 4096-aligned; NULL when the file is not open */
    size_t cap, len;
    char path[4096];
    char tmp[4200];
} snug_atomic_file;

/* opts NULL: buffered, no hash. */
int snug_atomic_open(snug_atomic_file *af, const char *path, const snug_write_opts *opts, snug_error *e);
int snug_atomic_write(snug_atomic_file *af, const void *data, size_t n, snug_error *e);
int snug_atomic_commit(snug_atomic_file *af, snug_error *e); /* fsync + rename (+ fsync of the directory) */
void snug_atomic_abort(snug_atomic_file *af);

/* Writes a whole buffer atomically. */
int snug_write_file_atomic(const char *path, const void *data, size_t n, snug_error *e);

/* Reads a whole file into a malloc'd, NUL-terminated buffer. */
int snug_read_file(const char *path, char **out, size_t *len, snug_error *e);

/* Copies src to dst atomically. */
int snug_copy_file(const char *src, const char *dst, snug_error *e);

/* mkdir -p */
int snug_mkdirs(const char *path, snug_error *e);

int snug_file_exists(const char *path);

/* Whether name, read from a listing (a shard index, a checkpoint's files), names a file inside the listing's folder:
 * not empty, no '/', not "." or "..", so joining it to the folder never leads out of it. */
int snug_is_plain_name(const char *name);

#endif

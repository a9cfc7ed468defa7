/* test_fileio.c: atomic writes (commit, abort, failure leaves the old file; direct and hashed writes of awkward
 * sizes and alignments), whole-file reads, copies, mkdir -p. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/fileio.h"
#include "core/hash.h"

static char tmpdir[256];

static const char *tpath(const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    if (d)
        closedir(d);
    return n;
}

static int has_content(const char *path, const char *want) {
    char *s = NULL;
    size_t n = 0;
    snug_error e = {0};
    int ok = snug_read_file(path, &s, &n, &e) == 0 && n == strlen(want) && memcmp(s, want, n) == 0 && s[n] == '\0';
    free(s);
    return ok;
}

static void test_atomic(void) {
    snug_error e = {0};
    char p[512];
    snprintf(p, sizeof p, "%s", tpath("a.txt"));
    CHECK(snug_write_file_atomic(p, "first", 5, &e) == 0 && has_content(p, "first"));
    CHECK(snug_write_file_atomic(p, "second!", 7, &e) == 0 && has_content(p, "second!"));
    CHECK(count_entries(tmpdir) == 1); /* no temporary file left */

    /* An abandoned write leaves the old file and removes the temporary one. */
    snug_atomic_file af;
    CHECK(snug_atomic_open(&af, p, NULL, &e) == 0);
    CHECK(snug_atomic_write(&af, "partial", 7, &e) == 0);
    CHECK(count_entries(tmpdir) == 2);
    snug_atomic_abort(&af);
    snug_atomic_abort(&af); /* twice is harmless */
    CHECK(has_content(p, "second!") && count_entries(tmpdir) == 1);

    /* Several writes then commit. */
    CHECK(snug_atomic_open(&af, p, NULL, &e) == 0);
    CHECK(snug_atomic_write(&af, "ab", 2, &e) == 0 && snug_atomic_write(&af, "", 0, &e) == 0);
    CHECK(snug_atomic_write(&af, "cd", 2, &e) == 0 && snug_atomic_commit(&af, &e) == 0);
    CHECK(has_content(p, "abcd") && count_entries(tmpdir) == 1);
    snug_atomic_abort(&af); /* after commit: nothing to do, the file stays */
    CHECK(has_content(p, "abcd"));

    /* Writing into a folder that does not exist fails with the path named. */
    e = (snug_error){0};
    CHECK(snug_write_file_atomic(tpath("no/such/dir/x"), "x", 1, &e) == SNUG_EIO);
    CHECK(strstr(e.msg, "no/such/dir/x") != NULL);

    /* Empty files read back as "" */
    CHECK(snug_write_file_atomic(tpath("empty"), "", 0, &e) == 0 && has_content(tpath("empty"), ""));
    unlink(tpath("empty"));
    unlink(p);
}

/* Direct (O_DIRECT where the file system takes it) and hashed writes: pieces aligned and not, larger than the
 * staging buffer, smaller than a block, an odd tail; the file holds exactly the bytes and the hash is theirs. */
static void write_pieces(const char *dir, int direct) {
    snug_error e = {0};
    size_t total = ((size_t)20 << 20) + 12345;
    unsigned char *data = aligned_alloc(4096, ((size_t)21 << 20));
    for (size_t i = 0; i < total; i++)
        data[i] = (unsigned char)(i * 2654435761u >> 13);
    const size_t cuts[] = {0, 8, 100, 4096, 4096 + 4096, 3 * 4096 + 17, (size_t)9 << 20, ((size_t)19 << 20) + 1, total};
    char p[512];
    snprintf(p, sizeof p, "%s/direct.bin", dir);
    snug_hasher h;
    snug_hash_init(&h, 7);
    snug_write_opts o = {.direct = direct, .hash = &h};
    snug_atomic_file af;
    CHECK(snug_atomic_open(&af, p, &o, &e) == 0);
    for (size_t i = 0; i + 1 < sizeof cuts / sizeof cuts[0]; i++)
        CHECK(snug_atomic_write(&af, data + cuts[i], cuts[i + 1] - cuts[i], &e) == 0);
    CHECK(snug_atomic_commit(&af, &e) == 0);
    char *s = NULL;
    size_t n = 0;
    CHECKF(snug_read_file(p, &s, &n, &e) == 0 && n == total && memcmp(s, data, total) == 0,
           "%s: direct %d: %zu bytes read back, %zu written", dir, direct, n, total);
    CHECK(snug_hash_final(&h) == snug_hash64(data, total, 7) && h.total == total);
    free(s);
    /* an abandoned direct write leaves nothing */
    CHECK(snug_atomic_open(&af, p, &o, &e) == 0 && snug_atomic_write(&af, data, (size_t)9 << 20, &e) == 0);
    snug_atomic_abort(&af);
    CHECK(snug_read_file(p, &s, &n, &e) == 0 && n == total);
    free(s);
    unlink(p);
    free(data);
}

static void test_direct(void) {
    write_pieces(tmpdir, 0);
    write_pieces(tmpdir, 1);
    CHECK(count_entries(tmpdir) == 0);
    char shm[] = "/dev/shm/snug_test_fileio_XXXXXX"; /* tmpfs: may refuse O_DIRECT, then buffered */
    if (mkdtemp(shm)) {
        write_pieces(shm, 1);
        rmdir(shm);
    }
}

static void test_read_copy(void) {
    snug_error e = {0};
    char *s = (char *)1;
    size_t n = 7;
    CHECK(snug_read_file(tpath("missing.json"), &s, &n, &e) == SNUG_EIO && s == NULL);
    CHECK(strstr(e.msg, "missing.json") != NULL);

    /* A file larger than the first read chunk. */
    size_t big = 200000;
    char *data = malloc(big);
    for (size_t i = 0; i < big; i++)
        data[i] = (char)('a' + i % 26);
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s", tpath("big.bin"));
    snprintf(dst, sizeof dst, "%s", tpath("copy.bin"));
    CHECK(snug_write_file_atomic(src, data, big, &e) == 0);
    CHECK(snug_copy_file(src, dst, &e) == 0);
    CHECK(snug_read_file(dst, &s, &n, &e) == 0 && n == big && memcmp(s, data, big) == 0 && s[big] == '\0');
    free(s);
    e = (snug_error){0};
    CHECK(snug_copy_file(tpath("nothing"), dst, &e) == SNUG_EIO && strstr(e.msg, "nothing"));
    CHECK(snug_file_exists(dst) && !snug_file_exists(tpath("nothing")));
    unlink(src);
    unlink(dst);
    free(data);
}

static void test_mkdirs(void) {
    snug_error e = {0};
    char deep[512];
    snprintf(deep, sizeof deep, "%s/x/y/z/", tmpdir);
    CHECK(snug_mkdirs(deep, &e) == 0);
    CHECK(snug_mkdirs(deep, &e) == 0); /* already there */
    struct stat st;
    CHECK(stat(tpath("x/y/z"), &st) == 0 && S_ISDIR(st.st_mode));
    /* A file in the way */
    CHECK(snug_write_file_atomic(tpath("x/file"), "f", 1, &e) == 0);
    e = (snug_error){0};
    CHECK(snug_mkdirs(tpath("x/file/sub"), &e) == SNUG_EIO && strstr(e.msg, "x/file"));
    e = (snug_error){0};
    CHECK(snug_mkdirs(tpath("x/file"), &e) == SNUG_EIO);
    unlink(tpath("x/file"));
    rmdir(tpath("x/y/z"));
    rmdir(tpath("x/y"));
    rmdir(tpath("x"));
}

/* names from a listing: only those that stay inside the folder */
static void test_plain_name(void) {
    CHECK(snug_is_plain_name("model-00001-of-00002.safetensors") && snug_is_plain_name("..x") &&
          snug_is_plain_name(".hidden"));
    CHECK(!snug_is_plain_name("") && !snug_is_plain_name(".") && !snug_is_plain_name("..") &&
          !snug_is_plain_name("../x") && !snug_is_plain_name("/dev/zero") && !snug_is_plain_name("a/b"));
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/snug_test_fileio_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_atomic();
    test_direct();
    test_read_copy();
    test_mkdirs();
    test_plain_name();
    CHECKF(rmdir(tmpdir) == 0, "temporary folder %s not empty", tmpdir);
    return check_finish("test_fileio");
}

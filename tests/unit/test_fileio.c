/* test_fileio.c: atomic writes (commit, abort, failure leaves the old file), whole-file reads, copies, mkdir -p. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/fileio.h"

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
    CHECK(snug_atomic_open(&af, p, &e) == 0);
    CHECK(snug_atomic_write(&af, "partial", 7, &e) == 0);
    CHECK(count_entries(tmpdir) == 2);
    snug_atomic_abort(&af);
    snug_atomic_abort(&af); /* twice is harmless */
    CHECK(has_content(p, "second!") && count_entries(tmpdir) == 1);

    /* Several writes then commit. */
    CHECK(snug_atomic_open(&af, p, &e) == 0);
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

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/snug_test_fileio_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_atomic();
    test_read_copy();
    test_mkdirs();
    CHECKF(rmdir(tmpdir) == 0, "temporary folder %s not empty", tmpdir);
    return check_finish("test_fileio");
}

/* The C ABI end to end, as a C program sees it: create, fill, scan, crash (fork + SIGKILL in the
 * middle of writing) and reopen, for an integer and a bytes store; bad arguments give errors,
 * not crashes. Usage: test ENGINE DIR [OPTIONS] (DIR must not exist; it is created; OPTIONS as
 * numakv_create takes them). Exit 0 on success. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "numakv.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != NUMAKV_OK) {                                                          \
            fprintf(stderr, "%s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #call, rc_,     \
                    numakv_last_error());                                                \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define EXPECT(cond)                                                                     \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);          \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static const char *OPTS = "nodes=2,capacity=64M"; /* or argv[3] */

/* Fills an integer store in a child that reports each acknowledged key on `ack`, until killed. */
static void int_writer(const char *dir, int ack) {
    numakv_store *s = NULL;
    CHECK(numakv_open(dir, &s));
    for (uint64_t k = 1001;; k++) {
        CHECK(numakv_put(s, k, k * 7));
        if (write(ack, &k, sizeof k) != sizeof k) _exit(2);
    }
}

/* The same for a bytes store: key "k:<n>", value "v:<n>" repeated. */
static void bytes_writer(const char *dir, int ack) {
    numakv_store *s = NULL;
    CHECK(numakv_open(dir, &s));
    char key[32], val[128];
    for (uint64_t k = 1001;; k++) {
        int kl = snprintf(key, sizeof key, "k:%08llu", (unsigned long long)k);
        int vl = snprintf(val, sizeof val, "v:%llu:%llu:%llu", (unsigned long long)k,
                          (unsigned long long)k, (unsigned long long)k);
        CHECK(numakv_bput(s, (const uint8_t *)key, (size_t)kl, (const uint8_t *)val, (size_t)vl));
        if (write(ack, &k, sizeof k) != sizeof k) _exit(2);
    }
}

/* Runs `writer` in a child, kills it with SIGKILL after at least `acks` acknowledged keys, and
 * returns the last acknowledged key. */
static uint64_t crash_while_writing(const char *dir, void (*writer)(const char *, int), int acks) {
    int fds[2];
    EXPECT(pipe(fds) == 0);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        writer(dir, fds[1]);
        _exit(0);
    }
    close(fds[1]);
    uint64_t last = 0, k;
    for (int i = 0; i < acks; i++) {
        EXPECT(read(fds[0], &k, sizeof k) == sizeof k);
        last = k;
    }
    kill(pid, SIGKILL);
    /* Keys acknowledged before the kill landed are in the pipe: they count too. */
    while (read(fds[0], &k, sizeof k) == sizeof k) last = k;
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    close(fds[0]);
    return last;
}

static void int_store(const char *engine, const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create(dir, engine, OPTS, &s));
    bool done = false;
    for (uint64_t k = 1; k <= 1000; k++) {
        CHECK(numakv_insert(s, k, k * 7, &done));
        EXPECT(done);
    }
    CHECK(numakv_insert(s, 5, 0, &done));
    EXPECT(!done);
    CHECK(numakv_update(s, 5, 55, &done));
    EXPECT(done);
    CHECK(numakv_delete(s, 6, &done));
    EXPECT(done);
    uint64_t v = 0;
    CHECK(numakv_get(s, 5, &v, &done));
    EXPECT(done && v == 55);
    CHECK(numakv_get(s, 6, &v, &done));
    EXPECT(!done);

    /* Scan from 990: 990..1000 in order. */
    numakv_iter *it = NULL;
    CHECK(numakv_scan(s, 990, &it));
    uint64_t key, val, expect = 990;
    int rc;
    while ((rc = numakv_iter_next(it, &key, &val)) == NUMAKV_OK) {
        EXPECT(key == expect && val == key * 7);
        expect++;
    }
    EXPECT(rc == NUMAKV_END && expect == 1001);
    /* A store with an open iterator does not close. */
    EXPECT(numakv_close(s) == NUMAKV_ERR_BUSY);
    CHECK(numakv_iter_free(it));

    /* Bad arguments are errors, with a message. */
    EXPECT(numakv_put(s, 0, 1) == NUMAKV_ERR_INVALID);
    EXPECT(strlen(numakv_last_error()) > 0);
    EXPECT(numakv_put(NULL, 1, 1) == NUMAKV_ERR_INVALID);
    EXPECT(numakv_get(s, 1, NULL, &done) == NUMAKV_ERR_INVALID);
    EXPECT(numakv_bput(s, (const uint8_t *)"a", 1, NULL, 0) == NUMAKV_ERR_WRONG_KIND);
    CHECK(numakv_put(s, 1, 1));
    EXPECT(strlen(numakv_last_error()) == 0);

    uint64_t entries = 0;
    CHECK(numakv_check(s, &entries));
    EXPECT(entries == 999);
    char *json = NULL;
    size_t len = 0;
    CHECK(numakv_stats_json(s, &json, &len));
    EXPECT(strstr(json, "\"kind\":\"int\"") != NULL);
    EXPECT(strlen(json) == len);
    numakv_free(json);
    CHECK(numakv_close(s));

    uint64_t last = crash_while_writing(dir, int_writer, 2000);
    CHECK(numakv_open(dir, &s));
    for (uint64_t k = 1001; k <= last; k++) {
        CHECK(numakv_get(s, k, &v, &done));
        if (!done || v != k * 7) {
            fprintf(stderr, "%s: acknowledged key %llu lost after the crash\n", engine,
                    (unsigned long long)k);
            exit(1);
        }
    }
    /* The put in flight when the kill landed may have completed unacknowledged: one more. */
    CHECK(numakv_check(s, &entries));
    EXPECT(entries == 999 + (last - 1000) || entries == 1000 + (last - 1000));
    CHECK(numakv_close(s));
    printf("%s int: 1000 keys, scan, %llu acknowledged keys survived SIGKILL\n", engine,
           (unsigned long long)(last - 1000));
}

static void bytes_store(const char *engine, const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create_bytes(dir, engine, OPTS, &s));
    const char *keys[] = {"user:1", "user:2", "user:10", "zeta", "alpha"};
    for (int i = 0; i < 5; i++)
        CHECK(numakv_bput(s, (const uint8_t *)keys[i], strlen(keys[i]), (const uint8_t *)"hello", i));
    uint8_t bin[4] = {0, 255, 0, 1};
    CHECK(numakv_bput(s, bin, 4, bin, 4));
    bool done = false;
    uint8_t *val = NULL;
    size_t vlen = 0;
    CHECK(numakv_bget(s, (const uint8_t *)"user:10", 7, &val, &vlen, &done));
    EXPECT(done && vlen == 2 && memcmp(val, "he", 2) == 0);
    numakv_free(val);
    CHECK(numakv_bget(s, bin, 4, &val, &vlen, &done));
    EXPECT(done && vlen == 4 && memcmp(val, bin, 4) == 0);
    numakv_free(val);
    CHECK(numakv_bdelete(s, (const uint8_t *)"zeta", 4, &done));
    EXPECT(done);

    /* Prefix scan "user:" .. "user;": memcmp order. */
    numakv_iter *it = NULL;
    CHECK(numakv_bscan(s, (const uint8_t *)"user:", 5, (const uint8_t *)"user;", 5, &it));
    const char *want[] = {"user:1", "user:10", "user:2"};
    uint8_t *k = NULL, *v = NULL;
    size_t klen = 0;
    int n = 0, rc;
    while ((rc = numakv_biter_next(it, &k, &klen, &v, &vlen)) == NUMAKV_OK) {
        EXPECT(n < 3 && klen == strlen(want[n]) && memcmp(k, want[n], klen) == 0);
        numakv_free(k);
        numakv_free(v);
        n++;
    }
    EXPECT(rc == NUMAKV_END && n == 3);
    CHECK(numakv_iter_free(it));

    /* The empty key and a 2 MiB value are refused; the store stays usable. */
    EXPECT(numakv_bput(s, (const uint8_t *)"", 0, (const uint8_t *)"x", 1) == NUMAKV_ERR_INVALID);
    size_t big = 2u << 20;
    uint8_t *huge = calloc(big, 1);
    EXPECT(numakv_bput(s, (const uint8_t *)"big", 3, huge, big) == NUMAKV_ERR_TOO_LARGE);
    free(huge);
    EXPECT(numakv_put(s, 1, 1) == NUMAKV_ERR_WRONG_KIND);
    CHECK(numakv_bput(s, (const uint8_t *)"after", 5, (const uint8_t *)"ok", 2));
    CHECK(numakv_close(s));

    uint64_t last = crash_while_writing(dir, bytes_writer, 1000);
    CHECK(numakv_open(dir, &s));
    char key[32], expect[128];
    for (uint64_t i = 1001; i <= last; i++) {
        int kl = snprintf(key, sizeof key, "k:%08llu", (unsigned long long)i);
        int el = snprintf(expect, sizeof expect, "v:%llu:%llu:%llu", (unsigned long long)i,
                          (unsigned long long)i, (unsigned long long)i);
        CHECK(numakv_bget(s, (const uint8_t *)key, (size_t)kl, &val, &vlen, &done));
        if (!done || vlen != (size_t)el || memcmp(val, expect, vlen) != 0) {
            fprintf(stderr, "%s: acknowledged key %s lost or torn after the crash\n", engine, key);
            exit(1);
        }
        numakv_free(val);
    }
    uint64_t entries = 0;
    /* The put in flight when the kill landed may have completed unacknowledged: then it is
     * there whole (a put is atomic), never torn. */
    CHECK(numakv_check(s, &entries));
    EXPECT(entries == 6 + (last - 1000) || entries == 7 + (last - 1000));
    if (entries == 7 + (last - 1000)) {
        uint64_t i = last + 1;
        int kl = snprintf(key, sizeof key, "k:%08llu", (unsigned long long)i);
        int el = snprintf(expect, sizeof expect, "v:%llu:%llu:%llu", (unsigned long long)i,
                          (unsigned long long)i, (unsigned long long)i);
        CHECK(numakv_bget(s, (const uint8_t *)key, (size_t)kl, &val, &vlen, &done));
        EXPECT(done && vlen == (size_t)el && memcmp(val, expect, vlen) == 0);
        numakv_free(val);
    }
    CHECK(numakv_close(s));
    printf("%s bytes: scan in memcmp order, limits refused, %llu acknowledged keys survived "
           "SIGKILL\n",
           engine, (unsigned long long)(last - 1000));
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s ENGINE DIR [OPTIONS]\n", argv[0]);
        return 2;
    }
    if (argc == 4) OPTS = argv[3];
    char path[4096];
    snprintf(path, sizeof path, "%s/int", argv[2]);
    int_store(argv[1], path);
    snprintf(path, sizeof path, "%s/bytes", argv[2]);
    bytes_store(argv[1], path);
    /* Errors for what does not exist. */
    numakv_store *s = NULL;
    EXPECT(numakv_open(argv[2], &s) != NUMAKV_OK);
    EXPECT(numakv_create(path, "no-such-engine", NULL, &s) == NUMAKV_ERR_INVALID);
    return 0;
}

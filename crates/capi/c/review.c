/* An adversarial review of the header's promises, one scenario per argument
 * (usage: review SCENARIO DIR [ENGINE OPTIONS]; DIR must not exist). Exit 0 when the library
 * keeps the promise; a message and exit 1 (or a signal, or SIGALRM for a hang) when it does not.
 *   scan-null-iter   numakv_scan/_range/bscan/bscan_prefix with a NULL iterator output are
 *                    refused and leave nothing behind: the store still closes (not BUSY)
 *   reserved-keys    reserved integer keys (0, UINT64_MAX) and the empty byte key are
 *                    NUMAKV_ERR_INVALID for every call that takes a key
 *   limits           1 KiB keys and 1 MiB values round-trip; one byte more is TOO_LARGE
 *   long-scan        scans much longer than one internal batch see every pair once, in order
 *   batch-rollback   a batch too big for the store fails and writes nothing; the store goes on
 *   batch-invalid    a batch with a failed precondition writes nothing; bad arguments refused
 *   fork-all         every entry point on the parent's handles, in a fork() child: FORKED
 *   dtor-first-call  a thread's first numakv call made from a thread-exit destructor (a
 *                    pthread key destructor; a C++ thread_local destructor registered
 *                    before any numakv call): no crash, and the store still closes
 *   node-other-store a thread placed on node 1 of a 2-node store uses a 1-node store
 *   close-busy       close with an open iterator is BUSY, the handle and iterator stay usable
 *   huge-nodes       a node count far out of range at create is NUMAKV_ERR_INVALID, no abort
 *   batch-partial    batches of growing size into a nearly full store: each one that fails
 *                    leaves the store exactly as it was (it failed part-way, not up front)
 *   raw-fork         a child made by the fork system call without glibc's fork() wrapper (so
 *                    no pthread_atfork handler runs; e.g. syscall(SYS_fork), or clone(2)
 *                    without CLONE_VM): the handle is still another process's
 *   dtor-abandon     numakv_abandon / numakv_iter_free (the store's last reference) and
 *                    numakv_close from a pthread key destructor of a thread that used the
 *                    library: a status, no panic, no abort
 *   atexit-close     a store used by the main thread and closed from an atexit() handler (run
 *                    by exit() after the main thread's thread locals are destroyed): closed
 *   many-threads     1100 threads alive at once each make a call (the header sets no limit on
 *                    "many threads at once"): each call succeeds, or at least is refused
 *                    with a message that names the real cause
 *   abandon-iter     numakv_abandon with a scan iterator open: "as far as the store is
 *                    concerned, the process crashed (the next open recovers)"
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
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

#define EXPECT_RC(call, want)                                                            \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != (want)) {                                                             \
            fprintf(stderr, "%s:%d: %s -> %d (want %s = %d): %s\n", __FILE__, __LINE__,  \
                    #call, rc_, #want, (want), numakv_last_error());                     \
            failures++;                                                                  \
        }                                                                                \
    } while (0)

#define EXPECT(cond)                                                                     \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);          \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static int failures = 0;
static const char *ENGINE = "fastfair";
static const char *OPTS = "nodes=2,capacity=64M";

#define K(s) ((const uint8_t *)(s)), (sizeof(s) - 1)

static void finish(const char *what) {
    if (failures) {
        fprintf(stderr, "%s: %d promise(s) broken\n", what, failures);
        exit(1);
    }
    printf("%s: ok\n", what);
}

/* ---------------------------------------------------------------------------------------- */

static void scan_null_iter(const char *dir) {
    char d1[4096], d2[4096];
    snprintf(d1, sizeof d1, "%s-int", dir);
    snprintf(d2, sizeof d2, "%s-bytes", dir);
    numakv_store *s = NULL;
    CHECK(numakv_create(d1, ENGINE, OPTS, &s));
    CHECK(numakv_put(s, 1, 1));
    EXPECT_RC(numakv_scan(s, 1, NULL), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_scan_range(s, 1, 10, NULL), NUMAKV_ERR_INVALID);
    /* Refused before anything was made: nothing holds the store, so it closes. */
    int rc = numakv_close(s);
    if (rc != NUMAKV_OK) {
        fprintf(stderr, "int store: numakv_close after numakv_scan(.., NULL) -> %d: %s\n", rc,
                numakv_last_error());
        failures++;
    }
    numakv_store *b = NULL;
    CHECK(numakv_create_bytes(d2, ENGINE, OPTS, &b));
    CHECK(numakv_bput(b, K("a"), K("1")));
    EXPECT_RC(numakv_bscan(b, NULL, 0, NULL, 0, NULL), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_bscan_prefix(b, K("a"), NULL), NUMAKV_ERR_INVALID);
    rc = numakv_close(b);
    if (rc != NUMAKV_OK) {
        fprintf(stderr, "bytes store: numakv_close after numakv_bscan(.., NULL) -> %d: %s\n", rc,
                numakv_last_error());
        failures++;
    }
    finish("scan-null-iter");
}

/* ---------------------------------------------------------------------------------------- */

static void reserved_keys(const char *dir) {
    char d1[4096], d2[4096];
    snprintf(d1, sizeof d1, "%s-int", dir);
    snprintf(d2, sizeof d2, "%s-bytes", dir);
    numakv_store *s = NULL;
    CHECK(numakv_create(d1, ENGINE, OPTS, &s));
    uint64_t v = 7;
    bool f = true;
    const uint64_t reserved[2] = {0, UINT64_MAX};
    for (int i = 0; i < 2; i++) {
        uint64_t k = reserved[i];
        EXPECT_RC(numakv_put(s, k, 1), NUMAKV_ERR_INVALID);
        EXPECT_RC(numakv_insert(s, k, 1, &f), NUMAKV_ERR_INVALID);
        EXPECT_RC(numakv_update(s, k, 1, &f), NUMAKV_ERR_INVALID);
        EXPECT_RC(numakv_delete(s, k, &f), NUMAKV_ERR_INVALID);
        EXPECT_RC(numakv_get(s, k, &v, &f), NUMAKV_ERR_INVALID);
    }
    CHECK(numakv_close(s));
    numakv_store *b = NULL;
    CHECK(numakv_create_bytes(d2, ENGINE, OPTS, &b));
    uint8_t *val = NULL;
    size_t vlen = 0;
    const uint8_t one = 'x';
    EXPECT_RC(numakv_bput(b, &one, 0, &one, 1), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_binsert(b, &one, 0, &one, 1, &f), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_bupdate(b, &one, 0, &one, 1, &f), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_bdelete(b, &one, 0, &f), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_bget(b, &one, 0, &val, &vlen, &f), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_bput(b, NULL, 0, &one, 1), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_bget(b, NULL, 0, &val, &vlen, &f), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_bdelete(b, NULL, 0, &f), NUMAKV_ERR_INVALID);
    CHECK(numakv_close(b));
    finish("reserved-keys");
}

/* ---------------------------------------------------------------------------------------- */

static void limits(const char *dir) {
    numakv_store *b = NULL;
    CHECK(numakv_create_bytes(dir, ENGINE, OPTS, &b));
    size_t klen = 1024, vlen = (size_t)1 << 20;
    uint8_t *key = malloc(klen + 1), *val = malloc(vlen + 1);
    EXPECT(key && val);
    for (size_t i = 0; i < klen + 1; i++) key[i] = (uint8_t)('a' + i % 26);
    for (size_t i = 0; i < vlen + 1; i++) val[i] = (uint8_t)(i * 7 + 3);
    CHECK(numakv_bput(b, key, klen, val, vlen));
    uint8_t *got = NULL;
    size_t glen = 0;
    bool found = false;
    CHECK(numakv_bget(b, key, klen, &got, &glen, &found));
    if (!found || glen != vlen || memcmp(got, val, vlen) != 0) {
        fprintf(stderr, "1 KiB key -> 1 MiB value: found=%d len=%zu\n", found, glen);
        failures++;
    }
    numakv_free(got);
    /* A second max-size pair beside it, then a scan that returns both. */
    key[0] = 'Z';
    CHECK(numakv_bput(b, key, klen, val, vlen));
    numakv_iter *it = NULL;
    CHECK(numakv_bscan(b, NULL, 0, NULL, 0, &it));
    int n = 0;
    for (;;) {
        uint8_t *k = NULL, *v = NULL;
        size_t kl = 0, vl = 0;
        int rc = numakv_biter_next(it, &k, &kl, &v, &vl);
        if (rc == NUMAKV_END) break;
        CHECK(rc);
        if (kl != klen || vl != vlen || memcmp(v, val, vlen) != 0) {
            fprintf(stderr, "scan pair %d: key %zu B value %zu B\n", n, kl, vl);
            failures++;
        }
        numakv_free(k);
        numakv_free(v);
        n++;
    }
    CHECK(numakv_iter_free(it));
    if (n != 2) {
        fprintf(stderr, "scan of two max-size pairs gave %d\n", n);
        failures++;
    }
    EXPECT_RC(numakv_bput(b, key, klen + 1, val, 1), NUMAKV_ERR_TOO_LARGE);
    EXPECT_RC(numakv_bput(b, key, klen, val, vlen + 1), NUMAKV_ERR_TOO_LARGE);
    EXPECT_RC(numakv_binsert(b, (const uint8_t *)"new", 3, val, vlen + 1, NULL),
              NUMAKV_ERR_TOO_LARGE);
    EXPECT_RC(numakv_bupdate(b, key, klen, val, vlen + 1, NULL), NUMAKV_ERR_TOO_LARGE);
    EXPECT_RC(numakv_bget(b, key, klen + 1, &got, &glen, &found), NUMAKV_ERR_TOO_LARGE);
    EXPECT_RC(numakv_bdelete(b, key, klen + 1, &found), NUMAKV_ERR_TOO_LARGE);
    numakv_batch *batch = NULL;
    CHECK(numakv_batch_new(&batch));
    EXPECT_RC(numakv_batch_put(batch, key, klen + 1, val, 1), NUMAKV_ERR_TOO_LARGE);
    EXPECT_RC(numakv_batch_put(batch, key, klen, val, vlen + 1), NUMAKV_ERR_TOO_LARGE);
    EXPECT_RC(numakv_batch_delete(batch, key, klen + 1), NUMAKV_ERR_TOO_LARGE);
    CHECK(numakv_batch_put(batch, (const uint8_t *)"b1", 2, val, vlen));
    bool applied = false;
    CHECK(numakv_bwrite_batch(b, batch, &applied));
    EXPECT(applied);
    CHECK(numakv_bget(b, (const uint8_t *)"b1", 2, &got, &glen, &found));
    if (!found || glen != vlen || memcmp(got, val, vlen) != 0) {
        fprintf(stderr, "batch 1 MiB value: found=%d len=%zu\n", found, glen);
        failures++;
    }
    numakv_free(got);
    CHECK(numakv_batch_free(batch));
    uint64_t entries = 0;
    CHECK(numakv_check(b, &entries));
    if (entries != 3) {
        fprintf(stderr, "check counts %llu pairs, want 3\n", (unsigned long long)entries);
        failures++;
    }
    CHECK(numakv_close(b));
    free(key);
    free(val);
    finish("limits");
}

/* ---------------------------------------------------------------------------------------- */

static void long_scan(const char *dir) {
    char d1[4096], d2[4096];
    snprintf(d1, sizeof d1, "%s-int", dir);
    snprintf(d2, sizeof d2, "%s-bytes", dir);
    numakv_store *s = NULL;
    CHECK(numakv_create(d1, ENGINE, OPTS, &s));
    const uint64_t N = 1000;
    for (uint64_t k = 1; k <= N; k++) CHECK(numakv_put(s, k * 3, k));
    CHECK(numakv_put(s, UINT64_MAX - 1, 42));
    numakv_iter *it = NULL;
    CHECK(numakv_scan(s, 1, &it));
    uint64_t n = 0, prev = 0, k = 0, v = 0;
    int rc;
    while ((rc = numakv_iter_next(it, &k, &v)) == NUMAKV_OK) {
        if (k <= prev) {
            fprintf(stderr, "int scan: key %llu after %llu\n", (unsigned long long)k,
                    (unsigned long long)prev);
            failures++;
            break;
        }
        prev = k;
        n++;
    }
    if (rc != NUMAKV_END) {
        fprintf(stderr, "int scan ended with %d: %s\n", rc, numakv_last_error());
        failures++;
    }
    if (n != N + 1 || prev != UINT64_MAX - 1) {
        fprintf(stderr, "int scan saw %llu pairs (want %llu), last key %llu\n",
                (unsigned long long)n, (unsigned long long)N + 1, (unsigned long long)prev);
        failures++;
    }
    CHECK(numakv_iter_free(it));
    /* A range whose end falls right after the first internal batch, and one mid-way. */
    uint64_t ends[3] = {3 * 128 + 1, 3 * 129, 3 * 700 + 2};
    uint64_t want[3] = {128, 128, 700};
    for (int i = 0; i < 3; i++) {
        CHECK(numakv_scan_range(s, 1, ends[i], &it));
        n = 0;
        while ((rc = numakv_iter_next(it, &k, &v)) == NUMAKV_OK) n++;
        if (rc != NUMAKV_END || n != want[i]) {
            fprintf(stderr, "scan_range [1, %llu) saw %llu pairs (want %llu), rc %d\n",
                    (unsigned long long)ends[i], (unsigned long long)n,
                    (unsigned long long)want[i], rc);
            failures++;
        }
        CHECK(numakv_iter_free(it));
    }
    CHECK(numakv_close(s));

    /* Bytes: 300 keys of the maximum length (1 KiB), so a batch can end on a 1 KiB key. */
    numakv_store *b = NULL;
    CHECK(numakv_create_bytes(d2, ENGINE, OPTS, &b));
    const int M = 300;
    uint8_t key[1024];
    memset(key, 'k', sizeof key);
    for (int i = 0; i < M; i++) {
        key[0] = (uint8_t)('A' + i / 26 / 26 % 26);
        key[1] = (uint8_t)('A' + i / 26 % 26);
        key[2] = (uint8_t)('A' + i % 26);
        CHECK(numakv_bput(b, key, sizeof key, (const uint8_t *)&i, sizeof i));
    }
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) CHECK(numakv_bscan(b, NULL, 0, NULL, 0, &it));
        else CHECK(numakv_bscan_prefix(b, (const uint8_t *)"A", 1, &it));
        int count = 0, last = -1;
        for (;;) {
            uint8_t *kk = NULL, *vv = NULL;
            size_t kl = 0, vl = 0;
            rc = numakv_biter_next(it, &kk, &kl, &vv, &vl);
            if (rc != NUMAKV_OK) break;
            int idx = -1;
            if (vl == sizeof idx) memcpy(&idx, vv, sizeof idx);
            if (kl != sizeof key || idx != last + 1) {
                fprintf(stderr, "bytes scan (pass %d): pair %d is index %d, key %zu B\n", pass,
                        count, idx, kl);
                failures++;
                numakv_free(kk);
                numakv_free(vv);
                break;
            }
            last = idx;
            count++;
            numakv_free(kk);
            numakv_free(vv);
        }
        if (rc != NUMAKV_END && rc != NUMAKV_OK) {
            fprintf(stderr, "bytes scan (pass %d) failed after %d pairs: %d: %s\n", pass, count,
                    rc, numakv_last_error());
            failures++;
        } else if (count != M) {
            fprintf(stderr, "bytes scan (pass %d) saw %d pairs, want %d\n", pass, count, M);
            failures++;
        }
        CHECK(numakv_iter_free(it));
    }
    CHECK(numakv_close(b));
    finish("long-scan");
}

/* ---------------------------------------------------------------------------------------- */

static void batch_rollback(const char *dir) {
    numakv_store *b = NULL;
    CHECK(numakv_create_bytes(dir, ENGINE, strcmp(ENGINE, "nstore") == 0 ? "nodes=1,capacity=40M,clusters=4" : "nodes=1,capacity=16M", &b));
    CHECK(numakv_bput(b, K("keep"), K("old")));
    size_t vlen = (size_t)1 << 20;
    uint8_t *val = malloc(vlen);
    EXPECT(val);
    memset(val, 0x5a, vlen);
    numakv_batch *batch = NULL;
    CHECK(numakv_batch_new(&batch));
    CHECK(numakv_batch_put(batch, K("keep"), K("new")));
    char key[32];
    const int N = 40; /* 40 MiB of values into a 16 MiB store */
    for (int i = 0; i < N; i++) {
        int n = snprintf(key, sizeof key, "big%03d", i);
        CHECK(numakv_batch_put(batch, (const uint8_t *)key, (size_t)n, val, vlen));
    }
    bool applied = true;
    int rc = numakv_bwrite_batch(b, batch, &applied);
    printf("batch of %d MiB into a 16 MiB store -> %d (%s)\n", N, rc, numakv_last_error());
    if (rc == NUMAKV_OK) {
        fprintf(stderr, "the oversize batch was accepted\n");
        failures++;
    }
    /* Nothing of it is visible. */
    uint8_t *got = NULL;
    size_t glen = 0;
    bool found = false;
    CHECK(numakv_bget(b, K("keep"), &got, &glen, &found));
    if (!found || glen != 3 || memcmp(got, "old", 3) != 0) {
        fprintf(stderr, "keep = %.*s after the failed batch (want old)\n", (int)glen,
                found ? (const char *)got : "(absent)");
        failures++;
    }
    numakv_free(got);
    int seen = 0;
    for (int i = 0; i < N; i++) {
        int n = snprintf(key, sizeof key, "big%03d", i);
        CHECK(numakv_bget(b, (const uint8_t *)key, (size_t)n, &got, &glen, &found));
        seen += found;
        numakv_free(got);
    }
    if (seen) {
        fprintf(stderr, "%d of the failed batch's %d puts are visible\n", seen, N);
        failures++;
    }
    uint64_t entries = 0;
    rc = numakv_check(b, &entries);
    if (rc != NUMAKV_OK || entries != 1) {
        fprintf(stderr, "check after the failed batch -> %d, %llu pairs (want 1): %s\n", rc,
                (unsigned long long)entries, numakv_last_error());
        failures++;
    }
    /* The store goes on: a small batch and a put. */
    CHECK(numakv_batch_clear(batch));
    CHECK(numakv_batch_put(batch, K("after"), K("1")));
    rc = numakv_bwrite_batch(b, batch, &applied);
    if (rc != NUMAKV_OK || !applied) {
        fprintf(stderr, "a small batch after the failed one -> %d: %s\n", rc,
                numakv_last_error());
        failures++;
    }
    rc = numakv_bput(b, K("after2"), K("2"));
    if (rc != NUMAKV_OK) {
        fprintf(stderr, "a put after the failed batch -> %d: %s\n", rc, numakv_last_error());
        failures++;
    }
    CHECK(numakv_batch_free(batch));
    CHECK(numakv_close(b));
    CHECK(numakv_open(dir, &b));
    CHECK(numakv_check(b, &entries));
    CHECK(numakv_close(b));
    free(val);
    finish("batch-rollback");
}

/* ---------------------------------------------------------------------------------------- */

static void batch_invalid(const char *dir) {
    numakv_store *b = NULL;
    CHECK(numakv_create_bytes(dir, ENGINE, OPTS, &b));
    CHECK(numakv_bput(b, K("taken"), K("v")));
    numakv_batch *batch = NULL;
    CHECK(numakv_batch_new(&batch));
    const uint8_t one = 'x';
    EXPECT_RC(numakv_batch_put(batch, &one, 0, &one, 1), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_batch_put(batch, NULL, 3, &one, 1), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_batch_put(batch, &one, 1, NULL, 3), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_batch_delete(batch, &one, 0), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_batch_require_absent(batch, &one, 0), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_batch_put(NULL, &one, 1, &one, 1), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_batch_new(NULL), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_bwrite_batch(b, NULL, NULL), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_bwrite_batch(NULL, batch, NULL), NUMAKV_ERR_INVALID);
    /* A precondition fails: nothing of the batch is written, even the puts before it. */
    CHECK(numakv_batch_put(batch, K("p1"), K("1")));
    CHECK(numakv_batch_delete(batch, K("taken")));
    CHECK(numakv_batch_require_absent(batch, K("taken")));
    CHECK(numakv_batch_put(batch, K("p2"), K("2")));
    bool applied = true;
    CHECK(numakv_bwrite_batch(b, batch, &applied));
    if (applied) {
        fprintf(stderr, "a batch whose require_absent key is present was applied\n");
        failures++;
    }
    uint8_t *got = NULL;
    size_t glen = 0;
    bool found = false;
    CHECK(numakv_bget(b, K("p1"), &got, &glen, &found));
    numakv_free(got);
    if (found) {
        fprintf(stderr, "p1 was written by a batch whose precondition failed\n");
        failures++;
    }
    CHECK(numakv_bget(b, K("taken"), &got, &glen, &found));
    numakv_free(got);
    if (!found) {
        fprintf(stderr, "taken was deleted by a batch whose precondition failed\n");
        failures++;
    }
    /* The same batch on an integer store: WRONG_KIND, nothing written. */
    char d2[4096];
    snprintf(d2, sizeof d2, "%s-int", dir);
    numakv_store *s = NULL;
    CHECK(numakv_create(d2, ENGINE, OPTS, &s));
    EXPECT_RC(numakv_bwrite_batch(s, batch, &applied), NUMAKV_ERR_WRONG_KIND);
    uint64_t entries = 0;
    CHECK(numakv_check(s, &entries));
    EXPECT(entries == 0);
    CHECK(numakv_close(s));
    CHECK(numakv_batch_free(batch));
    CHECK(numakv_check(b, &entries));
    if (entries != 1) {
        fprintf(stderr, "bytes store holds %llu pairs, want 1\n", (unsigned long long)entries);
        failures++;
    }
    CHECK(numakv_close(b));
    finish("batch-invalid");
}

/* ---------------------------------------------------------------------------------------- */

/* Every entry point that takes a handle or an iterator, in a fork child: refused. */
static int child_calls(numakv_store *s, numakv_store *b, numakv_iter *it, numakv_iter *bit,
                       numakv_batch *batch) {
    bool f = false;
    uint64_t u = 0, k = 0;
    uint32_t node = 0;
    uint8_t *p = NULL, *q = NULL;
    size_t pl = 0, ql = 0;
    char *json = NULL;
    numakv_iter *nit = NULL;
    int bad = 0;
#define REFUSED(call)                                                                    \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != NUMAKV_ERR_FORKED) {                                                  \
            fprintf(stderr, "child: %s -> %d (%s): not refused with FORKED\n", #call,    \
                    rc_, numakv_last_error());                                           \
            bad = 1;                                                                     \
        }                                                                                \
    } while (0)
    REFUSED(numakv_put(s, 5000, 1));
    REFUSED(numakv_insert(s, 5001, 1, &f));
    REFUSED(numakv_update(s, 10, 1, &f));
    REFUSED(numakv_delete(s, 10, &f));
    REFUSED(numakv_get(s, 11, &u, &f));
    REFUSED(numakv_scan(s, 1, &nit));
    REFUSED(numakv_scan_range(s, 1, 5, &nit));
    REFUSED(numakv_iter_next(it, &k, &u));
    REFUSED(numakv_thread_set_node(s, 1, 0));
    REFUSED(numakv_thread_register(s, 0, &node));
    REFUSED(numakv_stats_json(s, &json, NULL));
    REFUSED(numakv_check(s, &u));
    REFUSED(numakv_bput(b, K("c"), K("child")));
    REFUSED(numakv_binsert(b, K("c"), K("child"), &f));
    REFUSED(numakv_bupdate(b, K("a"), K("child"), &f));
    REFUSED(numakv_bdelete(b, K("a"), &f));
    REFUSED(numakv_bget(b, K("a"), &p, &pl, &f));
    REFUSED(numakv_bscan(b, NULL, 0, NULL, 0, &nit));
    REFUSED(numakv_bscan_prefix(b, K("a"), &nit));
    REFUSED(numakv_biter_next(bit, &p, &pl, &q, &ql));
    REFUSED(numakv_bwrite_batch(b, batch, &f));
    REFUSED(numakv_iter_free(it));
    REFUSED(numakv_iter_free(bit));
    REFUSED(numakv_abandon(s));
    REFUSED(numakv_close(b));
    REFUSED(numakv_close(s));
#undef REFUSED
    return bad;
}

static void fork_all(const char *dir) {
    char d1[4096], d2[4096];
    snprintf(d1, sizeof d1, "%s-int", dir);
    snprintf(d2, sizeof d2, "%s-bytes", dir);
    numakv_store *s = NULL, *b = NULL;
    CHECK(numakv_create(d1, ENGINE, OPTS, &s));
    CHECK(numakv_create_bytes(d2, ENGINE, OPTS, &b));
    for (uint64_t k = 1; k <= 300; k++) CHECK(numakv_put(s, k, k));
    CHECK(numakv_bput(b, K("a"), K("parent")));
    numakv_iter *it = NULL, *bit = NULL;
    CHECK(numakv_scan(s, 1, &it));
    CHECK(numakv_bscan(b, NULL, 0, NULL, 0, &bit));
    numakv_batch *batch = NULL;
    CHECK(numakv_batch_new(&batch));
    CHECK(numakv_batch_put(batch, K("batch"), K("child")));
    fflush(NULL);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) _exit(child_calls(s, b, it, bit, batch));
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "fork child: status %#x\n", status);
        failures++;
    }
    /* The parent's stores are as they were. */
    uint64_t entries = 0;
    CHECK(numakv_check(s, &entries));
    if (entries != 300) {
        fprintf(stderr, "int store holds %llu pairs after the child, want 300\n",
                (unsigned long long)entries);
        failures++;
    }
    CHECK(numakv_check(b, &entries));
    if (entries != 1) {
        fprintf(stderr, "bytes store holds %llu pairs after the child, want 1\n",
                (unsigned long long)entries);
        failures++;
    }
    uint64_t k = 0, v = 0;
    CHECK(numakv_iter_next(it, &k, &v));
    EXPECT(k == 1);
    CHECK(numakv_iter_free(it));
    CHECK(numakv_iter_free(bit));
    CHECK(numakv_batch_free(batch));
    CHECK(numakv_close(s));
    CHECK(numakv_close(b));
    finish("fork-all");
}

/* ---------------------------------------------------------------------------------------- */

/* C++ `thread_local` objects register their destructors with this (the Itanium C++ ABI). */
extern int __cxa_thread_atexit_impl(void (*dtor)(void *), void *obj, void *dso_symbol);
extern void *__dso_handle;

static numakv_store *DSTORE;
static pthread_key_t DKEY;
static volatile int RC_KEY = 12345, RC_CXX = 12345, RC_CXX_GET = 12345;
static volatile int MSG_OK = 1;

static void key_dtor(void *arg) {
    (void)arg;
    RC_KEY = numakv_put(DSTORE, 100, 1);
    if (numakv_last_error() == NULL) MSG_OK = 0;
}

static void cxx_dtor(void *arg) {
    (void)arg;
    RC_CXX = numakv_put(DSTORE, 200, 2);
    if (numakv_last_error() == NULL) MSG_OK = 0;
    uint64_t v = 0;
    bool f = false;
    RC_CXX_GET = numakv_get(DSTORE, 200, &v, &f);
    if (numakv_last_error() == NULL) MSG_OK = 0;
}

/* The thread makes no numakv call of its own: its first is in the key destructor. */
static void *key_only_thread(void *arg) {
    (void)arg;
    EXPECT(pthread_setspecific(DKEY, (void *)1) == 0);
    return NULL;
}

/* A C++ thread_local constructed before the thread's first numakv call: its destructor runs
 * after the library's thread locals are destroyed (reverse order of construction). The thread
 * then works normally. */
static void *cxx_thread(void *arg) {
    (void)arg;
    static int obj;
    EXPECT(__cxa_thread_atexit_impl(cxx_dtor, &obj, &__dso_handle) == 0);
    CHECK(numakv_put(DSTORE, 300, 3));
    return NULL;
}

/* A C++ thread_local whose destructor is the thread's first numakv call. */
static void *cxx_only_thread(void *arg) {
    (void)arg;
    static int obj2;
    EXPECT(__cxa_thread_atexit_impl(cxx_dtor, &obj2, &__dso_handle) == 0);
    return NULL;
}

static void dtor_first_call(const char *dir) {
    CHECK(numakv_create(dir, ENGINE, OPTS, &DSTORE));
    EXPECT(pthread_key_create(&DKEY, key_dtor) == 0);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, key_only_thread, NULL) == 0);
    EXPECT(pthread_join(t, NULL) == 0);
    printf("pthread key destructor, first call: put -> %d\n", RC_KEY);
    EXPECT(pthread_create(&t, NULL, cxx_thread, NULL) == 0);
    EXPECT(pthread_join(t, NULL) == 0);
    printf("C++ thread_local destructor after the thread's calls: put -> %d, get -> %d\n", RC_CXX,
           RC_CXX_GET);
    RC_CXX = RC_CXX_GET = 12345;
    EXPECT(pthread_create(&t, NULL, cxx_only_thread, NULL) == 0);
    EXPECT(pthread_join(t, NULL) == 0);
    printf("C++ thread_local destructor, first call: put -> %d, get -> %d\n", RC_CXX, RC_CXX_GET);
    if (!MSG_OK) {
        fprintf(stderr, "numakv_last_error returned NULL in a destructor\n");
        failures++;
    }
    /* Many more such threads: no slot or thread-id leak stops them. */
    for (int i = 0; i < 200; i++) {
        EXPECT(pthread_create(&t, NULL, key_only_thread, NULL) == 0);
        EXPECT(pthread_join(t, NULL) == 0);
        if (RC_KEY != NUMAKV_OK && RC_KEY != NUMAKV_ERR_OTHER) {
            fprintf(stderr, "thread %d: key destructor put -> %d\n", i, RC_KEY);
            failures++;
            break;
        }
    }
    uint64_t entries = 0;
    CHECK(numakv_check(DSTORE, &entries));
    printf("store holds %llu pairs\n", (unsigned long long)entries);
    CHECK(numakv_close(DSTORE));
    CHECK(numakv_open(dir, &DSTORE));
    CHECK(numakv_check(DSTORE, &entries));
    CHECK(numakv_close(DSTORE));
    finish("dtor-first-call");
}

/* ---------------------------------------------------------------------------------------- */

static void node_other_store(const char *dir) {
    char d1[4096], d2[4096];
    snprintf(d1, sizeof d1, "%s-two", dir);
    snprintf(d2, sizeof d2, "%s-one", dir);
    numakv_store *two = NULL, *one = NULL, *b1 = NULL;
    EXPECT(strncmp(OPTS, "nodes=2", 7) == 0);
    char one_opts[256];
    snprintf(one_opts, sizeof one_opts, "nodes=1%s", OPTS + 7);
    CHECK(numakv_create(d1, ENGINE, OPTS, &two));
    CHECK(numakv_create(d2, ENGINE, one_opts, &one));
    char d3[4096];
    snprintf(d3, sizeof d3, "%s-one-bytes", dir);
    CHECK(numakv_create_bytes(d3, ENGINE, one_opts, &b1));
    EXPECT_RC(numakv_thread_set_node(one, 1, 0), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_thread_set_node(two, 2, 0), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_thread_set_node(two, UINT32_MAX, 0), NUMAKV_ERR_INVALID);
    EXPECT_RC(numakv_thread_set_node(two, 0, 0x80), NUMAKV_ERR_INVALID);
    CHECK(numakv_thread_set_node(two, 1, 0));
    /* This thread is on node 1 "for every store", also the 1-node one. */
    for (uint64_t k = 1; k <= 2000; k++) EXPECT_RC(numakv_put(one, k, k), NUMAKV_OK);
    for (uint64_t k = 1; k <= 2000; k += 2) EXPECT_RC(numakv_delete(one, k, NULL), NUMAKV_OK);
    uint64_t v = 0;
    bool f = false;
    EXPECT_RC(numakv_get(one, 2, &v, &f), NUMAKV_OK);
    for (int i = 0; i < 500; i++) {
        char key[16];
        int n = snprintf(key, sizeof key, "k%05d", i);
        EXPECT_RC(numakv_bput(b1, (const uint8_t *)key, (size_t)n, (const uint8_t *)key,
                              (size_t)n),
                  NUMAKV_OK);
    }
    uint64_t entries = 0;
    EXPECT_RC(numakv_check(one, &entries), NUMAKV_OK);
    if (entries != 1000) {
        fprintf(stderr, "1-node store holds %llu, want 1000\n", (unsigned long long)entries);
        failures++;
    }
    EXPECT_RC(numakv_check(b1, &entries), NUMAKV_OK);
    char *json = NULL;
    EXPECT_RC(numakv_stats_json(one, &json, NULL), NUMAKV_OK);
    numakv_free(json);
    CHECK(numakv_close(one));
    CHECK(numakv_close(b1));
    CHECK(numakv_close(two));
    CHECK(numakv_open(d2, &one));
    CHECK(numakv_check(one, &entries));
    CHECK(numakv_close(one));
    finish("node-other-store");
}

/* ---------------------------------------------------------------------------------------- */

static void close_busy(const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create(dir, ENGINE, OPTS, &s));
    for (uint64_t k = 1; k <= 400; k++) CHECK(numakv_put(s, k, k));
    numakv_iter *it = NULL;
    CHECK(numakv_scan(s, 1, &it));
    EXPECT_RC(numakv_close(s), NUMAKV_ERR_BUSY);
    uint64_t k = 0, v = 0, n = 0;
    int rc;
    while ((rc = numakv_iter_next(it, &k, &v)) == NUMAKV_OK) n++;
    if (rc != NUMAKV_END || n != 400) {
        fprintf(stderr, "iterating after a BUSY close: %llu pairs, rc %d\n",
                (unsigned long long)n, rc);
        failures++;
    }
    EXPECT_RC(numakv_close(s), NUMAKV_ERR_BUSY); /* exhausted but not freed */
    CHECK(numakv_put(s, 401, 401));
    CHECK(numakv_iter_free(it));
    CHECK(numakv_close(s));
    CHECK(numakv_open(dir, &s));
    uint64_t entries = 0;
    CHECK(numakv_check(s, &entries));
    EXPECT(entries == 401);
    CHECK(numakv_close(s));
    finish("close-busy");
}

/* ---------------------------------------------------------------------------------------- */

static void huge_nodes(const char *dir) {
    char d[4096];
    numakv_store *s = NULL;
    /* 2^50 nodes: any per-node table of it exceeds the address space, so nothing is really
     * allocated; the count must be refused before anything is sized by it. */
    const char *bad[] = {"nodes=0", "nodes=257", "nodes=1125899906842624",
                         "nodes=18446744073709551615"};
    for (int i = 0; i < 4; i++) {
        snprintf(d, sizeof d, "%s-%d", dir, i);
        printf("numakv_create(%s) ...\n", bad[i]);
        EXPECT_RC(numakv_create(d, ENGINE, bad[i], &s), NUMAKV_ERR_INVALID);
        snprintf(d, sizeof d, "%s-b%d", dir, i);
        EXPECT_RC(numakv_create_bytes(d, ENGINE, bad[i], &s), NUMAKV_ERR_INVALID);
    }
    finish("huge-nodes");
}

/* ---------------------------------------------------------------------------------------- */

/* The store's pairs as (count, checksum of keys and values), by a full scan. */
static void digest(numakv_store *b, uint64_t *count, uint64_t *sum) {
    numakv_iter *it = NULL;
    CHECK(numakv_bscan(b, NULL, 0, NULL, 0, &it));
    *count = 0;
    *sum = 1469598103934665603ULL;
    for (;;) {
        uint8_t *k = NULL, *v = NULL;
        size_t kl = 0, vl = 0;
        int rc = numakv_biter_next(it, &k, &kl, &v, &vl);
        if (rc == NUMAKV_END) break;
        CHECK(rc);
        for (size_t i = 0; i < kl; i++) *sum = (*sum ^ k[i]) * 1099511628211ULL;
        *sum = (*sum ^ vl) * 1099511628211ULL;
        for (size_t i = 0; i < vl; i += 4096) *sum = (*sum ^ v[i]) * 1099511628211ULL;
        numakv_free(k);
        numakv_free(v);
        (*count)++;
    }
    CHECK(numakv_iter_free(it));
}

static void batch_partial(const char *dir) {
    numakv_store *b = NULL;
    CHECK(numakv_create_bytes(dir, ENGINE, strcmp(ENGINE, "nstore") == 0 ? "nodes=1,capacity=40M,clusters=4" : "nodes=1,capacity=32M", &b));
    const size_t VLEN = 256 << 10;
    uint8_t *val = malloc(VLEN);
    EXPECT(val);
    memset(val, 0x11, VLEN);
    char key[32];
    /* Fill until the store is full, then free a few MiB. */
    int filled = 0;
    for (; filled < 1000; filled++) {
        int n = snprintf(key, sizeof key, "fill%04d", filled);
        int rc = numakv_bput(b, (const uint8_t *)key, (size_t)n, val, VLEN);
        if (rc == NUMAKV_ERR_NO_SPACE) break;
        CHECK(rc);
    }
    printf("filled %d x 256 KiB before NO_SPACE\n", filled);
    for (int i = 4; i < filled && i < 28; i++) {
        int n = snprintf(key, sizeof key, "fill%04d", i);
        CHECK(numakv_bdelete(b, (const uint8_t *)key, (size_t)n, NULL));
    }
    uint64_t count0 = 0, sum0 = 0;
    digest(b, &count0, &sum0);
    numakv_batch *batch = NULL;
    CHECK(numakv_batch_new(&batch));
    memset(val, 0x22, VLEN);
    int failed_at = -1;
    for (int size = 1; size <= 60 && failed_at < 0; size++) {
        CHECK(numakv_batch_clear(batch));
        /* Overwrites of existing pairs and deletes too, so a partial write would show. */
        CHECK(numakv_batch_put(batch, K("fill0001"), K("changed")));
        CHECK(numakv_batch_delete(batch, K("fill0003")));
        for (int i = 0; i < size; i++) {
            int n = snprintf(key, sizeof key, "new%04d", i);
            CHECK(numakv_batch_put(batch, (const uint8_t *)key, (size_t)n, val, VLEN));
        }
        bool applied = false;
        int rc = numakv_bwrite_batch(b, batch, &applied);
        if (rc == NUMAKV_OK) {
            /* Applied: undo it with plain calls so the next size starts from the same store. */
            EXPECT(applied);
            for (int i = 0; i < size; i++) {
                int n = snprintf(key, sizeof key, "new%04d", i);
                CHECK(numakv_bdelete(b, (const uint8_t *)key, (size_t)n, NULL));
            }
            memset(val, 0x11, VLEN);
            CHECK(numakv_bput(b, K("fill0001"), val, VLEN));
            CHECK(numakv_bput(b, K("fill0003"), val, VLEN));
            memset(val, 0x22, VLEN);
            uint64_t c = 0, s = 0;
            digest(b, &c, &s);
            EXPECT(c == count0 && s == sum0);
            continue;
        }
        failed_at = size;
        printf("a batch of %d x 256 KiB -> %d (%s)\n", size, rc, numakv_last_error());
        uint64_t c = 0, s = 0;
        digest(b, &c, &s);
        if (c != count0 || s != sum0) {
            fprintf(stderr, "the failed batch of %d changed the store: %llu pairs (was %llu), "
                    "checksum %s\n", size, (unsigned long long)c, (unsigned long long)count0,
                    s == sum0 ? "same" : "different");
            failures++;
        }
        uint64_t entries = 0;
        rc = numakv_check(b, &entries);
        if (rc != NUMAKV_OK) {
            fprintf(stderr, "check after the failed batch -> %d: %s\n", rc, numakv_last_error());
            failures++;
        }
        /* The store still takes writes that fit. */
        rc = numakv_bput(b, K("small"), K("1"));
        if (rc != NUMAKV_OK) {
            fprintf(stderr, "a small put after the failed batch -> %d: %s\n", rc,
                    numakv_last_error());
            failures++;
        }
    }
    EXPECT(failed_at > 0);
    CHECK(numakv_batch_free(batch));
    CHECK(numakv_close(b));
    CHECK(numakv_open(dir, &b));
    uint64_t entries = 0;
    CHECK(numakv_check(b, &entries));
    CHECK(numakv_close(b));
    free(val);
    finish("batch-partial");
}

/* ---------------------------------------------------------------------------------------- */

static void abandon_iter(const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create(dir, ENGINE, OPTS, &s));
    for (uint64_t k = 1; k <= 300; k++) CHECK(numakv_put(s, k, k));
    numakv_iter *it = NULL;
    CHECK(numakv_scan(s, 1, &it));
    CHECK(numakv_abandon(s));
    /* "The next open recovers": the store is as after a crash of this handle. */
    numakv_store *s2 = NULL;
    int rc = numakv_open(dir, &s2);
    if (rc != NUMAKV_OK) {
        fprintf(stderr, "numakv_open after numakv_abandon (an iterator still open) -> %d: %s\n",
                rc, numakv_last_error());
        failures++;
    }
    uint64_t k = 0, v = 0, n = 0;
    while ((rc = numakv_iter_next(it, &k, &v)) == NUMAKV_OK) n++;
    printf("the abandoned store's iterator then gave %llu pairs, ended with %d\n",
           (unsigned long long)n, rc);
    CHECK(numakv_iter_free(it));
    if (s2) {
        uint64_t entries = 0;
        CHECK(numakv_check(s2, &entries));
        EXPECT(entries == 300);
        CHECK(numakv_close(s2));
    }
    finish("abandon-iter");
}

/* ---------------------------------------------------------------------------------------- */

static void raw_fork(const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create(dir, ENGINE, OPTS, &s));
    for (uint64_t k = 1; k <= 100; k++) CHECK(numakv_put(s, k, k));
    fflush(NULL);
    long pid = syscall(SYS_fork);
    EXPECT(pid >= 0);
    if (pid == 0) {
        alarm(60); /* alarms are not inherited */
        int rc = numakv_put(s, 5000, 1);
        _exit(rc == NUMAKV_ERR_FORKED ? 0 : 10 + (rc < 0 ? -rc : rc));
    }
    int status = 0;
    EXPECT(waitpid((pid_t)pid, &status, 0) == (pid_t)pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "raw fork child: numakv_put on the parent's handle was not refused "
                "(status %#x: exit %d = 10 + |rc|)\n", status,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        failures++;
    }
    uint64_t v = 0;
    bool found = false;
    CHECK(numakv_get(s, 5000, &v, &found));
    if (found) {
        fprintf(stderr, "the child's write of key 5000 is in the parent's store\n");
        failures++;
    }
    uint64_t entries = 0;
    CHECK(numakv_check(s, &entries));
    printf("parent's store: %llu pairs (it had 100)\n", (unsigned long long)entries);
    CHECK(numakv_close(s));
    finish("raw-fork");
}

/* ---------------------------------------------------------------------------------------- */

static numakv_store *ASTORE;
static numakv_iter *AITER;
static pthread_key_t AKEY;
static volatile int RC_ABANDON = 12345, RC_ITER_FREE = 12345, RC_CLOSE = 12345;
static volatile int AMODE = 0;

static void abandon_dtor(void *arg) {
    (void)arg;
    if (AMODE == 0) {
        RC_ABANDON = numakv_abandon(ASTORE);
    } else if (AMODE == 1) {
        RC_ITER_FREE = numakv_iter_free(AITER); /* the last reference: the store goes */
    } else {
        RC_CLOSE = numakv_close(ASTORE);
    }
}

static void *abandon_thread(void *arg) {
    (void)arg;
    CHECK(numakv_put(ASTORE, 9, 9)); /* the thread's numakv state exists */
    EXPECT(pthread_setspecific(AKEY, (void *)1) == 0);
    return NULL;
}

static void dtor_abandon(const char *dir) {
    EXPECT(pthread_key_create(&AKEY, abandon_dtor) == 0);
    pthread_t t;
    char d[4096];
    /* 0: abandon from the destructor. */
    snprintf(d, sizeof d, "%s-0", dir);
    CHECK(numakv_create(d, ENGINE, OPTS, &ASTORE));
    AMODE = 0;
    EXPECT(pthread_create(&t, NULL, abandon_thread, NULL) == 0);
    EXPECT(pthread_join(t, NULL) == 0);
    printf("abandon from a key destructor -> %d\n", RC_ABANDON);
    if (RC_ABANDON != NUMAKV_OK && RC_ABANDON != NUMAKV_ERR_OTHER) {
        fprintf(stderr, "abandon from a key destructor -> %d (want OK, or OTHER and the handle "
                "kept)\n", RC_ABANDON);
        failures++;
    }
    if (RC_ABANDON == NUMAKV_ERR_OTHER) CHECK(numakv_abandon(ASTORE));
    /* 1: abandon here with an iterator open, then the iterator freed from the destructor. */
    snprintf(d, sizeof d, "%s-1", dir);
    CHECK(numakv_create(d, ENGINE, OPTS, &ASTORE));
    CHECK(numakv_put(ASTORE, 1, 1));
    CHECK(numakv_scan(ASTORE, 1, &AITER));
    AMODE = 1;
    EXPECT(pthread_create(&t, NULL, abandon_thread, NULL) == 0);
    /* (the thread's put happens before the abandon: join order below) */
    EXPECT(pthread_join(t, NULL) == 0);
    printf("iter_free (last reference) from a key destructor -> %d\n", RC_ITER_FREE);
    if (RC_ITER_FREE != NUMAKV_OK && RC_ITER_FREE != NUMAKV_ERR_OTHER) {
        fprintf(stderr, "iter_free from a key destructor -> %d: want OK or OTHER\n",
                RC_ITER_FREE);
        failures++;
    }
    if (RC_ITER_FREE == NUMAKV_ERR_OTHER) CHECK(numakv_iter_free(AITER));
    CHECK(numakv_close(ASTORE));
    /* 2: close from the destructor: OTHER, handle kept (the header's rule). */
    snprintf(d, sizeof d, "%s-2", dir);
    CHECK(numakv_create(d, ENGINE, OPTS, &ASTORE));
    AMODE = 2;
    EXPECT(pthread_create(&t, NULL, abandon_thread, NULL) == 0);
    EXPECT(pthread_join(t, NULL) == 0);
    printf("close from a key destructor -> %d\n", RC_CLOSE);
    if (RC_CLOSE != NUMAKV_OK && RC_CLOSE != NUMAKV_ERR_OTHER) {
        fprintf(stderr, "close from a key destructor -> %d: want OK or OTHER\n", RC_CLOSE);
        failures++;
    }
    if (RC_CLOSE == NUMAKV_ERR_OTHER) CHECK(numakv_close(ASTORE));
    finish("dtor-abandon");
}

/* ---------------------------------------------------------------------------------------- */

static numakv_store *XSTORE;

static void close_at_exit(void) {
    int rc = numakv_close(XSTORE);
    if (rc != NUMAKV_OK) {
        fprintf(stderr, "numakv_close from an atexit handler -> %d: %s\n", rc,
                numakv_last_error());
        _exit(1);
    }
    printf("atexit-close: ok\n");
}

static void atexit_close(const char *dir) {
    CHECK(numakv_create(dir, ENGINE, OPTS, &XSTORE));
    CHECK(numakv_put(XSTORE, 1, 1));
    EXPECT(atexit(close_at_exit) == 0);
    exit(0); /* as returning from main does */
}

/* ---------------------------------------------------------------------------------------- */

#define MANY 1100
static numakv_store *MSTORE;
static pthread_barrier_t MBARRIER;
static int MRC[MANY];
static char MMSG[MANY][200];

static void *many_thread(void *arg) {
    size_t i = (size_t)arg;
    MRC[i] = numakv_put(MSTORE, (uint64_t)i + 1, (uint64_t)i);
    snprintf(MMSG[i], sizeof MMSG[i], "%s", numakv_last_error());
    pthread_barrier_wait(&MBARRIER); /* every thread alive until all have called */
    return NULL;
}

static void many_threads(const char *dir) {
    CHECK(numakv_create(dir, ENGINE, OPTS, &MSTORE));
    EXPECT(pthread_barrier_init(&MBARRIER, NULL, MANY + 1) == 0);
    pthread_attr_t attr;
    EXPECT(pthread_attr_init(&attr) == 0);
    EXPECT(pthread_attr_setstacksize(&attr, 256 << 10) == 0);
    static pthread_t th[MANY];
    for (size_t i = 0; i < MANY; i++)
        EXPECT(pthread_create(&th[i], &attr, many_thread, (void *)i) == 0);
    pthread_barrier_wait(&MBARRIER);
    for (size_t i = 0; i < MANY; i++) EXPECT(pthread_join(th[i], NULL) == 0);
    int ok = 0, first_bad = -1;
    for (int i = 0; i < MANY; i++) {
        if (MRC[i] == NUMAKV_OK) ok++;
        else if (first_bad < 0) first_bad = i;
    }
    printf("%d of %d concurrent threads' puts succeeded\n", ok, MANY);
    if (first_bad >= 0) {
        fprintf(stderr, "thread %d: numakv_put -> %d: %s\n", first_bad, MRC[first_bad],
                MMSG[first_bad]);
        failures++;
    }
    uint64_t entries = 0;
    CHECK(numakv_check(MSTORE, &entries));
    EXPECT(entries == (uint64_t)ok);
    CHECK(numakv_close(MSTORE));
    finish("many-threads");
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: %s SCENARIO DIR [ENGINE OPTIONS]\n", argv[0]);
        return 2;
    }
    alarm(240); /* a hang is a failure (SIGALRM) */
    const char *what = argv[1], *dir = argv[2];
    if (argc == 5) {
        ENGINE = argv[3];
        OPTS = argv[4];
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    if (strcmp(what, "scan-null-iter") == 0) scan_null_iter(dir);
    else if (strcmp(what, "reserved-keys") == 0) reserved_keys(dir);
    else if (strcmp(what, "limits") == 0) limits(dir);
    else if (strcmp(what, "long-scan") == 0) long_scan(dir);
    else if (strcmp(what, "batch-rollback") == 0) batch_rollback(dir);
    else if (strcmp(what, "batch-invalid") == 0) batch_invalid(dir);
    else if (strcmp(what, "fork-all") == 0) fork_all(dir);
    else if (strcmp(what, "dtor-first-call") == 0) dtor_first_call(dir);
    else if (strcmp(what, "node-other-store") == 0) node_other_store(dir);
    else if (strcmp(what, "close-busy") == 0) close_busy(dir);
    else if (strcmp(what, "huge-nodes") == 0) huge_nodes(dir);
    else if (strcmp(what, "batch-partial") == 0) batch_partial(dir);
    else if (strcmp(what, "abandon-iter") == 0) abandon_iter(dir);
    else if (strcmp(what, "raw-fork") == 0) raw_fork(dir);
    else if (strcmp(what, "atexit-close") == 0) atexit_close(dir);
    else if (strcmp(what, "many-threads") == 0) many_threads(dir);
    else if (strcmp(what, "dtor-abandon") == 0) dtor_abandon(dir);
    else {
        fprintf(stderr, "unknown scenario %s\n", what);
        return 2;
    }
    return 0;
}

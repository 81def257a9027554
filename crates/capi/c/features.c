/* What users of LMDB's and RocksDB's C APIs reach for, as a C program sees it: the version,
 * open-time options, range and prefix scans longer than one internal batch, NUMA placement
 * (validated nodes, pinning on request, the bench's rule for worker threads), one handle used
 * by many threads at once, and buffers freed without their length.
 * Usage: features ENGINE DIR [OPTIONS] (DIR must not exist). Exit 0 on success. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
            fprintf(stderr, "%s:%d: expected %s (last error: %s)\n", __FILE__, __LINE__,  \
                    #cond, numakv_last_error());                                         \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static const char *OPTS = "nodes=2,capacity=64M";

#define THREADS 4
#define PER_THREAD 1500

struct worker {
    numakv_store *store;
    int index;
    uint32_t node;
};

/* One of several threads writing disjoint keys through the same handle, then reading all keys
 * written so far by itself and scanning. Placed by the bench's interleave rule. */
static void *worker_main(void *arg) {
    struct worker *w = arg;
    CHECK(numakv_thread_register(w->store, NUMAKV_INTERLEAVE, &w->node));
    uint32_t seen = 99;
    CHECK(numakv_thread_node(&seen));
    EXPECT(seen == w->node);
    uint64_t base = 1000000 + (uint64_t)w->index * PER_THREAD;
    bool done = false;
    for (uint64_t k = base; k < base + PER_THREAD; k++) {
        CHECK(numakv_insert(w->store, k, k ^ 0x5555, &done));
        EXPECT(done);
    }
    uint64_t v = 0;
    for (uint64_t k = base; k < base + PER_THREAD; k++) {
        CHECK(numakv_get(w->store, k, &v, &done));
        EXPECT(done && v == (k ^ 0x5555));
    }
    numakv_iter *it = NULL;
    CHECK(numakv_scan_range(w->store, base, base + PER_THREAD, &it));
    uint64_t key, expect = base;
    int rc;
    while ((rc = numakv_iter_next(it, &key, &v)) == NUMAKV_OK) {
        EXPECT(key == expect);
        expect++;
    }
    EXPECT(rc == NUMAKV_END && expect == base + PER_THREAD);
    CHECK(numakv_iter_free(it));
    return NULL;
}

static void int_features(const char *engine, const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create(dir, engine, OPTS, &s));

    /* Placement: a node past the store's is refused; pinning to a node's CPUs works. */
    EXPECT(numakv_thread_set_node(s, 1000000, 0) == NUMAKV_ERR_INVALID);
    EXPECT(strstr(numakv_last_error(), "out of range") != NULL);
    EXPECT(numakv_thread_set_node(s, 2, 0) == NUMAKV_ERR_INVALID);
    EXPECT(numakv_thread_set_node(s, 1, 0x80) == NUMAKV_ERR_INVALID);
    EXPECT(numakv_thread_set_node(NULL, 0, 0) == NUMAKV_ERR_INVALID);
    CHECK(numakv_thread_set_node(s, 1, 0));
    uint32_t node = 9;
    CHECK(numakv_thread_node(&node));
    EXPECT(node == 1);
    CHECK(numakv_thread_set_node(s, 0, NUMAKV_PIN));
    cpu_set_t set;
    CPU_ZERO(&set);
    EXPECT(sched_getaffinity(0, sizeof set, &set) == 0);
    EXPECT(CPU_COUNT(&set) >= 1);
    /* Undo the pin for the rest of the run (the bench's threads are the ones to pin). */
    CPU_ZERO(&set);
    for (int c = 0; c < CPU_SETSIZE; c++) CPU_SET(c, &set);
    sched_setaffinity(0, sizeof set, &set);

    /* Several threads on one handle; both nodes get threads (interleave). */
    pthread_t threads[THREADS];
    struct worker workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (struct worker){.store = s, .index = i, .node = 99};
        EXPECT(pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0);
    }
    int per_node[2] = {0, 0};
    for (int i = 0; i < THREADS; i++) {
        EXPECT(pthread_join(threads[i], NULL) == 0);
        EXPECT(workers[i].node < 2);
        per_node[workers[i].node]++;
    }
    EXPECT(per_node[0] == THREADS / 2 && per_node[1] == THREADS / 2);
    uint64_t entries = 0;
    CHECK(numakv_check(s, &entries));
    EXPECT(entries == (uint64_t)THREADS * PER_THREAD);

    /* A scan longer than one internal batch, whole; a bounded one that stops at its end. */
    numakv_iter *it = NULL;
    CHECK(numakv_scan(s, 1, &it));
    uint64_t k, v, n = 0, prev = 0;
    int rc;
    while ((rc = numakv_iter_next(it, &k, &v)) == NUMAKV_OK) {
        EXPECT(k > prev && v == (k ^ 0x5555));
        prev = k;
        n++;
    }
    EXPECT(rc == NUMAKV_END && n == (uint64_t)THREADS * PER_THREAD);
    EXPECT(numakv_iter_next(it, &k, &v) == NUMAKV_END); /* stays at its end */
    CHECK(numakv_iter_free(it));
    CHECK(numakv_scan_range(s, 1000100, 1000400, &it));
    n = 0;
    while ((rc = numakv_iter_next(it, &k, &v)) == NUMAKV_OK) {
        EXPECT(k == 1000100 + n);
        n++;
    }
    EXPECT(rc == NUMAKV_END && n == 300);
    CHECK(numakv_iter_free(it));
    CHECK(numakv_scan_range(s, 5, 5, &it)); /* empty range */
    EXPECT(numakv_iter_next(it, &k, &v) == NUMAKV_END);
    CHECK(numakv_iter_free(it));

    /* Write batches are for bytes stores. */
    numakv_batch *b = NULL;
    CHECK(numakv_batch_new(&b));
    CHECK(numakv_batch_put(b, (const uint8_t *)"k", 1, (const uint8_t *)"v", 1));
    EXPECT(numakv_bwrite_batch(s, b, NULL) == NUMAKV_ERR_WRONG_KIND);
    CHECK(numakv_batch_free(b));

    /* Stats: a NUL-terminated string freed without its length. */
    char *json = NULL;
    size_t len = 0;
    CHECK(numakv_stats_json(s, &json, &len));
    EXPECT(strlen(json) == len && strstr(json, "\"nodes\":2") != NULL);
    numakv_free(json);
    CHECK(numakv_close(s));

    /* Open-time options: session options are taken, store-shaping ones refused. */
    EXPECT(numakv_open_with(dir, "nodes=4", &s) == NUMAKV_ERR_INVALID);
    EXPECT(strstr(numakv_last_error(), "fixed when the store is created") != NULL);
    EXPECT(numakv_open_with(dir, "latency=warp", &s) == NUMAKV_ERR_INVALID);
    EXPECT(numakv_open_with(dir, "no_such_option=1", &s) == NUMAKV_ERR_INVALID);
    const char *session = strcmp(engine, "fastfair") == 0 ? "accounting=on,latency=none,recovery=eager"
                                                          : "accounting=on,latency=none";
    CHECK(numakv_open_with(dir, session, &s));
    CHECK(numakv_check(s, &entries));
    EXPECT(entries == (uint64_t)THREADS * PER_THREAD);
    CHECK(numakv_close(s));
    printf("%s int: %d threads on one handle over both nodes, scans of %d pairs, placement "
           "checked, open options\n",
           engine, THREADS, THREADS * PER_THREAD);
}

static void bytes_features(const char *engine, const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create_bytes(dir, engine, OPTS, &s));
    char key[64];
    /* 300 keys under "user:", 10 under "user;", 5 under "\xff\xff" (a prefix with no end). */
    for (int i = 0; i < 300; i++) {
        int kl = snprintf(key, sizeof key, "user:%05d", i);
        CHECK(numakv_bput(s, (const uint8_t *)key, (size_t)kl, (const uint8_t *)key, (size_t)kl));
    }
    for (int i = 0; i < 10; i++) {
        int kl = snprintf(key, sizeof key, "user;%d", i);
        CHECK(numakv_bput(s, (const uint8_t *)key, (size_t)kl, NULL, 0));
    }
    for (int i = 0; i < 5; i++) {
        uint8_t k[3] = {0xff, 0xff, (uint8_t)i};
        CHECK(numakv_bput(s, k, 3, k, 3));
    }
    numakv_iter *it = NULL;
    CHECK(numakv_bscan_prefix(s, (const uint8_t *)"user:", 5, &it));
    uint8_t *k = NULL, *v = NULL;
    size_t klen = 0, vlen = 0;
    int n = 0, rc;
    while ((rc = numakv_biter_next(it, &k, &klen, &v, &vlen)) == NUMAKV_OK) {
        int el = snprintf(key, sizeof key, "user:%05d", n);
        EXPECT(klen == (size_t)el && memcmp(k, key, klen) == 0 && vlen == klen);
        numakv_free(k);
        numakv_free(v);
        n++;
    }
    EXPECT(rc == NUMAKV_END && n == 300);
    CHECK(numakv_iter_free(it));
    uint8_t ff[2] = {0xff, 0xff};
    CHECK(numakv_bscan_prefix(s, ff, 2, &it));
    n = 0;
    while ((rc = numakv_biter_next(it, &k, &klen, &v, &vlen)) == NUMAKV_OK) {
        EXPECT(klen == 3 && k[2] == n);
        numakv_free(k);
        numakv_free(v);
        n++;
    }
    EXPECT(rc == NUMAKV_END && n == 5);
    CHECK(numakv_iter_free(it));
    /* An empty value comes back as a real buffer. */
    CHECK(numakv_bscan_prefix(s, (const uint8_t *)"user;", 5, &it));
    CHECK(numakv_biter_next(it, &k, &klen, &v, &vlen));
    EXPECT(vlen == 0 && v != NULL);
    numakv_free(k);
    numakv_free(v);
    /* A NULL output does not consume the next pair. */
    EXPECT(numakv_biter_next(it, &k, &klen, NULL, &vlen) == NUMAKV_ERR_INVALID);
    CHECK(numakv_biter_next(it, &k, &klen, &v, &vlen));
    EXPECT(klen == 6 && memcmp(k, "user;1", 6) == 0);
    numakv_free(k);
    numakv_free(v);
    CHECK(numakv_iter_free(it));

    /* Write batches: all or nothing, preconditions, limits checked when added. */
    numakv_batch *b = NULL;
    CHECK(numakv_batch_new(&b));
    CHECK(numakv_batch_put(b, (const uint8_t *)"batch:a", 7, (const uint8_t *)"1", 1));
    CHECK(numakv_batch_put(b, (const uint8_t *)"batch:b", 7, (const uint8_t *)"2", 1));
    CHECK(numakv_batch_delete(b, (const uint8_t *)"user:00000", 10));
    bool applied = false, found = false;
    CHECK(numakv_bwrite_batch(s, b, &applied));
    EXPECT(applied);
    CHECK(numakv_bget(s, (const uint8_t *)"batch:b", 7, &v, &vlen, &found));
    EXPECT(found && vlen == 1 && v[0] == '2');
    numakv_free(v);
    CHECK(numakv_bget(s, (const uint8_t *)"user:00000", 10, &v, &vlen, &found));
    EXPECT(!found && v == NULL);
    CHECK(numakv_batch_clear(b));
    CHECK(numakv_batch_put(b, (const uint8_t *)"batch:c", 7, (const uint8_t *)"3", 1));
    CHECK(numakv_batch_require_absent(b, (const uint8_t *)"batch:a", 7));
    CHECK(numakv_bwrite_batch(s, b, &applied));
    EXPECT(!applied);
    CHECK(numakv_bget(s, (const uint8_t *)"batch:c", 7, &v, &vlen, &found));
    EXPECT(!found);
    EXPECT(numakv_batch_put(b, (const uint8_t *)"", 0, NULL, 0) == NUMAKV_ERR_INVALID);
    EXPECT(numakv_batch_put(b, (const uint8_t *)"k", 1, (const uint8_t *)"v", (size_t)2 << 20) ==
           NUMAKV_ERR_TOO_LARGE);
    CHECK(numakv_batch_free(b));
    CHECK(numakv_close(s));
    printf("%s bytes: prefix scans (300 pairs, an all-0xff prefix), empty values, write batches\n",
           engine);
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s ENGINE DIR [OPTIONS]\n", argv[0]);
        return 2;
    }
    if (argc == 4) OPTS = argv[3];
    const char *version = numakv_version();
    EXPECT(version != NULL && version[0] >= '0' && version[0] <= '9' && strchr(version, '.'));
    char path[4096];
    snprintf(path, sizeof path, "%s/int", argv[2]);
    int_features(argv[1], path);
    snprintf(path, sizeof path, "%s/bytes", argv[2]);
    bytes_features(argv[1], path);
    printf("numakv %s\n", version);
    return 0;
}

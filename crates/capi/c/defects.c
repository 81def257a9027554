/* The C ABI's boundary rules, one scenario per argument (usage: defects SCENARIO DIR; DIR must
 * not exist). Exit 0 when the library keeps the rule; a message and exit 1 (or a signal) when it
 * does not. Only calls whose signatures predate the rules are used, so the same program shows a
 * defect before its fix and passes after it.
 *   fork         a handle used after fork(): the child is refused, the parent's store intact
 *   thread-exit  calls from a pthread key destructor, after the thread's locals are gone
 *   iter-null    numakv_iter_next with a NULL output does not consume a pair
 *   bget         a miss clears the value and its length; an empty value is a real (freeable) buffer
 *   huge-len     an absurd length is refused before any slice is built
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
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

static const char *OPTS = "nodes=2,capacity=64M";

/* Every integer call on the parent's handle and iterator, in the child: all refused, with a
 * message that names the fork; the child's exit status says whether they were. */
static int child_after_fork(numakv_store *s, numakv_iter *it) {
    bool done = false;
    uint64_t v = 0, k = 0;
    int bad = 0;
#define REFUSED(call)                                                                    \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ >= 0 || strstr(numakv_last_error(), "fork") == NULL) {                   \
            fprintf(stderr, "child: %s -> %d (%s): not refused\n", #call, rc_,           \
                    numakv_last_error());                                                \
            bad = 1;                                                                     \
        }                                                                                \
    } while (0)
    REFUSED(numakv_put(s, 5000, 1));
    REFUSED(numakv_insert(s, 5001, 1, &done));
    REFUSED(numakv_delete(s, 10, &done));
    REFUSED(numakv_get(s, 11, &v, &done));
    REFUSED(numakv_iter_next(it, &k, &v));
    REFUSED(numakv_iter_free(it));
    REFUSED(numakv_close(s));
#undef REFUSED
    return bad;
}

static void fork_scenario(const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create(dir, "fastfair", OPTS, &s));
    for (uint64_t k = 1; k <= 500; k++) CHECK(numakv_put(s, k, k * 3));
    numakv_iter *it = NULL;
    CHECK(numakv_scan(s, 1, &it));
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) _exit(child_after_fork(s, it));
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "the child's calls on the parent's handle were not all refused\n");
        exit(1);
    }
    /* The parent goes on: its iterator, more writes, a check, a clean close, a reopen. */
    uint64_t k = 0, v = 0;
    CHECK(numakv_iter_next(it, &k, &v));
    EXPECT(k == 1 && v == 3);
    CHECK(numakv_iter_free(it));
    for (uint64_t k2 = 501; k2 <= 1000; k2++) CHECK(numakv_put(s, k2, k2 * 3));
    uint64_t entries = 0;
    CHECK(numakv_check(s, &entries));
    EXPECT(entries == 1000);
    CHECK(numakv_close(s));
    CHECK(numakv_open(dir, &s));
    CHECK(numakv_check(s, &entries));
    EXPECT(entries == 1000);
    bool found = false;
    for (uint64_t k2 = 1; k2 <= 1000; k2++) {
        CHECK(numakv_get(s, k2, &v, &found));
        EXPECT(found && v == k2 * 3);
    }
    CHECK(numakv_close(s));
    printf("fork: child refused, parent's store intact (1000 keys, check passes)\n");
}

static numakv_store *STORE;
static pthread_key_t KEY;
static volatile int DTOR_RC = 12345;
static volatile int DTOR_MSG = 0;

/* Runs at thread exit, after the thread's C++/Rust thread-locals were destroyed (glibc runs
 * those first). */
static void key_destructor(void *arg) {
    (void)arg;
    DTOR_RC = numakv_put(STORE, 77, 1);
    const char *msg = numakv_last_error();
    DTOR_MSG = msg != NULL;
}

static void *exiting_thread(void *arg) {
    (void)arg;
    CHECK(numakv_put(STORE, 76, 1)); /* the thread's numakv state exists */
    EXPECT(numakv_put(STORE, 0, 1) == NUMAKV_ERR_INVALID); /* and its message slot */
    EXPECT(pthread_setspecific(KEY, (void *)1) == 0);
    return NULL;
}

static void thread_exit_scenario(const char *dir) {
    CHECK(numakv_create(dir, "fastfair", OPTS, &STORE));
    EXPECT(pthread_key_create(&KEY, key_destructor) == 0);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, exiting_thread, NULL) == 0);
    EXPECT(pthread_join(t, NULL) == 0);
    /* The process is alive (no abort), the call got a status and the message was readable. */
    EXPECT(DTOR_RC != 12345 && DTOR_MSG);
    printf("thread-exit: a call from a key destructor returned %d (message: %s)\n", DTOR_RC,
           DTOR_RC == NUMAKV_OK ? "none" : "refused");
    uint64_t entries = 0;
    CHECK(numakv_check(STORE, &entries));
    EXPECT(entries == 1 || entries == 2);
    CHECK(numakv_close(STORE));
}

static void iter_null_scenario(const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create(dir, "fastfair", OPTS, &s));
    for (uint64_t k = 1; k <= 3; k++) CHECK(numakv_put(s, k, k));
    numakv_iter *it = NULL;
    CHECK(numakv_scan(s, 1, &it));
    uint64_t k = 0, v = 0;
    EXPECT(numakv_iter_next(it, &k, NULL) == NUMAKV_ERR_INVALID);
    EXPECT(numakv_iter_next(it, NULL, &v) == NUMAKV_ERR_INVALID);
    CHECK(numakv_iter_next(it, &k, &v));
    if (k != 1) {
        fprintf(stderr, "iter-null: the first pair is key %llu, not 1: the failed calls lost pairs\n",
                (unsigned long long)k);
        exit(1);
    }
    CHECK(numakv_iter_free(it));
    CHECK(numakv_close(s));
    printf("iter-null: a NULL output loses no pair\n");
}

static void bget_scenario(const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create_bytes(dir, "fastfair", OPTS, &s));
    CHECK(numakv_bput(s, (const uint8_t *)"empty", 5, NULL, 0));
    uint8_t sentinel = 0;
    uint8_t *val = &sentinel;
    size_t vlen = 99;
    bool found = true;
    CHECK(numakv_bget(s, (const uint8_t *)"missing", 7, &val, &vlen, &found));
    if (found || val != NULL || vlen != 0) {
        fprintf(stderr, "bget miss: found=%d value=%p len=%zu (want 0, NULL, 0)\n", found,
                (void *)val, vlen);
        exit(1);
    }
    CHECK(numakv_bget(s, (const uint8_t *)"empty", 5, &val, &vlen, &found));
    if (!found || vlen != 0 || (uintptr_t)val < 4096) {
        fprintf(stderr, "bget empty value: found=%d value=%p len=%zu (want a real buffer)\n",
                found, (void *)val, vlen);
        exit(1);
    }
    free(val); /* a malloc'ed buffer: free(3) must accept it */
    CHECK(numakv_close(s));
    printf("bget: a miss clears the outputs; an empty value is a malloc'ed buffer\n");
}

static void huge_len_scenario(const char *dir) {
    numakv_store *s = NULL;
    CHECK(numakv_create_bytes(dir, "fastfair", OPTS, &s));
    uint8_t small[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    EXPECT(numakv_bput(s, small, SIZE_MAX, small, 1) == NUMAKV_ERR_TOO_LARGE);
    EXPECT(numakv_bput(s, small, 1, small, SIZE_MAX / 2) == NUMAKV_ERR_TOO_LARGE);
    uint8_t *v = NULL;
    size_t vlen = 0;
    bool found = false;
    EXPECT(numakv_bget(s, small, (size_t)1 << 62, &v, &vlen, &found) == NUMAKV_ERR_TOO_LARGE);
    numakv_iter *it = NULL;
    EXPECT(numakv_bscan(s, small, SIZE_MAX, NULL, 0, &it) == NUMAKV_ERR_TOO_LARGE);
    CHECK(numakv_close(s));
    printf("huge-len: absurd lengths are TOO_LARGE\n");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SCENARIO DIR\n", argv[0]);
        return 2;
    }
    const char *what = argv[1], *dir = argv[2];
    if (strcmp(what, "fork") == 0) fork_scenario(dir);
    else if (strcmp(what, "thread-exit") == 0) thread_exit_scenario(dir);
    else if (strcmp(what, "iter-null") == 0) iter_null_scenario(dir);
    else if (strcmp(what, "bget") == 0) bget_scenario(dir);
    else if (strcmp(what, "huge-len") == 0) huge_len_scenario(dir);
    else {
        fprintf(stderr, "unknown scenario %s\n", what);
        return 2;
    }
    return 0;
}

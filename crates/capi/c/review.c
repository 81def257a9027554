/* An adversarial review of the header's promises, one scenario per argument
 * (usage: review SCENARIO DIR [ENGINE OPTIONS]; DIR must not exist). Exit 0 when the library
 * keeps the promise; a message and exit 1 (or a signal, or SIGALRM for a hang) when it does not.
 *   scan-null-iter   numakv_scan/_range/bscan/bscan_prefix with a NULL iterator output are
 *                    refused and leave nothing behind: the store still closes (not BUSY)
 *   huge-nodes       a node count far out of range at create is NUMAKV_ERR_INVALID, no abort
 *   raw-fork         a child made by the fork system call without glibc's fork() wrapper (so
 *                    no pthread_atfork handler runs; e.g. syscall(SYS_fork), or clone(2)
 *                    without CLONE_VM): the handle is still another process's
 *   dtor-abandon     numakv_abandon / numakv_iter_free (the store's last reference) and
 *                    numakv_close from a pthread key destructor of a thread that used the
 *                    library: a status, no panic, no abort
 *   atexit-close     a store used by the main thread and closed from an atexit() handler (run
 *                    by exit() after the main thread's thread locals are destroyed): closed
 *   many-threads     1100 threads alive at once each make a call: each call succeeds, or is
 *                    refused at the header's documented limit (1024 threads at once) with a
 *                    message that names that cause
 *   dtor-tid-leak    1100 threads one after another whose only numakv call is made from a
 *                    pthread key destructor (thread exit); then a plain thread's call: OK
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
    /* The header documents the limit (1024 threads holding a thread id at once): a call beyond
     * it is refused with NUMAKV_ERR_OTHER and a message naming that limit, not another cause. */
    int ok = 0, refused = 0, first_bad = -1;
    for (int i = 0; i < MANY; i++) {
        if (MRC[i] == NUMAKV_OK) ok++;
        else if (MRC[i] == NUMAKV_ERR_OTHER && strstr(MMSG[i], "at most 1024 threads") &&
                 !strstr(MMSG[i], "destructor")) {
            if (refused++ == 0) printf("refused: %s\n", MMSG[i]);
        } else if (first_bad < 0) first_bad = i;
    }
    printf("%d of %d concurrent threads' puts succeeded, %d refused at the documented limit\n",
           ok, MANY, refused);
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

/* ---------------------------------------------------------------------------------------- */

static numakv_store *LSTORE;
static pthread_key_t LKEY;
static volatile int LRC = 12345;
static char LMSG[300];

static void leak_dtor(void *arg) {
    (void)arg;
    LRC = numakv_put(LSTORE, 5, 5);
    snprintf(LMSG, sizeof LMSG, "%s", numakv_last_error());
}

static void *leak_thread(void *arg) {
    (void)arg;
    EXPECT(pthread_setspecific(LKEY, (void *)1) == 0);
    return NULL;
}

static void *plain_thread(void *arg) {
    (void)arg;
    LRC = numakv_put(LSTORE, 6, 6);
    snprintf(LMSG, sizeof LMSG, "%s", numakv_last_error());
    return NULL;
}

static void dtor_tid_leak(const char *dir) {
    CHECK(numakv_create(dir, ENGINE, OPTS, &LSTORE));
    EXPECT(pthread_key_create(&LKEY, leak_dtor) == 0);
    pthread_t t;
    int first_bad = -1, bad_rc = 0;
    char bad_msg[300] = "";
    for (int i = 0; i < 1100; i++) {
        EXPECT(pthread_create(&t, NULL, leak_thread, NULL) == 0);
        EXPECT(pthread_join(t, NULL) == 0);
        if (LRC != NUMAKV_OK && first_bad < 0) {
            first_bad = i;
            bad_rc = LRC;
            snprintf(bad_msg, sizeof bad_msg, "%s", LMSG);
        }
    }
    if (first_bad >= 0) {
        fprintf(stderr, "exiting thread %d: put from its key destructor -> %d: %s\n", first_bad,
                bad_rc, bad_msg);
        failures++;
    }
    EXPECT(pthread_create(&t, NULL, plain_thread, NULL) == 0);
    EXPECT(pthread_join(t, NULL) == 0);
    if (LRC != NUMAKV_OK) {
        fprintf(stderr, "afterwards, a plain thread's put -> %d: %s\n", LRC, LMSG);
        failures++;
    }
    CHECK(numakv_close(LSTORE));
    finish("dtor-tid-leak");
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
    else if (strcmp(what, "huge-nodes") == 0) huge_nodes(dir);
    else if (strcmp(what, "abandon-iter") == 0) abandon_iter(dir);
    else if (strcmp(what, "raw-fork") == 0) raw_fork(dir);
    else if (strcmp(what, "atexit-close") == 0) atexit_close(dir);
    else if (strcmp(what, "many-threads") == 0) many_threads(dir);
    else if (strcmp(what, "dtor-tid-leak") == 0) dtor_tid_leak(dir);
    else if (strcmp(what, "dtor-abandon") == 0) dtor_abandon(dir);
    else {
        fprintf(stderr, "unknown scenario %s\n", what);
        return 2;
    }
    return 0;
}

/* A first numakv program in C: a NUMA-aware NBTree over two (emulated) nodes, a few writes, a
 * scan, a clean close. Build: cc -I include example.c target/release/libnumakv.a -lpthread -ldl -lm
 * Run: ./a.out /dev/shm/example-store   (the directory must not exist yet) */
#include <stdio.h>

#include "numakv.h"

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/dev/shm/numakv-example";
    numakv_store *store;
    if (numakv_create(dir, "nbtree", "nodes=2,capacity=64M", &store) != NUMAKV_OK) {
        fprintf(stderr, "create %s: %s\n", dir, numakv_last_error());
        return 1;
    }
    for (uint64_t k = 1; k <= 100; k++) {
        if (numakv_put(store, k, k * k) != NUMAKV_OK) {
            fprintf(stderr, "put: %s\n", numakv_last_error());
            return 1;
        }
    }
    numakv_iter *it;
    uint64_t key, value;
    numakv_scan(store, 95, &it);
    while (numakv_iter_next(it, &key, &value) == NUMAKV_OK) printf("%llu -> %llu\n", (unsigned long long)key, (unsigned long long)value);
    numakv_iter_free(it);
    return numakv_close(store) == NUMAKV_OK ? 0 : 1;
}

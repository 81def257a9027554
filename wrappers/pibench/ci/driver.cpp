// A small stand-in for PiBench, for numakv's CI: loads the wrapper the way PiBench does
// (dlopen + create_tree), makes keys the way PiBench's documentation describes (hashed ids,
// written big-endian so byte order is key order), and checks find, insert, update, remove and
// the order of scans, from several threads.
// Usage: driver WRAPPER.so KEY_SIZE THREADS [POOL_PATH] (engine and options: NUMAKV_* env).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tree_api.hpp"

namespace {

std::atomic<int> failures{0};

#define EXPECT(cond)                                                                      \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            std::fprintf(stderr, "driver: %s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

// A bijection on 64-bit ids (an odd multiplier), as PiBench scrambles ids; id 0 is never used.
uint64_t hash_id(uint64_t id) { return id * 0x9E3779B97F4A7C15ull; }

// The key of `id`, `size` bytes: zeroes first when longer than 8, then the hashed id big-endian.
std::string key_of(uint64_t id, size_t size) {
    std::string k(size, '\0');
    uint64_t be = __builtin_bswap64(hash_id(id));
    std::memcpy(&k[size - 8], &be, 8);
    return k;
}

std::string value_of(uint64_t id, size_t size) {
    std::string v(size, '\0');
    uint64_t x = id * 7 + 1;
    std::memcpy(&v[0], &x, std::min<size_t>(8, size));
    return v;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        std::fprintf(stderr, "usage: %s WRAPPER.so KEY_SIZE THREADS [POOL_PATH]\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        std::fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    using create_fn = tree_api *(*)(const tree_options_t &);
    auto create = reinterpret_cast<create_fn>(dlsym(lib, "create_tree"));
    if (!create) {
        std::fprintf(stderr, "no create_tree in %s\n", argv[1]);
        return 1;
    }
    tree_options_t opt;
    opt.key_size = std::strtoul(argv[2], nullptr, 10);
    opt.value_size = 8;
    opt.pool_size = 64u << 20;
    opt.num_threads = std::strtoul(argv[3], nullptr, 10);
    if (argc == 5) opt.pool_path = argv[4];
    const size_t ks = opt.key_size, vs = opt.value_size, threads = opt.num_threads;
    const uint64_t per_thread = 2000;
    tree_api *tree = create(opt);

    // Load from every thread (disjoint ids), then read back, update, remove, from every thread.
    std::vector<std::thread> workers;
    for (size_t t = 0; t < threads; t++) {
        workers.emplace_back([&, t] {
            std::vector<char> out(vs);
            for (uint64_t id = 1 + t * per_thread; id <= (t + 1) * per_thread; id++) {
                std::string k = key_of(id, ks), v = value_of(id, vs);
                EXPECT(tree->insert(k.data(), ks, v.data(), vs));
            }
            for (uint64_t id = 1 + t * per_thread; id <= (t + 1) * per_thread; id++) {
                std::string k = key_of(id, ks), v = value_of(id, vs);
                EXPECT(!tree->insert(k.data(), ks, v.data(), vs));  // already there
                EXPECT(tree->find(k.data(), ks, out.data()) && std::memcmp(out.data(), v.data(), vs) == 0);
                if (id % 3 == 0) {
                    std::string v2 = value_of(id + 1000000, vs);
                    EXPECT(tree->update(k.data(), ks, v2.data(), vs));
                    EXPECT(tree->find(k.data(), ks, out.data()) && std::memcmp(out.data(), v2.data(), vs) == 0);
                }
                if (id % 5 == 0) {
                    EXPECT(tree->remove(k.data(), ks));
                    EXPECT(!tree->remove(k.data(), ks));
                    EXPECT(!tree->find(k.data(), ks, out.data()));
                    EXPECT(!tree->update(k.data(), ks, out.data(), vs));
                }
            }
        });
    }
    for (auto &w : workers) w.join();

    // Scans: from several start keys, records in ascending byte order, none below the start,
    // and exactly the live keys a sorted list of them predicts.
    std::vector<std::string> live;
    for (uint64_t id = 1; id <= threads * per_thread; id++)
        if (id % 5 != 0) live.push_back(key_of(id, ks));
    std::sort(live.begin(), live.end());
    size_t checked = 0;
    for (uint64_t probe = 1; probe <= 400; probe += 37) {
        std::string start = key_of(probe, ks);
        char *records = nullptr;
        int n = tree->scan(start.data(), ks, 50, records);
        auto first = std::lower_bound(live.begin(), live.end(), start);
        size_t want = std::min<size_t>(50, live.end() - first);
        EXPECT(n >= 0 && static_cast<size_t>(n) == want);
        for (int i = 0; i < n && static_cast<size_t>(i) < want; i++) {
            std::string got(records + i * (ks + vs), ks);
            if (got != *(first + i)) {
                std::fprintf(stderr, "driver: scan from probe %llu, record %d is out of order\n",
                             static_cast<unsigned long long>(probe), i);
                failures++;
                break;
            }
            checked++;
        }
    }
    delete tree;
    if (failures.load() > 0) {
        std::fprintf(stderr, "driver: %d failures\n", failures.load());
        return 1;
    }
    std::printf("driver: %zu-byte keys, %zu threads: %llu inserts, finds, updates, removes; %zu scanned records in order\n",
                ks, threads, static_cast<unsigned long long>(threads * per_thread), checked);
    return 0;
}

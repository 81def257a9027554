// PiBench's tree_api over numakv's C ABI (include/numakv.h).
//
// Which engine and options: the environment (NUMAKV_ENGINE, default fastfair; NUMAKV_OPTIONS,
// e.g. "nodes=2,mode=eadr"; NUMAKV_KIND=int|bytes; NUMAKV_PIN=1 pins each worker thread to a
// CPU of its node). Where: PiBench's --pool_path (a new directory is created; an existing store
// is opened only if it is of the engine and kind asked for; default a fresh directory under
// /dev/shm, removed at exit), --pool_size per NUMA node. 8-byte keys and values go to an
// integer store by default (the papers' setting), anything else to a bytes store.
//
// NUMA: each PiBench worker thread is placed on its first call by numakv_thread_register with
// the bench's interleave rule (thread i on node i % nodes), so nodes=2 exercises the engines'
// per-node paths. Integer keys: PiBench writes its (hashed) ids big-endian so that byte order is
// key order; the wrapper reads and writes them big-endian, so scans come back in the order
// PiBench expects. Errors (not misses) are counted and the first of each kind is printed with
// numakv's message; a summary and the store's statistics are printed when the tree is destroyed.
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "numakv.h"
#include "tree_api.hpp"

namespace {

std::string env_or(const char *name, const char *fallback) {
    const char *v = std::getenv(name);
    return v && *v ? v : fallback;
}

// Keys as PiBench lays them out: big-endian, so that memcmp order is integer order.
uint64_t load_key(const char *p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return __builtin_bswap64(v);
}

void store_key(uint64_t k, char *p) {
    uint64_t v = __builtin_bswap64(k);
    std::memcpy(p, &v, sizeof v);
}

// Values are opaque bytes: stored as they come.
uint64_t load_value(const char *p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

bool is_dir(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

// One value of a flat JSON object's string field, e.g. "engine" of stats_json.
std::string json_field(const std::string &json, const std::string &name) {
    std::string tag = "\"" + name + "\":\"";
    size_t at = json.find(tag);
    if (at == std::string::npos) return "";
    at += tag.size();
    size_t end = json.find('"', at);
    return end == std::string::npos ? "" : json.substr(at, end - at);
}

class numakv_tree final : public tree_api {
  public:
    explicit numakv_tree(const tree_options_t &opt) : key_size_(opt.key_size), value_size_(opt.value_size) {
        engine_ = env_or("NUMAKV_ENGINE", "fastfair");
        std::string options = env_or("NUMAKV_OPTIONS", "");
        std::string kind = env_or("NUMAKV_KIND", key_size_ == 8 && value_size_ == 8 ? "int" : "bytes");
        if (kind != "int" && kind != "bytes") fail("NUMAKV_KIND=" + kind + ": expected int or bytes");
        int_ = kind == "int";
        if (int_ && (key_size_ != 8 || value_size_ != 8)) {
            fail("an integer store takes 8-byte keys and values (-k 8 -v 8); use NUMAKV_KIND=bytes");
        }
        pin_ = env_or("NUMAKV_PIN", "0") == "1";
        if (opt.pool_size > 0) {
            options += (options.empty() ? "" : ",") + std::string("capacity=") + std::to_string(opt.pool_size);
        }
        if (opt.pool_path.empty()) {
            char tmpl[] = "/dev/shm/numakv-pibench-XXXXXX";
            if (!mkdtemp(tmpl)) fail(std::string("mkdtemp ") + tmpl + ": " + std::strerror(errno));
            scratch_ = tmpl;
            dir_ = scratch_ + "/store";
        } else {
            dir_ = opt.pool_path;
        }
        if (is_dir(dir_) && exists(dir_ + "/node0.pm")) {
            open_existing(kind);
        } else {
            int rc = int_ ? numakv_create(dir_.c_str(), engine_.c_str(), options.c_str(), &store_)
                          : numakv_create_bytes(dir_.c_str(), engine_.c_str(), options.c_str(), &store_);
            if (rc != NUMAKV_OK) {
                fail("creating a " + engine_ + " " + kind + " store in " + dir_ + " (options: " +
                     (options.empty() ? "defaults" : options) + "): " + numakv_last_error());
            }
        }
        std::fprintf(stderr, "numakv_pibench: numakv %s, %s %s store in %s (options: %s), %zu threads\n",
                     numakv_version(), engine_.c_str(), kind.c_str(), dir_.c_str(),
                     options.empty() ? "defaults" : options.c_str(), opt.num_threads);
    }

    ~numakv_tree() override {
        char *json = nullptr;
        if (numakv_stats_json(store_, &json, nullptr) == NUMAKV_OK) {
            std::fprintf(stderr, "numakv_pibench: stats %s\n", json);
            numakv_free(json);
        }
        std::string threads;
        for (size_t n = 0; n < kMaxNodes; n++) {
            unsigned t = threads_on_[n].load();
            if (t > 0) threads += (threads.empty() ? "" : ", ") + std::string("node ") + std::to_string(n) + ": " + std::to_string(t);
        }
        std::fprintf(stderr, "numakv_pibench: worker threads per node: %s\n", threads.empty() ? "none" : threads.c_str());
        unsigned long long errors = errors_.load();
        if (errors > 0) std::fprintf(stderr, "numakv_pibench: %llu operations failed with an error (see above)\n", errors);
        if (numakv_close(store_) != NUMAKV_OK) {
            std::fprintf(stderr, "numakv_pibench: closing the store in %s: %s\n", dir_.c_str(), numakv_last_error());
        }
        remove_scratch();
    }

    bool find(const char *key, size_t sz, char *value_out) override {
        place();
        bool found = false;
        if (int_) {
            uint64_t v = 0;
            if (!ok(numakv_get(store_, load_key(key), &v, &found), "find")) return false;
            if (found) std::memcpy(value_out, &v, sizeof v);
            return found;
        }
        uint8_t *v = nullptr;
        size_t len = 0;
        if (!ok(numakv_bget(store_, bytes(key), sz, &v, &len, &found), "find")) return false;
        if (found) {
            std::memcpy(value_out, v, len < value_size_ ? len : value_size_);
            numakv_free(v);
        }
        return found;
    }

    bool insert(const char *key, size_t key_sz, const char *value, size_t value_sz) override {
        place();
        bool done = false;
        int rc = int_ ? numakv_insert(store_, load_key(key), load_value(value), &done)
                      : numakv_binsert(store_, bytes(key), key_sz, bytes(value), value_sz, &done);
        return ok(rc, "insert") && done;
    }

    bool update(const char *key, size_t key_sz, const char *value, size_t value_sz) override {
        place();
        bool done = false;
        int rc = int_ ? numakv_update(store_, load_key(key), load_value(value), &done)
                      : numakv_bupdate(store_, bytes(key), key_sz, bytes(value), value_sz, &done);
        return ok(rc, "update") && done;
    }

    bool remove(const char *key, size_t key_sz) override {
        place();
        bool done = false;
        int rc = int_ ? numakv_delete(store_, load_key(key), &done) : numakv_bdelete(store_, bytes(key), key_sz, &done);
        return ok(rc, "remove") && done;
    }

    // Records as PiBench expects them: <key><value> contiguous, in a buffer of this thread's.
    int scan(const char *key, size_t key_sz, int scan_sz, char *&values_out) override {
        place();
        std::vector<char> &out = scan_buffer();
        out.clear();
        values_out = out.data();
        numakv_iter *it = nullptr;
        int rc = int_ ? numakv_scan(store_, load_key(key), &it) : numakv_bscan(store_, bytes(key), key_sz, nullptr, 0, &it);
        if (!ok(rc, "scan")) return 0;
        int n = 0;
        for (; n < scan_sz; n++) {
            if (int_) {
                uint64_t k, v;
                rc = numakv_iter_next(it, &k, &v);
                if (rc != NUMAKV_OK) break;
                char kb[8];
                store_key(k, kb);
                append(kb, sizeof kb, key_size_);
                append(&v, sizeof v, value_size_);
            } else {
                uint8_t *k = nullptr, *v = nullptr;
                size_t kl = 0, vl = 0;
                rc = numakv_biter_next(it, &k, &kl, &v, &vl);
                if (rc != NUMAKV_OK) break;
                append(k, kl, key_size_);
                append(v, vl, value_size_);
                numakv_free(k);
                numakv_free(v);
            }
        }
        if (rc < 0) ok(rc, "scan");
        numakv_iter_free(it);
        values_out = out.data();
        return n;
    }

  private:
    static constexpr size_t kMaxNodes = 64;

    static const uint8_t *bytes(const char *p) { return reinterpret_cast<const uint8_t *>(p); }

    [[noreturn]] void fail(const std::string &what) {
        std::fprintf(stderr, "numakv_pibench: %s\n", what.c_str());
        if (store_) numakv_close(store_);
        remove_scratch();
        std::exit(1);
    }

    void remove_scratch() {
        if (scratch_.empty()) return;
        std::string cmd = "rm -rf '" + scratch_ + "'";
        if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "numakv_pibench: could not remove %s\n", scratch_.c_str());
        scratch_.clear();
    }

    // An existing store at --pool_path: only of the engine and kind asked for.
    void open_existing(const std::string &kind) {
        if (numakv_open(dir_.c_str(), &store_) != NUMAKV_OK) {
            fail("opening the store in " + dir_ + ": " + numakv_last_error());
        }
        char *json = nullptr;
        if (numakv_stats_json(store_, &json, nullptr) != NUMAKV_OK) fail(std::string("reading its stats: ") + numakv_last_error());
        std::string stats = json;
        numakv_free(json);
        std::string engine = json_field(stats, "engine"), found = json_field(stats, "kind");
        if (engine != engine_ || found != kind) {
            fail(dir_ + " holds a " + engine + " " + found + " store, not the " + engine_ + " " + kind +
                 " store asked for (NUMAKV_ENGINE / NUMAKV_KIND, -k/-v): use another --pool_path");
        }
    }

    // Places the calling PiBench worker on a node, once per thread and store.
    void place() {
        static thread_local const numakv_store *placed = nullptr;
        if (placed == store_) return;
        placed = store_;
        uint32_t node = 0;
        if (!ok(numakv_thread_register(store_, NUMAKV_INTERLEAVE | (pin_ ? NUMAKV_PIN : 0), &node), "placing a thread")) return;
        if (node < kMaxNodes) threads_on_[node]++;
    }

    // Whether a call succeeded; an error is counted, and the first of each code printed.
    bool ok(int rc, const char *op) {
        if (rc >= 0) return true;
        errors_++;
        size_t slot = static_cast<size_t>(-rc) % kMaxCodes;
        if (!reported_[slot].exchange(true)) {
            std::fprintf(stderr, "numakv_pibench: %s failed (%d): %s%s\n", op, rc, numakv_last_error(),
                         rc == NUMAKV_ERR_NO_SPACE ? " -- give the store more room with --pool_size (bytes per node)" : "");
        }
        return false;
    }

    // Appends a key or value to this thread's scan buffer, cut or zero-padded to PiBench's width.
    static void append(const void *p, size_t len, size_t width) {
        const char *c = static_cast<const char *>(p);
        size_t n = len < width ? len : width;
        std::vector<char> &o = scan_buffer();
        o.insert(o.end(), c, c + n);
        o.insert(o.end(), width - n, '\0');
    }

    // What scan() hands PiBench: valid until this thread's next scan.
    static std::vector<char> &scan_buffer() {
        static thread_local std::vector<char> out;
        return out;
    }

    static constexpr size_t kMaxCodes = 16;

    size_t key_size_, value_size_;
    bool int_ = true, pin_ = false;
    std::string engine_, dir_, scratch_;
    numakv_store *store_ = nullptr;
    std::atomic<unsigned long long> errors_{0};
    std::atomic<bool> reported_[kMaxCodes] = {};
    std::atomic<unsigned> threads_on_[kMaxNodes] = {};
};

}  // namespace

extern "C" tree_api *create_tree(const tree_options_t &opt) { return new numakv_tree(opt); }

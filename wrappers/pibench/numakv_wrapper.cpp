// PiBench's tree_api over numakv's C ABI (include/numakv.h). Which engine and options: the
// environment (NUMAKV_ENGINE, default fastfair; NUMAKV_OPTIONS, e.g. "nodes=2,mode=eadr";
// NUMAKV_KIND=int|bytes). Where: PiBench's --pool_path (a new directory; default a fresh one
// under /dev/shm, removed at exit), --pool_size per NUMA node. 8-byte keys and values go to an
// integer store by default (the papers' setting), anything else to a bytes store.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "numakv.h"
#include "tree_api.hpp"

namespace {

void die(const char *what) {
    std::fprintf(stderr, "numakv_pibench: %s: %s\n", what, numakv_last_error());
    std::exit(1);
}

std::string env_or(const char *name, const char *fallback) {
    const char *v = std::getenv(name);
    return v && *v ? v : fallback;
}

uint64_t load_u64(const char *p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

class numakv_tree final : public tree_api {
  public:
    explicit numakv_tree(const tree_options_t &opt) : key_size_(opt.key_size), value_size_(opt.value_size) {
        std::string engine = env_or("NUMAKV_ENGINE", "fastfair");
        std::string options = env_or("NUMAKV_OPTIONS", "");
        std::string kind = env_or("NUMAKV_KIND", key_size_ == 8 && value_size_ == 8 ? "int" : "bytes");
        int_ = kind == "int";
        if (int_ && (key_size_ != 8 || value_size_ != 8)) {
            std::fprintf(stderr, "numakv_pibench: an integer store takes 8-byte keys and values\n");
            std::exit(1);
        }
        if (opt.pool_size > 0) {
            options += (options.empty() ? "" : ",") + std::string("capacity=") + std::to_string(opt.pool_size);
        }
        if (opt.pool_path.empty()) {
            char tmpl[] = "/dev/shm/numakv-pibench-XXXXXX";
            if (!mkdtemp(tmpl)) die("mkdtemp");
            dir_ = std::string(tmpl) + "/store";
            scratch_ = tmpl;
        } else {
            dir_ = opt.pool_path;
        }
        int rc = int_ ? numakv_create(dir_.c_str(), engine.c_str(), options.c_str(), &store_)
                      : numakv_create_bytes(dir_.c_str(), engine.c_str(), options.c_str(), &store_);
        if (rc != NUMAKV_OK) {
            if (numakv_open(dir_.c_str(), &store_) != NUMAKV_OK) die("creating the store");
        }
        std::fprintf(stderr, "numakv_pibench: %s %s store in %s (options: %s)\n", engine.c_str(),
                     int_ ? "integer" : "bytes", dir_.c_str(), options.empty() ? "defaults" : options.c_str());
    }

    ~numakv_tree() override {
        if (numakv_close(store_) != NUMAKV_OK) die("closing the store");
        if (!scratch_.empty()) {
            std::string cmd = "rm -rf '" + scratch_ + "'";
            if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "numakv_pibench: could not remove %s\n", scratch_.c_str());
        }
    }

    bool find(const char *key, size_t sz, char *value_out) override {
        bool found = false;
        if (int_) {
            uint64_t v = 0;
            if (!valid(key) || numakv_get(store_, load_u64(key), &v, &found) != NUMAKV_OK) return false;
            if (found) std::memcpy(value_out, &v, sizeof v);
            return found;
        }
        uint8_t *v = nullptr;
        size_t len = 0;
        if (numakv_bget(store_, bytes(key), sz, &v, &len, &found) != NUMAKV_OK) return false;
        if (found) {
            std::memcpy(value_out, v, len < value_size_ ? len : value_size_);
            numakv_free(v, len);
        }
        return found;
    }

    bool insert(const char *key, size_t key_sz, const char *value, size_t value_sz) override {
        bool done = false;
        int rc = int_ ? (valid(key) ? numakv_insert(store_, load_u64(key), load_u64(value), &done) : NUMAKV_ERR_INVALID)
                      : numakv_binsert(store_, bytes(key), key_sz, bytes(value), value_sz, &done);
        return rc == NUMAKV_OK && done;
    }

    bool update(const char *key, size_t key_sz, const char *value, size_t value_sz) override {
        bool done = false;
        int rc = int_ ? (valid(key) ? numakv_update(store_, load_u64(key), load_u64(value), &done) : NUMAKV_ERR_INVALID)
                      : numakv_bupdate(store_, bytes(key), key_sz, bytes(value), value_sz, &done);
        return rc == NUMAKV_OK && done;
    }

    bool remove(const char *key, size_t key_sz) override {
        bool done = false;
        int rc = int_ ? (valid(key) ? numakv_delete(store_, load_u64(key), &done) : NUMAKV_ERR_INVALID)
                      : numakv_bdelete(store_, bytes(key), key_sz, &done);
        return rc == NUMAKV_OK && done;
    }

    // Records as PiBench expects them: <key><value> contiguous, in a buffer of this thread's.
    int scan(const char *key, size_t key_sz, int scan_sz, char *&values_out) override {
        std::vector<char> &out = scan_buffer();
        out.clear();
        numakv_iter *it = nullptr;
        int rc = int_ ? numakv_scan(store_, valid(key) ? load_u64(key) : 1, &it)
                      : numakv_bscan(store_, bytes(key), key_sz, nullptr, 0, &it);
        if (rc != NUMAKV_OK) return 0;
        int n = 0;
        for (; n < scan_sz; n++) {
            if (int_) {
                uint64_t k, v;
                if (numakv_iter_next(it, &k, &v) != NUMAKV_OK) break;
                append(&k, sizeof k, key_size_);
                append(&v, sizeof v, value_size_);
            } else {
                uint8_t *k = nullptr, *v = nullptr;
                size_t kl = 0, vl = 0;
                if (numakv_biter_next(it, &k, &kl, &v, &vl) != NUMAKV_OK) break;
                append(k, kl, key_size_);
                append(v, vl, value_size_);
                numakv_free(k, kl);
                numakv_free(v, vl);
            }
        }
        numakv_iter_free(it);
        values_out = out.data();
        return n;
    }

  private:
    static const uint8_t *bytes(const char *p) { return reinterpret_cast<const uint8_t *>(p); }

    // Integer stores reserve keys 0 and 2^64-1; PiBench's hashed ids (from 1) practically never
    // produce them, and an operation on one fails, visibly counted by PiBench.
    static bool valid(const char *key) {
        uint64_t k = load_u64(key);
        return k != 0 && k != UINT64_MAX;
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

    size_t key_size_, value_size_;
    bool int_ = true;
    std::string dir_, scratch_;
    numakv_store *store_ = nullptr;
};

}  // namespace

extern "C" tree_api *create_tree(const tree_options_t &opt) { return new numakv_tree(opt); }

// PiBench's index interface, written for numakv's CI from PiBench's documentation (its
// wrappers/README.md and the comments of its tree_api header): PiBench itself cannot be
// fetched in CI. The layout must match PiBench's own header, which PiBench compiles into its
// binary and passes to create_tree: five fields in this order, a class with a virtual
// destructor and five pure virtual operations in this order.
#ifndef NUMAKV_CI_TREE_API_HPP
#define NUMAKV_CI_TREE_API_HPP

#include <cstddef>
#include <string>

// What PiBench tells the index about the run (its command-line options).
struct tree_options_t {
    size_t key_size = 8;         // bytes per key (-k)
    size_t value_size = 8;       // bytes per value (-v)
    std::string pool_path = "";  // --pool_path, empty when not given
    size_t pool_size = 0;        // --pool_size in bytes, 0 when not given
    size_t num_threads = 1;      // worker threads (-t)
};

class tree_api;

// The one symbol PiBench looks up in the index's shared library.
extern "C" tree_api *create_tree(const tree_options_t &opt);

class tree_api {
  public:
    virtual ~tree_api() {}

    // Copies the value of `key` (sz bytes) into value_out; false when absent.
    virtual bool find(const char *key, size_t sz, char *value_out) = 0;

    // Adds key -> value; false when the key is already there.
    virtual bool insert(const char *key, size_t key_sz, const char *value, size_t value_sz) = 0;

    // Replaces the value of an existing key; false when the key is absent.
    virtual bool update(const char *key, size_t key_sz, const char *value, size_t value_sz) = 0;

    // Deletes key; false when it was absent.
    virtual bool remove(const char *key, size_t key_sz) = 0;

    // Up to scan_sz records from the first key >= key, in ascending key order, as contiguous
    // <key><value> records in memory the index owns (valid until the calling thread's next
    // scan); values_out points at them. Returns how many records there are.
    virtual int scan(const char *key, size_t key_sz, int scan_sz, char *&values_out) = 0;
};

#endif

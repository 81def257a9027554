//! NBTree Calloc (papers/nbtree.txt §III-C). Being written.

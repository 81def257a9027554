//! NOBtree NSM (papers/nobtree.txt §III-E). Being written.

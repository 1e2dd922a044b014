//! The Store conformance suite, run against the memory store.

use distlimit_memory::MemoryStore;

distlimit_test::conformance_tests!(|clock| async move { MemoryStore::with_clock(clock) });

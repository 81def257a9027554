//! Regression (original: incorrect concurrent split of internal nodes): four threads insert
//! interleaved keys into small nodes, so that leaves and internal nodes of several levels split
//! concurrently (and the root grows while others wait for it); every key stays findable during
//! and after, and the structure checks.

mod common;

use std::sync::Arc;

use common::{scaled, vk, Rng};
use numakv_index::Index;

#[test]
fn concurrent_internal_splits() {
    let t = Arc::new(common::volatile(256));
    let per = scaled(6000) as u64;
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let t = Arc::clone(&t);
            s.spawn(move || {
                let mut rng = Rng(th + 1);
                for i in 0..per {
                    // Interleaved and shuffled: neighbours belong to different threads.
                    let k = 1 + (i.wrapping_mul(2654435761) % per) * 4 + th;
                    assert!(t.insert(k, vk(k)).unwrap(), "key {k} inserted twice");
                    assert_eq!(t.get(k).unwrap(), Some(vk(k)), "own key {k} lost");
                    if i > 0 && rng.below(4) == 0 {
                        let j = rng.below(i);
                        let kj = 1 + (j.wrapping_mul(2654435761) % per) * 4 + th;
                        assert_eq!(t.get(kj).unwrap(), Some(vk(kj)), "earlier key {kj} lost");
                    }
                }
            });
        }
    });
    let r = t.check().unwrap();
    assert_eq!(r.entries, 4 * per);
    for k in 1..=4 * per {
        assert_eq!(t.get(k).unwrap(), Some(vk(k)));
    }
    // Several internal levels were built concurrently.
    assert!(t.stats().counter("root_splits").unwrap() >= 3, "{:?}", t.stats());
}

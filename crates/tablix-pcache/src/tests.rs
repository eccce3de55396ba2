//! Contract tests through the C callbacks SQLite calls, policy-order tests
//! and a property test against a model.

use std::collections::HashMap;

use proptest::prelude::*;

use crate::cache::{Cache, slot_of};
use crate::ffi::{PcacheMethods2, PcachePage, Sqlite3Pcache};
use crate::methods::methods;
use crate::policy::{Evict, LfuHist, Lru, Policy, S3Fifo, S3Lru, TinyLfu};

const PAGE: i32 = 1024;
const EXTRA: i32 = 48;

/// A cache created through the methods table, as SQLite would.
struct C {
    m: PcacheMethods2,
    p: *mut Sqlite3Pcache,
}

impl C {
    fn new(policy: Policy, purgeable: bool, capacity: i32) -> C {
        let m = methods(policy);
        // SAFETY: calling our own callbacks as SQLite does.
        let p = unsafe { (m.create.unwrap())(PAGE, EXTRA, i32::from(purgeable)) };
        assert!(!p.is_null());
        let c = C { m, p };
        unsafe { (c.m.cachesize.unwrap())(c.p, capacity) };
        c
    }
    fn fetch(&self, key: u32, create: i32) -> *mut PcachePage {
        unsafe { (self.m.fetch.unwrap())(self.p, key, create) }
    }
    fn unpin(&self, page: *mut PcachePage, discard: bool) {
        unsafe { (self.m.unpin.unwrap())(self.p, page, i32::from(discard)) }
    }
    fn rekey(&self, page: *mut PcachePage, old: u32, new: u32) {
        unsafe { (self.m.rekey.unwrap())(self.p, page, old, new) }
    }
    fn truncate(&self, limit: u32) {
        unsafe { (self.m.truncate.unwrap())(self.p, limit) }
    }
    fn shrink(&self) {
        unsafe { (self.m.shrink.unwrap())(self.p) }
    }
    fn count(&self) -> i32 {
        unsafe { (self.m.pagecount.unwrap())(self.p) }
    }
    fn cachesize(&self, n: i32) {
        unsafe { (self.m.cachesize.unwrap())(self.p, n) }
    }
}

impl Drop for C {
    fn drop(&mut self) {
        unsafe { (self.m.destroy.unwrap())(self.p) }
    }
}

fn extra(page: *mut PcachePage) -> &'static mut [u8] {
    unsafe { std::slice::from_raw_parts_mut((*page).extra.cast::<u8>(), EXTRA as usize) }
}

fn buf(page: *mut PcachePage) -> &'static mut [u8] {
    unsafe { std::slice::from_raw_parts_mut((*page).buf.cast::<u8>(), PAGE as usize) }
}

#[test]
fn fetch_flags_pins_content_and_zeroed_extra() {
    for policy in Policy::ALL {
        let c = C::new(policy, true, 10);
        assert!(
            c.fetch(1, 0).is_null(),
            "{policy}: createFlag 0 must not allocate"
        );
        let p = c.fetch(1, 1);
        assert!(!p.is_null());
        assert!(
            extra(p)[..8].iter().all(|b| *b == 0),
            "{policy}: extra's first pointer not zeroed"
        );
        assert_eq!(unsafe { (*p).buf } as usize % 8, 0, "buffer alignment");
        buf(p)[0] = 0xAB;
        extra(p)[0] = 0xCD;
        assert_eq!(
            c.fetch(1, 0),
            p,
            "{policy}: a resident page is returned as is"
        );
        c.unpin(p, false);
        let again = c.fetch(1, 0);
        assert_eq!(again, p);
        assert_eq!((buf(again)[0], extra(again)[0]), (0xAB, 0xCD));
        c.unpin(again, true);
        assert!(
            c.fetch(1, 0).is_null(),
            "{policy}: a discarded page is gone"
        );
        assert_eq!(c.count(), 0);
    }
}

#[test]
fn create_flag_1_backs_off_when_mostly_pinned_and_2_does_not() {
    for policy in Policy::ALL {
        let c = C::new(policy, true, 10);
        let pages: Vec<_> = (0..9).map(|k| c.fetch(k, 1)).collect();
        assert!(pages.iter().all(|p| !p.is_null()));
        assert!(c.fetch(100, 1).is_null(), "{policy}: 9 of 10 pinned");
        let p = c.fetch(100, 2);
        assert!(!p.is_null(), "{policy}: createFlag 2 must allocate");
        let q = c.fetch(101, 2);
        assert!(!q.is_null());
        assert_eq!(
            c.count(),
            11,
            "{policy}: over budget while everything is pinned"
        );
        for p in pages {
            c.unpin(p, false);
        }
        assert_eq!(c.count(), 10, "{policy}: back within budget once unpinned");
        c.unpin(p, false);
        c.unpin(q, false);
    }
}

#[test]
fn recycled_pages_have_zeroed_extra_and_count_evictions() {
    for policy in Policy::ALL {
        let c = C::new(policy, true, 3);
        for k in 1..=5 {
            let p = c.fetch(k, 1);
            assert!(!p.is_null());
            assert!(extra(p)[..8].iter().all(|b| *b == 0), "{policy}: page {k}");
            extra(p).fill(0xFF);
            c.unpin(p, false);
        }
        assert_eq!(c.count(), 3);
        // The end of a transaction publishes the statistics.
        c.truncate(u32::MAX);
        let s = crate::stats::caches();
        let me: Vec<_> = s
            .iter()
            .filter(|x| x.policy == policy && x.capacity == 3 && x.evictions >= 2)
            .collect();
        assert!(!me.is_empty(), "{policy}: evictions counted");
    }
}

#[test]
fn rekey_moves_and_discards_the_target() {
    for policy in Policy::ALL {
        let c = C::new(policy, true, 10);
        let p = c.fetch(1, 1);
        buf(p)[0] = 1;
        let other = c.fetch(8, 1);
        c.unpin(other, false);
        c.rekey(p, 1, 7);
        assert!(c.fetch(1, 0).is_null(), "{policy}");
        assert_eq!(c.fetch(7, 0), p);
        c.rekey(p, 7, 8);
        assert_eq!(c.count(), 1, "{policy}: the old page 8 was discarded");
        assert_eq!(c.fetch(8, 0), p);
        assert_eq!(buf(p)[0], 1);
        c.unpin(p, false);
    }
}

#[test]
fn truncate_drops_pinned_and_unpinned_pages_at_or_past_the_limit() {
    for policy in Policy::ALL {
        let c = C::new(policy, true, 20);
        let mut pinned = Vec::new();
        for k in 1..=10 {
            let p = c.fetch(k, 1);
            if k % 2 == 0 {
                pinned.push(p);
            } else {
                c.unpin(p, false);
            }
        }
        c.truncate(5);
        assert_eq!(c.count(), 4, "{policy}");
        for k in 1..=10 {
            assert_eq!(!c.fetch(k, 0).is_null(), k < 5, "{policy}: page {k}");
        }
        c.shrink();
        // Pages 2 and 4 are pinned (fetched twice), 1 and 3 too now.
        assert_eq!(c.count(), 4);
    }
}

#[test]
fn shrink_frees_only_unpinned_pages() {
    for policy in Policy::ALL {
        let c = C::new(policy, true, 20);
        let keep = c.fetch(1, 1);
        for k in 2..6 {
            let p = c.fetch(k, 1);
            c.unpin(p, false);
        }
        c.shrink();
        assert_eq!(c.count(), 1, "{policy}");
        assert_eq!(c.fetch(1, 0), keep);
    }
}

#[test]
fn non_purgeable_caches_never_evict() {
    for policy in Policy::ALL {
        let c = C::new(policy, false, 2);
        for k in 0..6 {
            let p = c.fetch(k, 1);
            assert!(
                !p.is_null(),
                "{policy}: createFlag 1 on a non-purgeable cache"
            );
            c.unpin(p, false);
        }
        assert_eq!(c.count(), 6);
        c.cachesize(1);
        assert_eq!(c.count(), 6);
        for k in 0..6 {
            assert!(!c.fetch(k, 0).is_null());
        }
    }
}

fn resident<P: Evict>(cache: &Cache<P>) -> Vec<u32> {
    cache.keys().into_iter().map(|(k, _)| k).collect()
}

fn touch<P: Evict>(cache: &mut Cache<P>, key: u32) {
    let p = cache.fetch(key, 2);
    assert!(!p.is_null());
    cache.unpin(unsafe { slot_of(p) }, false);
}

#[test]
fn lru_evicts_the_least_recently_unpinned() {
    let mut c = Cache::<Lru>::new(64, 8, true).unwrap();
    c.set_capacity(3);
    for k in [1, 2, 3, 1, 4] {
        touch(&mut c, k);
    }
    assert_eq!(resident(&c), [1, 3, 4]);
}

#[test]
fn lfu_hist_evicts_the_least_referenced_oldest_first() {
    let mut c = Cache::<LfuHist>::new(64, 8, true).unwrap();
    c.set_capacity(3);
    for k in [1, 1, 1, 2, 3, 3, 4] {
        touch(&mut c, k);
    }
    // 2 was referenced once and is older than 4's arrival.
    assert_eq!(resident(&c), [1, 3, 4]);
    touch(&mut c, 5);
    assert_eq!(
        resident(&c),
        [1, 3, 5],
        "4 (one reference) goes before 3 (two)"
    );
}

#[test]
fn s3_fifo_keeps_the_hot_set_through_a_scan() {
    fn hot_after_scan<P: Evict>() -> usize {
        let mut c = Cache::<P>::new(64, 8, true).unwrap();
        c.set_capacity(20);
        for _ in 0..3 {
            for k in 0..10 {
                touch(&mut c, k);
            }
        }
        for k in 1000..1100 {
            touch(&mut c, k);
        }
        resident(&c).iter().filter(|k| **k < 10).count()
    }
    assert_eq!(
        hot_after_scan::<S3Fifo>(),
        10,
        "s3-fifo lost hot pages to a scan"
    );
    assert_eq!(
        hot_after_scan::<S3Lru>(),
        10,
        "s3-lru lost hot pages to a scan"
    );
    // The last hot page touched is still in the one-page window when the
    // scan arrives, and may go; the other nine are in main.
    assert!(
        hot_after_scan::<TinyLfu>() >= 9,
        "w-tinylfu lost hot pages to a scan"
    );
    assert_eq!(
        hot_after_scan::<Lru>(),
        0,
        "lru is expected to be flushed by the scan"
    );
}

#[derive(Clone, Debug)]
enum Op {
    Fetch(u32, i32),
    Unpin(usize, bool),
    Rekey(usize, u32),
    Truncate(u32),
    Capacity(usize),
    Shrink,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u32..24, 0i32..3).prop_map(|(k, c)| Op::Fetch(k, c)),
        5 => (any::<usize>(), prop::bool::weighted(0.15)).prop_map(|(i, d)| Op::Unpin(i, d)),
        1 => (any::<usize>(), 0u32..24).prop_map(|(i, k)| Op::Rekey(i, k)),
        1 => (0u32..24).prop_map(Op::Truncate),
        1 => (1usize..12).prop_map(Op::Capacity),
        1 => Just(Op::Shrink),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    /// Against a model of what the contract guarantees: pinned pages stay
    /// resident with their contents, a hit returns the key's own contents,
    /// removed pages are gone, non-purgeable caches lose nothing.
    #[test]
    fn every_policy_honours_the_contract(
        policy in prop::sample::select(Policy::ALL.to_vec()),
        purgeable in any::<bool>(),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        match policy {
            Policy::Lru => contract_model::<Lru>(purgeable, ops)?,
            Policy::LfuHist => contract_model::<LfuHist>(purgeable, ops)?,
            Policy::S3Fifo => contract_model::<S3Fifo>(purgeable, ops)?,
            Policy::S3Lru => contract_model::<S3Lru>(purgeable, ops)?,
            Policy::TinyLfu => contract_model::<TinyLfu>(purgeable, ops)?,
        }
    }
}

fn contract_model<P: Evict>(purgeable: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    {
        let mut c = Cache::<P>::new(64, 16, purgeable).unwrap();
        c.set_capacity(6);
        // Model: key -> pinned, for pages known to exist; pins in order.
        let mut model: HashMap<u32, bool> = HashMap::new();
        let mut pins: Vec<(u32, *mut PcachePage)> = Vec::new();
        let tag = |p: *mut PcachePage| -> u32 { unsafe { *((*p).extra as *const u32) } };
        let set_tag = |p: *mut PcachePage, k: u32| unsafe { *((*p).extra as *mut u32) = k + 1 };
        for op in ops {
            match op {
                Op::Fetch(k, create) => {
                    let p = c.fetch(k, create);
                    if p.is_null() {
                        prop_assert!(model.get(&k) != Some(&true), "pinned page {} vanished", k);
                        prop_assert!(
                            purgeable
                                || !model.contains_key(&k)
                                || create == 0 && !model.contains_key(&k)
                        );
                        if !purgeable {
                            prop_assert!(!model.contains_key(&k), "non-purgeable lost {}", k);
                        }
                        prop_assert!(create != 2, "createFlag 2 returned NULL");
                        continue;
                    }
                    let t = tag(p);
                    if t == 0 {
                        // New (or recreated after eviction): allowed only if
                        // the model does not require it to be resident.
                        prop_assert!(model.get(&k) != Some(&true), "pinned page {} recreated", k);
                        prop_assert!(
                            purgeable || !model.contains_key(&k),
                            "non-purgeable page {} recreated",
                            k
                        );
                        prop_assert!(create != 0, "createFlag 0 created a page");
                        set_tag(p, k);
                    } else {
                        prop_assert_eq!(t, k + 1, "page {} holds another key's contents", k);
                    }
                    if model.get(&k) != Some(&true) {
                        pins.push((k, p));
                    }
                    model.insert(k, true);
                }
                Op::Unpin(i, discard) => {
                    if pins.is_empty() {
                        continue;
                    }
                    let (k, p) = pins.remove(i % pins.len());
                    c.unpin(unsafe { slot_of(p) }, discard);
                    if discard {
                        model.remove(&k);
                    } else {
                        model.insert(k, false);
                    }
                }
                Op::Rekey(i, new) => {
                    if pins.is_empty() {
                        continue;
                    }
                    let j = i % pins.len();
                    let (old, p) = pins[j];
                    if old == new {
                        continue;
                    }
                    if model.get(&new) == Some(&true) {
                        continue;
                    } // SQLite never rekeys onto a pinned page
                    c.rekey(unsafe { slot_of(p) }, new);
                    model.remove(&old);
                    model.insert(new, true);
                    set_tag(p, new);
                    pins[j] = (new, p);
                }
                Op::Truncate(limit) => {
                    c.truncate(limit);
                    model.retain(|k, _| *k < limit);
                    pins.retain(|(k, _)| *k < limit);
                }
                Op::Capacity(n) => c.set_capacity(n),
                Op::Shrink => {
                    c.shrink();
                    model.retain(|_, pinned| *pinned);
                }
            }
            c.check();
            let actual = c.keys();
            for (k, pinned) in &model {
                if *pinned {
                    prop_assert!(actual.contains(&(*k, true)), "pinned {} not resident", k);
                } else if !purgeable {
                    prop_assert!(
                        actual.iter().any(|(a, _)| a == k),
                        "non-purgeable {} lost",
                        k
                    );
                }
            }
            for (k, _) in &actual {
                prop_assert!(model.contains_key(k), "cache holds {} the model removed", k);
            }
        }
    }
    Ok(())
}

#[test]
fn s3_fifo_finds_a_victim_in_main_when_small_is_all_pinned() {
    let mut c = Cache::<S3Fifo>::new(64, 8, true).unwrap();
    c.set_capacity(20);
    // Hot pages reach main.
    for _ in 0..2 {
        for k in 0..20 {
            touch(&mut c, k);
        }
    }
    for k in 20..40 {
        touch(&mut c, k);
    }
    // Now pin many new pages: they all sit in small.
    let pinned: Vec<_> = (100..115).map(|k| c.fetch(k, 2)).collect();
    assert!(pinned.iter().all(|p| !p.is_null()));
    let p = c.fetch(200, 1);
    assert!(
        !p.is_null(),
        "an unpinned page in main should have been evicted"
    );
    c.check();
    assert!(c.page_count() <= 20);
}

/// An allocator that refuses page-sized allocations while this thread asks
/// it to, to test the contract's NULL-on-allocation-failure.
struct Refusing;

thread_local! {
    static REFUSE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// SAFETY: delegates to the system allocator, or returns null (allowed).
unsafe impl std::alloc::GlobalAlloc for Refusing {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.size() >= 1024 && REFUSE.with(|r| r.get()) {
            return std::ptr::null_mut();
        }
        // SAFETY: same layout contract.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: allocated by System above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Refusing = Refusing;

#[test]
fn allocation_failure_returns_null_and_the_cache_stays_usable() {
    for policy in Policy::ALL {
        let c = C::new(policy, true, 100);
        let kept = c.fetch(1, 2);
        assert!(!kept.is_null());
        buf(kept)[0] = 9;
        REFUSE.with(|r| r.set(true));
        let refused = (c.fetch(2, 2), c.fetch(3, 1));
        REFUSE.with(|r| r.set(false));
        assert!(
            refused.0.is_null() && refused.1.is_null(),
            "{policy}: allocation failure must give NULL"
        );
        assert_eq!(c.count(), 1, "{policy}");
        assert_eq!(c.fetch(1, 0), kept);
        assert_eq!(buf(kept)[0], 9);
        let later = c.fetch(2, 2);
        assert!(
            !later.is_null(),
            "{policy}: the cache recovers once memory is back"
        );
        c.unpin(later, false);
        c.unpin(kept, false);
    }
}

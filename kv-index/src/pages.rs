//! Memory on 2 MiB pages for the index's big arrays (the sequence-hash table and the
//! records), without `unsafe`: an anonymous mapping (`memmap2`) advised to use transparent
//! huge pages, which the caller views as typed elements with `zerocopy`.
//!
//! Why: a query or an insert at millions of blocks makes random accesses into arrays of tens
//! of MB. On 4 KiB pages nearly each one misses the TLB and pays a page walk (a nested one in
//! a VM) on top of the cache miss; one 2 MiB TLB entry covers 512 times more. The kernel here
//! gives huge pages only to memory advised with `MADV_HUGEPAGE` (THP mode `madvise`).
//!
//! If the kernel refuses the advice (THP disabled) the memory keeps 4 KiB pages, and if the
//! mapping itself fails the callers fall back to a `Vec`: slower, never wrong.

use memmap2::MmapMut;

/// Size of a transparent huge page on x86-64 (and aarch64 with 4 KiB base pages).
pub(crate) const HUGE_PAGE: usize = 2 << 20;
/// Base page size: the stride at which new memory is written to fault it in.
const PAGE: usize = 4096;
/// Arrays of at least this many bytes are mapped; below one huge page there is nothing to
/// gain, and the per-worker engine-id tables (~0.5 MB each) stay in `Vec`s.
pub(crate) const MAP_MIN_BYTES: usize = HUGE_PAGE;

/// `len` zeroed bytes starting on a 2 MiB boundary, advised to use huge pages, every page
/// already faulted in.
pub(crate) struct HugeMap {
    map: MmapMut,
    start: usize,
    len: usize,
}

impl HugeMap {
    /// `len` bytes (rounded up to whole huge pages, so the caller may use the rest), or
    /// `None` if the mapping fails.
    pub(crate) fn new(len: usize) -> Option<Self> {
        let len = len.next_multiple_of(HUGE_PAGE);
        // One extra huge page of address space so that a 2 MiB-aligned start exists (the
        // kernel backs only aligned 2 MiB ranges with huge pages); its unused part is never
        // written, so it takes no memory.
        let mut map = MmapMut::map_anon(len + HUGE_PAGE).ok()?;
        // Refused advice (THP disabled, an old kernel) leaves 4 KiB pages: still correct.
        let _ = map.advise(memmap2::Advice::HugePage);
        let start = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
        // Fault every page in now rather than on the event path. The kernel zeroes it, but
        // only a write allocates a page (a read maps the shared zero page).
        for at in (start..start + len).step_by(PAGE) {
            map[at] = 0;
        }
        Some(HugeMap { map, start, len })
    }

    /// Usable bytes (whole huge pages), all of which count as memory held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }

    #[inline(always)]
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_is_aligned_zeroed_and_writable() {
        let mut m = HugeMap::new(HUGE_PAGE + 1).unwrap();
        assert_eq!(m.len(), 2 * HUGE_PAGE);
        assert_eq!(m.bytes().as_ptr() as usize % HUGE_PAGE, 0);
        assert!(m.bytes().iter().all(|&b| b == 0));
        m.bytes_mut()[2 * HUGE_PAGE - 1] = 7;
        assert_eq!(m.bytes()[2 * HUGE_PAGE - 1], 7);
    }
}

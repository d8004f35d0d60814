//! The two building blocks of the index's compact tables.
//!
//! - [`IdTable`]: an open-addressing hash index that stores only `u32` ids into a dense
//!   array kept by its owner (4 bytes a bucket, at most 80% full), with a few bits of the
//!   hash as a tag beside each id so a probe rarely touches the dense array for a key that
//!   is not there. Linear probing from a multiply-shift home bucket: any table size works,
//!   so the table grows by 1.5x rather than 2x (53-80% full, never 40%). Probes never wrap:
//!   up to [`PAD`] spare buckets follow the last home bucket (as many as there are homes in
//!   a small table, so its runs always fit), and a run that would overflow them grows the
//!   table instead (at 80% full a run that long is a few in a million), so a probe is a
//!   plain forward scan. Deletion by backward shift
//!   (no tombstones). The owner supplies ids' hashes when the table needs them again
//!   (growth, deletion).
//! - [`Chunked`]: a dense array in fixed chunks of [`CHUNK`] entries, so a large table is
//!   ~100% used instead of the 50-100% of a doubling `Vec`, and growing never copies it.

const EMPTY: u32 = u32::MAX;

/// Buckets past the last home bucket, where the runs of the last homes continue (at most).
const PAD: usize = 512;

/// Spare buckets after `homes` home buckets.
fn pad(homes: usize) -> usize {
    homes.min(PAD)
}

/// A hash index over ids `0..=max_id()`; `ID_BITS` low bits of a bucket hold the id, the
/// rest a tag from the hash.
pub(super) struct IdTable<const ID_BITS: u32> {
    /// `homes + pad(homes)` buckets, or none.
    buckets: Box<[u32]>,
    homes: usize,
    len: usize,
}

/// Where [`IdTable::find_or_vacant`] found no match: the bucket an insert of that hash goes
/// to, valid until the table is next changed.
#[must_use]
pub(super) struct Vacant {
    bucket: usize,
    tag: u32,
}

impl<const ID_BITS: u32> Default for IdTable<ID_BITS> {
    fn default() -> Self {
        IdTable { buckets: Box::new([]), homes: 0, len: 0 }
    }
}

impl<const ID_BITS: u32> IdTable<ID_BITS> {
    const ID_MASK: u32 = (1 << ID_BITS) - 1;

    /// The largest id a bucket can hold (`ID_MASK` itself would make `EMPTY` ambiguous).
    pub(super) const fn max_id() -> u32 {
        Self::ID_MASK - 1
    }

    #[inline]
    fn tag(h: u64) -> u32 {
        // The low bits: `home` uses the high ones.
        (h as u32) & !Self::ID_MASK
    }


    #[inline]
    fn home(h: u64, homes: usize) -> usize {
        ((u128::from(h) * homes as u128) >> 64) as usize
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn capacity_bytes(&self) -> usize {
        self.buckets.len() * 4
    }

    /// The id with hash `h` for which `eq` holds.
    #[inline]
    pub(super) fn find(&self, h: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let tag = Self::tag(h);
        for &b in self.buckets.get(Self::home(h, self.homes)..).unwrap_or_default() {
            if b == EMPTY {
                return None;
            }
            // The tag bits equal (an empty bucket was ruled out above).
            if (b ^ tag) <= Self::ID_MASK && eq(b & Self::ID_MASK) {
                return Some(b & Self::ID_MASK);
            }
        }
        None
    }

    /// As [`find`](Self::find), or where to insert: makes room for one more first (so a
    /// table may grow even when the key is there). `all` lists every stored `(id, hash)`,
    /// for a rebuild: in the dense array's order, so growing reads it sequentially.
    #[inline]
    pub(super) fn find_or_vacant<I: Iterator<Item = (u32, u64)>>(
        &mut self,
        h: u64,
        mut eq: impl FnMut(u32) -> bool,
        all: impl Fn() -> I,
    ) -> Result<u32, Vacant> {
        if (self.len + 1) * 5 > self.homes * 4 {
            self.grow(&all);
        }
        let tag = Self::tag(h);
        loop {
            let home = Self::home(h, self.homes);
            for (i, &b) in self.buckets.iter().enumerate().skip(home) {
                if b == EMPTY {
                    return Err(Vacant { bucket: i, tag });
                }
                if (b ^ tag) <= Self::ID_MASK && eq(b & Self::ID_MASK) {
                    return Ok(b & Self::ID_MASK);
                }
            }
            // The run reaches the end of the padding: make the table larger.
            self.grow(&all);
        }
    }

    /// Stores `id` where [`find_or_vacant`](Self::find_or_vacant) said; `id <= max_id()`.
    #[inline]
    pub(super) fn fill(&mut self, v: Vacant, id: u32) {
        debug_assert!(id <= Self::max_id());
        self.buckets[v.bucket] = v.tag | id;
        self.len += 1;
    }

    /// The bucket holding `id` (whose hash is `h`); it must be there.
    fn bucket_of(&self, h: u64, id: u32) -> usize {
        let home = Self::home(h, self.homes);
        // An empty bucket's id bits are ID_MASK, never a stored id.
        let at = self.buckets[home..].iter().position(|&b| b & Self::ID_MASK == id);
        home + at.expect("the id is in the table")
    }

    /// Renames `old` (hash `h`) to `new`, as when the dense array moves an entry.
    pub(super) fn rename(&mut self, h: u64, old: u32, new: u32) {
        let i = self.bucket_of(h, old);
        self.buckets[i] = (self.buckets[i] & !Self::ID_MASK) | new;
    }

    /// Removes `id` (hash `h`), closing the gap by shifting later entries of the run back.
    pub(super) fn remove(&mut self, h: u64, id: u32, hash_of: impl Fn(u32) -> u64) {
        let homes = self.homes;
        let mut hole = self.bucket_of(h, id);
        self.buckets[hole] = EMPTY;
        self.len -= 1;
        for j in hole + 1..self.buckets.len() {
            let b = self.buckets[j];
            if b == EMPTY {
                break;
            }
            // The entry at j may fill the hole if its home is not after the hole.
            if Self::home(hash_of(b & Self::ID_MASK), homes) <= hole {
                self.buckets[hole] = b;
                self.buckets[j] = EMPTY;
                hole = j;
            }
        }
    }

    /// The address of the bucket a probe for hash `h` starts at, for a prefetch by a thread
    /// that cannot read the table (see [`prefetch`]): `buckets` and `homes` from
    /// [`raw_parts`](Self::raw_parts), possibly stale.
    #[inline]
    pub(super) fn home_addr(buckets: usize, homes: usize, h: u64) -> usize {
        buckets + 4 * Self::home(h, homes)
    }

    /// The bucket array's address and its number of home buckets.
    pub(super) fn raw_parts(&self) -> (usize, usize) {
        (self.buckets.as_ptr() as usize, self.homes)
    }

    /// Prefetches the bucket a probe for `h` starts at.
    #[inline]
    pub(super) fn prefetch(&self, h: u64) {
        if let Some(b) = self.buckets.get(Self::home(h, self.homes)) {
            prefetch(b as *const u32 as usize);
        }
    }

    /// Whether the next insert grows the table.
    pub(super) fn full(&self) -> bool {
        (self.len + 1) * 5 > self.homes * 4
    }

    /// The table this one grows into, built from `all` without changing this one (so an
    /// owner can build it while readers still probe this one); [`install`](Self::install)
    /// it. In a larger table still if a run would not fit the padding.
    pub(super) fn grown<I: Iterator<Item = (u32, u64)>>(&self, all: &impl Fn() -> I) -> Grown {
        let mut homes = self.homes;
        'size: loop {
            homes = (homes + homes / 2).max(8);
            let mut buckets = vec![EMPTY; homes + pad(homes)].into_boxed_slice();
            for (id, h) in all() {
                let mut i = Self::home(h, homes);
                loop {
                    match buckets.get_mut(i) {
                        Some(b) if *b == EMPTY => {
                            *b = Self::tag(h) | id;
                            break;
                        }
                        Some(_) => i += 1,
                        None => continue 'size,
                    }
                }
            }
            return Grown { buckets, homes };
        }
    }

    /// Replaces the buckets with `g`, built by [`grown`](Self::grown) from the same entries.
    pub(super) fn install(&mut self, g: Grown) {
        self.buckets = g.buckets;
        self.homes = g.homes;
    }

    fn grow<I: Iterator<Item = (u32, u64)>>(&mut self, all: &impl Fn() -> I) {
        let g = self.grown(all);
        self.install(g);
    }
}

/// A larger bucket array for an [`IdTable`], see [`IdTable::grown`].
pub(super) struct Grown {
    buckets: Box<[u32]>,
    homes: usize,
}

/// Asks the CPU to fetch the cache line at `addr`, so the probe that follows (after the
/// misses of a whole batch were started together) finds it there. A hint only: it never
/// faults and the program never reads through it, so `addr` may be stale or dangling.
#[inline(always)]
pub(super) fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is in the x86_64 baseline (SSE) and never faults, whatever the
    // address; nothing is read through the pointer.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Entries a chunk of a [`Chunked`] array.
pub(super) const CHUNK: usize = 1024;

/// A dense array of `T` in chunks of [`CHUNK`]; see the module docs.
pub(super) struct Chunked<T> {
    chunks: Vec<Box<[T; CHUNK]>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked { chunks: Vec::new(), len: 0 }
    }
}

impl<T: Copy + Default> Chunked<T> {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(super) fn get(&self, i: u32) -> T {
        let i = i as usize;
        self.chunks[i / CHUNK][i % CHUNK]
    }

    #[inline]
    pub(super) fn get_mut(&mut self, i: u32) -> &mut T {
        let i = i as usize;
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }

    /// Appends `v`; returns its index.
    #[inline]
    pub(super) fn push(&mut self, v: T) -> u32 {
        let (c, at) = (self.len / CHUNK, self.len % CHUNK);
        if c == self.chunks.len() {
            self.add_chunk();
        }
        self.chunks[c][at] = v;
        self.len += 1;
        (self.len - 1) as u32
    }

    #[cold]
    fn add_chunk(&mut self) {
        let chunk: Box<[T]> = vec![T::default(); CHUNK].into_boxed_slice();
        self.chunks.push(chunk.try_into().unwrap_or_else(|_| unreachable!("CHUNK entries")));
    }

    /// Removes and returns the last entry. One empty chunk is kept as a spare, so an array
    /// shrinking and growing across a chunk boundary does not reallocate each time.
    pub(super) fn pop(&mut self) -> Option<T> {
        self.len = self.len.checked_sub(1)?;
        let v = self.chunks[self.len / CHUNK][self.len % CHUNK];
        self.chunks.truncate(self.len.div_ceil(CHUNK) + 1);
        Some(v)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = T> + '_ {
        (0..self.len as u32).map(|i| self.get(i))
    }

    pub(super) fn capacity_bytes(&self) -> usize {
        self.chunks.len() * CHUNK * std::mem::size_of::<T>() + self.chunks.capacity() * std::mem::size_of::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(x: u32) -> u64 {
        u64::from(x).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555
    }

    /// A set of u32 values through an IdTable over a dense Vec, as the index uses it.
    #[derive(Default)]
    struct Set {
        table: IdTable<20>,
        dense: Vec<u32>,
    }

    impl Set {
        fn contains(&self, v: u32) -> bool {
            self.table.find(mix(v), |id| self.dense[id as usize] == v).is_some()
        }
        fn insert(&mut self, v: u32) -> bool {
            let dense = &self.dense;
            let all = || dense.iter().enumerate().map(|(i, &x)| (i as u32, mix(x)));
            match self.table.find_or_vacant(mix(v), |id| dense[id as usize] == v, all) {
                Ok(_) => false,
                Err(slot) => {
                    self.table.fill(slot, self.dense.len() as u32);
                    self.dense.push(v);
                    true
                }
            }
        }
        fn remove(&mut self, v: u32) -> bool {
            let Some(id) = self.table.find(mix(v), |id| self.dense[id as usize] == v) else { return false };
            let dense = &self.dense;
            self.table.remove(mix(v), id, |i| mix(dense[i as usize]));
            let last = self.dense.len() as u32 - 1;
            if id != last {
                let moved = self.dense[last as usize];
                self.table.rename(mix(moved), last, id);
            }
            self.dense.swap_remove(id as usize);
            true
        }
    }

    #[test]
    fn id_table_matches_a_hash_set_under_churn() {
        use std::collections::HashSet;
        let (mut s, mut want) = (Set::default(), HashSet::new());
        let mut x = 12345u64;
        for round in 0..60_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let v = (x >> 40) as u32 % 5_000;
            // Insert-heavy first, then remove-heavy, so the table grows and drains.
            if (x >> 20).is_multiple_of(3) || (round > 30_000 && (x >> 22).is_multiple_of(2)) {
                assert_eq!(s.remove(v), want.remove(&v), "remove {v}");
            } else {
                assert_eq!(s.insert(v), want.insert(v), "insert {v}");
            }
            assert_eq!(s.table.len(), want.len());
        }
        for v in 0..5_000 {
            assert_eq!(s.contains(v), want.contains(&v));
        }
        assert!(s.table.homes * 4 >= s.table.len() * 5);
    }

    #[test]
    fn chunked_push_pop_across_chunks() {
        let mut c = Chunked::default();
        for i in 0..(3 * CHUNK as u32 + 5) {
            assert_eq!(c.push(i), i);
        }
        assert_eq!(c.get(CHUNK as u32), CHUNK as u32);
        *c.get_mut(7) = 70;
        assert_eq!(c.get(7), 70);
        assert_eq!(c.iter().count(), 3 * CHUNK + 5);
        for i in (0..(3 * CHUNK as u32 + 5)).rev() {
            let want = if i == 7 { 70 } else { i };
            assert_eq!(c.pop(), Some(want));
        }
        assert_eq!(c.pop(), None);
        assert!(c.chunks.len() <= 2, "at most one spare chunk kept");
    }
}

//! The rows table the BPF program searches: one array map, memory-mapped into this process and
//! written in place, shared by every binary (each gets a contiguous range, freed when the last
//! process using it goes). A binary's rows are compiled on a thread of their own (a compiler's
//! largest library has millions), and placed once they are ready.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use foldhash::HashMap;
use rootline_unwind::UnwindSections;
use rootline_unwind::kernel_rows::{KernelRow, kernel_rows};

use rootline_image::{ModuleBudget, TableCharge};

use super::layout::Row;
use super::page_index::PageIndex;

/// A binary's key in the row table: its unwind sections, by address (one parse of a file is
/// shared by every process that maps it).
pub(super) fn binary_key(sections: &Arc<UnwindSections>) -> usize {
    Arc::as_ptr(sections) as usize
}
use super::row_cache;

/// A binary's rows, ready to be placed.
#[derive(Debug)]
enum Ready {
    /// Compiled from its unwind sections.
    Compiled(Vec<KernelRow>),
    /// Kept on disk, read straight into the table when placed.
    Kept(row_cache::Kept),
}

impl Ready {
    fn len(&self) -> usize {
        match self {
            Ready::Compiled(rows) => rows.len(),
            Ready::Kept(kept) => kept.count,
        }
    }

    /// The rows' base (the first row's address), their count and their page index; None when
    /// there are none, or they reach past 4 GiB of the first (the program's offsets are 32-bit).
    fn shape(&self) -> Option<(u64, u32, PageIndex)> {
        let (base, span) = match self {
            Ready::Compiled(rows) => {
                let base = rows.first()?.svma;
                (base, u32::try_from(rows.last()?.svma - base).ok()?)
            }
            Ready::Kept(kept) => (kept.base, kept.span),
        };
        let count = u32::try_from(self.len()).ok().filter(|&n| n > 0)?;
        Some((base, count, PageIndex::for_rows(count, span)))
    }

    /// Table slots the rows and their page index take.
    fn slots(&self) -> usize {
        self.shape().map_or(0, |(_, count, index)| {
            count as usize + index.slots() as usize
        })
    }
}

/// The rows of `sections`: from the cache in `cache` when kept there, else compiled (and kept
/// when large). None: with their page index they would take more than `max_rows` slots, the
/// table's largest free range (they could not be placed; kept rows that many are not even read).
fn rows_of(sections: &UnwindSections, cache: Option<&Path>, max_rows: usize) -> Option<Ready> {
    let cache = cache.filter(|_| is_large(sections));
    let key = cache.map(|_| row_cache::key(sections));
    if let (Some(dir), Some(key)) = (cache, key)
        && let Some(kept) = row_cache::open(dir, key)
    {
        let kept = Ready::Kept(kept);
        return (kept.slots() <= max_rows).then_some(kept);
    }
    let rows = kernel_rows(sections);
    if let (Some(dir), Some(key)) = (cache, key)
        && rows.len() >= row_cache::MIN_ROWS
    {
        row_cache::store(dir, key, &rows);
    }
    let rows = Ready::Compiled(rows);
    (rows.slots() <= max_rows).then_some(rows)
}

/// A binary's rows in the table, and their page index right after them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placed {
    pub start: u32,
    pub count: u32,
    /// Link-time address the rows' addresses are relative to.
    pub base: u64,
    pub index: PageIndex,
}

impl Placed {
    /// Table slots taken: the rows and their index.
    fn slots(&self) -> u32 {
        self.count + self.index.slots()
    }
}

struct Entry {
    sections: Weak<UnwindSections>,
    /// None: being compiled, or compiled without room (or rows).
    placed: Option<Placed>,
    /// The rows' memory, counted in the module budget while placed (held by one of the
    /// entries that share a placement).
    charge: Option<TableCharge>,
}

/// The shared rows table.
pub(super) struct RowTable {
    map: MappedRows,
    /// Free ranges `(start, len)`, sorted by start.
    free: Vec<(u32, u32)>,
    binaries: HashMap<usize, Entry>,
    /// Slots in use: rows and their page indexes.
    pub used: u64,
    /// Binaries whose rows did not fit.
    pub refused: u64,
    /// Where the rows are counted, and the most the counted tables may hold.
    budget: ModuleBudget,
    limit: Option<usize>,
    /// Binaries sent to the compiling thread, and what it sends back.
    compiling: foldhash::HashSet<usize>,
    requests: std::sync::mpsc::Sender<(usize, Weak<UnwindSections>)>,
    compiled: std::sync::mpsc::Receiver<Compiled>,
    /// The most rows a binary may have now, for the compiling thread (more are not read).
    room: Arc<AtomicUsize>,
    /// Whether the process's memory is limited (see [`RowTable::new`]).
    bounded: bool,
}

/// A binary's rows, compiled.
struct Compiled {
    key: usize,
    sections: Weak<UnwindSections>,
    /// None: more than the table had room for, or the binary is gone.
    rows: Option<Ready>,
}

/// Compiles (or reads) one binary's rows. Requests hold the sections weakly: a binary whose
/// processes all exited while it waited is freed, not compiled (and not placed: its
/// `Compiled` has no strong owner left).
fn compile_one(
    key: usize,
    weak: Weak<UnwindSections>,
    cache: Option<&Path>,
    room: &AtomicUsize,
) -> Compiled {
    let rows = weak
        .upgrade()
        .and_then(|sections| rows_of(&sections, cache, room.load(Ordering::Relaxed)));
    Compiled {
        key,
        sections: weak,
        rows,
    }
}

/// Compiles the binaries `jobs` yields, one after the other on a thread of its own, sending
/// each one's rows when done; false when the thread could not start.
fn spawn_compiler(
    jobs: impl IntoIterator<Item = (usize, Weak<UnwindSections>)> + Send + 'static,
    compiled: &std::sync::mpsc::SyncSender<Compiled>,
    cache: &Option<std::path::PathBuf>,
    room: &Arc<AtomicUsize>,
) -> bool {
    let (compiled, cache, room) = (compiled.clone(), cache.clone(), Arc::clone(room));
    std::thread::Builder::new()
        .name("rootline-rows".into())
        .spawn(move || {
            for (key, sections) in jobs {
                if compiled
                    .send(compile_one(key, sections, cache.as_deref(), &room))
                    .is_err()
                {
                    return;
                }
            }
        })
        .is_ok()
}

/// Whether `sections` are a large binary's (their rows are kept in the on-disk cache).
fn is_large(sections: &UnwindSections) -> bool {
    sections.eh_frame_bytes().map_or(0, <[u8]>::len) > row_cache::MIN_ROWS * 2
}

/// Compiles the rows of the binaries `requests` names, each on a thread of its own (a process
/// maps its large libraries at once), reading them from the on-disk cache where it has them.
/// `serial` (a memory limit applies): large binaries one at a time on one thread, so that at
/// most one large binary's rows wait to be placed (small ones still go at once: a new process's
/// own binary is not kept waiting behind a compiler's library).
fn compile_rows(
    requests: std::sync::mpsc::Receiver<(usize, Weak<UnwindSections>)>,
    compiled: std::sync::mpsc::SyncSender<Compiled>,
    serial: bool,
    room: Arc<AtomicUsize>,
) {
    let cache = row_cache::dir();
    let large = serial.then(|| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Weak<UnwindSections>)>();
        spawn_compiler(rx, &compiled, &cache, &room).then_some(tx)
    });
    for (key, sections) in requests {
        if let Some(Some(large)) = &large
            && sections.upgrade().is_some_and(|s| is_large(&s))
        {
            if large.send((key, sections)).is_err() {
                return;
            }
            continue;
        }
        if !spawn_compiler(std::iter::once((key, sections)), &compiled, &cache, &room) {
            return;
        }
    }
}

/// The rows map's memory, mapped into this process.
pub(super) struct MappedRows {
    ptr: std::ptr::NonNull<Row>,
    len: usize,
}

// SAFETY: the mapping is owned by the table and only written through `&mut self`.
unsafe impl Send for MappedRows {}

impl MappedRows {
    /// Maps the `len` rows of the array map behind `fd` (created `BPF_F_MMAPABLE`).
    pub fn new(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> std::io::Result<MappedRows> {
        use std::os::fd::AsRawFd;
        let bytes = (len * std::mem::size_of::<Row>()).next_multiple_of(4096);
        // SAFETY: a shared read-write mapping of a BPF array map created mmapable, `bytes` long
        // (its elements rounded up to a page, as the kernel maps it); the fd is valid for the
        // call, and the mapping lives until `Drop`.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast::<Row>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(MappedRows { ptr, len })
    }

    fn rows_mut(&mut self) -> &mut [Row] {
        // SAFETY: `ptr` maps `len` rows (see `new`), written only through `&mut self`; the BPF
        // program only reads them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MappedRows {
    fn drop(&mut self) {
        let bytes = (self.len * std::mem::size_of::<Row>()).next_multiple_of(4096);
        // SAFETY: unmaps exactly the mapping made in `new`, never used after.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), bytes);
        }
    }
}

impl RowTable {
    /// A table over `map`, all of it free; placed rows are counted in `budget`, and refused
    /// when they would take the tables it counts past `limit`. `bounded` (the process's memory
    /// is limited): large binaries' rows are read or compiled one at a time, each at most half
    /// the table.
    pub fn new(
        map: MappedRows,
        budget: ModuleBudget,
        limit: Option<usize>,
        bounded: bool,
    ) -> RowTable {
        let len = u32::try_from(map.len).unwrap_or(u32::MAX);
        let room = Arc::new(AtomicUsize::new(len as usize));
        let (requests, to_compile) = std::sync::mpsc::channel();
        // A rendezvous: compiled rows wait on their thread until they are placed.
        let (done, compiled) = std::sync::mpsc::sync_channel(0);
        // Without the thread, no rows are ever placed: those binaries are walked by guesswork.
        let serial = bounded;
        let _ = std::thread::Builder::new()
            .name("rootline-rows".into())
            .spawn({
                let room = Arc::clone(&room);
                move || compile_rows(to_compile, done, serial, room)
            });
        RowTable {
            compiling: Default::default(),
            requests,
            compiled,
            map,
            free: vec![(0, len)],
            binaries: HashMap::default(),
            used: 0,
            refused: 0,
            budget,
            limit,
            room,
            bounded,
        }
    }

    /// Tells the compiling thread the most rows a binary may have now: the largest free range,
    /// and under a memory limit no more than half the table (so that a binary's rows waiting
    /// to be placed take at most that).
    fn update_room(&self) {
        let largest = self.free.iter().map(|&(_, len)| len).max().unwrap_or(0) as usize;
        let cap = if self.bounded {
            self.map.len / 2
        } else {
            self.map.len
        };
        self.room.store(largest.min(cap), Ordering::Relaxed);
    }

    /// Where the rows of `sections` are; None while they are being compiled (the first call
    /// sends them to be) or when they did not fit.
    pub fn place(&mut self, sections: &Arc<UnwindSections>) -> Option<Placed> {
        let key = binary_key(sections);
        if let Some(e) = self.binaries.get(&key)
            && e.sections.upgrade().is_some()
        {
            return e.placed;
        }
        if let Some(placed) = self.same_rows(sections) {
            // The same binary loaded again: its rows are already in the table.
            let entry = Entry {
                sections: Arc::downgrade(sections),
                placed: Some(placed),
                charge: None,
            };
            if let Some(old) = self.binaries.insert(key, entry) {
                self.let_go(old);
            }
            return Some(placed);
        }
        if self.compiling.insert(key) {
            // Rows of binaries no process holds any more are freed first, so that the room the
            // compiling thread is told counts them (a compiler run again soon after its last
            // run exited finds its library's old rows still placed until something frees them).
            self.sweep();
            let _ = self.requests.send((key, Arc::downgrade(sections)));
        }
        None
    }

    /// Whether the rows of `sections` are being compiled (sent by [`RowTable::place`], not yet
    /// placed).
    pub fn is_compiling(&self, sections: &Arc<UnwindSections>) -> bool {
        self.compiling.contains(&binary_key(sections))
    }

    /// Places the rows compiled since the last call; true when any were placed (the mappings
    /// that wait for them should be sent again).
    pub fn take_compiled(&mut self) -> bool {
        let mut any = false;
        while let Ok(c) = self.compiled.try_recv() {
            self.compiling.remove(&c.key);
            if c.sections.strong_count() > 0 {
                self.install(c.key, c.sections, c.rows);
                any = true;
            }
        }
        any
    }

    /// Waits until every binary sent to be compiled is placed, or `deadline` passes.
    pub fn wait_compiled(&mut self, deadline: std::time::Instant) {
        while !self.compiling.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.compiled.recv_timeout(left) {
                Ok(c) => {
                    self.compiling.remove(&c.key);
                    if c.sections.strong_count() > 0 {
                        self.install(c.key, c.sections, c.rows);
                    }
                }
                Err(_) => return,
            }
        }
    }

    fn install(&mut self, key: usize, sections: Weak<UnwindSections>, rows: Option<Ready>) {
        // None: more rows than the table had room for (the binary is alive).
        let refusable = rows.as_ref().is_none_or(|r| r.len() > 0);
        let bytes = rows.as_ref().map_or(0, Ready::slots) * std::mem::size_of::<Row>();
        let fits = self.limit.is_none_or(|l| self.budget.fits(bytes, l));
        let placed = match rows {
            Some(rows) if fits => self.store(rows),
            _ => None,
        };
        let charge = placed.map(|_| self.budget.charge(bytes));
        if placed.is_none() && refusable {
            self.refused += 1;
        }
        if let Some(old) = self.binaries.insert(
            key,
            Entry {
                sections,
                placed,
                charge,
            },
        ) {
            self.let_go(old);
        }
    }

    /// The placement of a live binary whose CFI is the same as that of `sections` (the same
    /// file loaded again while its earlier load is still held), if any.
    fn same_rows(&self, sections: &UnwindSections) -> Option<Placed> {
        let same = |other: &UnwindSections| {
            other.eh_frame_bytes() == sections.eh_frame_bytes()
                && other.debug_frame_bytes() == sections.debug_frame_bytes()
                && format!("{:?}", other.cfi_bases(false))
                    == format!("{:?}", sections.cfi_bases(false))
                && format!("{:?}", other.cfi_bases(true))
                    == format!("{:?}", sections.cfi_bases(true))
        };
        let len = |s: &UnwindSections| {
            (
                s.eh_frame_bytes().map(<[u8]>::len),
                s.debug_frame_bytes().map(<[u8]>::len),
            )
        };
        self.binaries.values().find_map(|e| {
            let placed = e.placed?;
            let other = e.sections.upgrade()?;
            (len(&other) == len(sections) && same(&other)).then_some(placed)
        })
    }

    /// Drops an entry: its rows are freed unless another entry shares them (which then holds
    /// their charge).
    fn let_go(&mut self, entry: Entry) {
        let Some(p) = entry.placed else {
            return;
        };
        match self.binaries.values_mut().find(|o| o.placed == Some(p)) {
            Some(heir) => {
                if heir.charge.is_none() {
                    heir.charge = entry.charge;
                }
            }
            None => self.release(p),
        }
    }

    /// Frees the rows of binaries no process holds any more.
    pub fn sweep(&mut self) {
        let dead: Vec<usize> = self
            .binaries
            .iter()
            .filter(|(_, e)| e.sections.strong_count() == 0)
            .map(|(&k, _)| k)
            .collect();
        for k in dead {
            if let Some(entry) = self.binaries.remove(&k) {
                self.let_go(entry);
            }
        }
    }

    /// Places `rows` and their page index in the smallest free range that holds them; None when
    /// none does, or kept rows did not read back well formed (their file is then removed, to
    /// be compiled again).
    fn store(&mut self, rows: Ready) -> Option<Placed> {
        let (base, count, index) = rows.shape()?;
        let slots = count.checked_add(index.slots())?;
        // The smallest free range that holds them: binaries come and go in any order, and a
        // small one placed in the first range that fits can split the one range a compiler's
        // library would have fitted in.
        let slot = (0..self.free.len())
            .filter(|&i| self.free[i].1 >= slots)
            .min_by_key(|&i| self.free[i].1)?;
        let (start, len) = self.free[slot];
        if len == slots {
            self.free.remove(slot);
        } else {
            self.free[slot] = (start + slots, len - slots);
        }
        self.used += u64::from(slots);
        let placed = Placed {
            start,
            count,
            base,
            index,
        };
        let table = &mut self.map.rows_mut()[start as usize..][..slots as usize];
        let (table, index_slots) = table.split_at_mut(count as usize);
        let filled = match rows {
            Ready::Compiled(rows) => {
                for (slot, r) in table.iter_mut().zip(&rows) {
                    *slot = Row::new(r, base);
                }
                true
            }
            Ready::Kept(kept) => kept.read_into(table),
        };
        if !filled {
            self.release(placed);
            return None;
        }
        index.write(table, index_slots);
        self.update_room();
        Some(placed)
    }

    fn release(&mut self, p: Placed) {
        self.used -= u64::from(p.slots());
        let at = self.free.partition_point(|&(s, _)| s < p.start);
        self.free.insert(at, (p.start, p.slots()));
        // Merge with the neighbours.
        if at + 1 < self.free.len() && self.free[at].0 + self.free[at].1 == self.free[at + 1].0 {
            self.free[at].1 += self.free[at + 1].1;
            self.free.remove(at + 1);
        }
        if at > 0 && self.free[at - 1].0 + self.free[at - 1].1 == self.free[at].0 {
            self.free[at - 1].1 += self.free[at].1;
            self.free.remove(at);
        }
        self.update_room();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rootline_unwind::kernel_rows::RowKind;
    use std::os::fd::AsFd;

    /// A table over a memory file mapped as the BPF map is.
    fn table(len: usize) -> (RowTable, std::fs::File) {
        let file = tempfile::tempfile().expect("temp file");
        file.set_len((len * std::mem::size_of::<Row>()) as u64)
            .expect("sized");
        let map = MappedRows::new(file.as_fd(), len).expect("mapped");
        (RowTable::new(map, ModuleBudget::new(), None, false), file)
    }

    fn rows(n: u64) -> Vec<KernelRow> {
        (0..n)
            .map(|i| KernelRow {
                svma: 0x40_0000 + 16 * i,
                kind: RowKind::Rsp,
                cfa_offset: 8 + i as i32,
                rbp_offset: -16,
                arg: 0,
            })
            .collect()
    }

    #[test]
    fn kept_rows_are_read_into_the_table_as_compiled_rows_are_placed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut t, _file) = table(100);
        let compiled = t.store(Ready::Compiled(rows(10))).expect("placed");
        // Ten rows and a slot of page index.
        assert_eq!(
            (compiled.start, compiled.count, compiled.slots()),
            (0, 10, 11)
        );
        row_cache::store(dir.path(), 1, &rows(20));
        let kept = row_cache::open(dir.path(), 1).expect("kept");
        let placed = t.store(Ready::Kept(kept)).expect("placed");
        assert_eq!(
            (placed.start, placed.count, placed.base),
            (11, 20, 0x40_0000)
        );
        let want: Vec<Row> = rows(20).iter().map(|r| Row::new(r, 0x40_0000)).collect();
        assert_eq!(&t.map.rows_mut()[11..31], &want[..]);
        // Its index: one page, whose first row is the first.
        assert_eq!(placed.index.count, 1);
        assert_eq!(t.map.rows_mut()[31].pc, 0);
        assert_eq!(t.used, 32);
    }

    #[test]
    fn rows_go_to_the_smallest_free_range_that_holds_them() {
        let (mut t, _file) = table(100);
        let a = t.store(Ready::Compiled(rows(39))).expect("placed");
        let b = t.store(Ready::Compiled(rows(19))).expect("placed");
        let c = t.store(Ready::Compiled(rows(24))).expect("placed");
        assert_eq!((a.slots(), b.slots(), c.slots()), (40, 20, 25));
        t.release(a);
        assert_eq!(t.free, vec![(0, 40), (85, 15)]);
        // A small binary takes the 15 slots, not the first 10 of the 40 ...
        let small = t.store(Ready::Compiled(rows(9))).expect("placed");
        assert_eq!((small.start, small.slots()), (85, 10));
        // ... which still hold a large one.
        let large = t.store(Ready::Compiled(rows(39))).expect("placed");
        assert_eq!(large.start, 0);
    }

    #[test]
    fn kept_rows_that_do_not_read_back_leave_their_range_free() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut t, _file) = table(100);
        row_cache::store(dir.path(), 1, &rows(20));
        let path = dir.path().join(format!("{:016x}.rows", 1));
        let mut bytes = std::fs::read(&path).expect("kept");
        // The last row's address before the one ahead of it.
        let last = bytes.len() - 16;
        bytes[last..last + 4].copy_from_slice(&0u32.to_le_bytes());
        std::fs::write(&path, &bytes).expect("rewritten");
        let kept = row_cache::open(dir.path(), 1).expect("header still good");
        assert_eq!(t.store(Ready::Kept(kept)), None);
        assert_eq!((t.used, t.free.clone()), (0, vec![(0, 100)]));
        assert!(!path.exists(), "the damaged file is removed");
        // Rows that do not fit with their index are not placed either.
        assert_eq!(t.store(Ready::Compiled(rows(100))), None);
        assert_eq!(t.used, 0);
        // Rows that do not fit count as refused, as do rows too many to be sent at all (None);
        // a binary without rows does not.
        t.install(1, Weak::new(), Some(Ready::Compiled(rows(100))));
        t.install(2, Weak::new(), None);
        t.install(3, Weak::new(), Some(Ready::Compiled(Vec::new())));
        assert_eq!(t.refused, 2);
    }
}

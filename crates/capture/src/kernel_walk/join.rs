//! Joining the kernel's walks to perf samples: chunks assembled per thread into one
//! [`KernelStack`] per walk, then matched to the sample taken in the same interrupt (same thread,
//! same user registers, the walk's time at or just before the sample's).
//!
//! A deep walk goes on as task work before its thread returns to user space: its first chunks
//! come with the sample, the rest a moment later ([`Join::in_flight`] says a sample's walk is
//! still coming). A sample taken before that task work finished has the same user stack; its
//! walk says so (`same` in the program) and is given the walk it waits for.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::unwind::{MemoryReader, ReadFailure};
use foldhash::HashMap;

use super::layout::{CHUNK_HEADER_BYTES, ChunkHeader};

/// Why a kernel walk ended (the BPF program's `enum stop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WalkStop {
    /// The thread's outermost frame (return address undefined or zero).
    Root,
    /// An address in no mapping the walk knew.
    Unmapped,
    /// An address without rules (no CFI, or its binary's rows not loaded).
    NoRule,
    /// A rule the walk does not evaluate (another register, a signal frame).
    Unsupported,
    /// A stack read failed.
    Unreadable,
    /// A frame's CFA was not above its stack pointer.
    NotOutward,
    /// The walk reached its most frames per sample.
    Limit,
    /// The ring buffer was full: chunks were lost.
    Lost,
    /// A frame in a binary still being read: the stack above it was sent whole (up to a
    /// bound) instead.
    Pending,
    /// Not walked: the sample's copy reaches its thread's outermost frame (see
    /// [`crate::kernel_walk::KernelWalk::thread_whole`]).
    InCopy,
    /// A value the program does not send.
    Other(u8),
}

impl WalkStop {
    fn from_code(c: u8) -> WalkStop {
        match c {
            1 => WalkStop::Root,
            2 => WalkStop::Unmapped,
            3 => WalkStop::NoRule,
            4 => WalkStop::Unsupported,
            5 => WalkStop::Unreadable,
            6 => WalkStop::NotOutward,
            7 => WalkStop::Limit,
            8 => WalkStop::Lost,
            9 => WalkStop::Pending,
            12 => WalkStop::InCopy,
            c => WalkStop::Other(c),
        }
    }

    /// A short name for summaries.
    pub fn name(self) -> &'static str {
        match self {
            WalkStop::Root => "root",
            WalkStop::Unmapped => "unmapped",
            WalkStop::NoRule => "no-rule",
            WalkStop::Unsupported => "unsupported-rule",
            WalkStop::Unreadable => "unreadable",
            WalkStop::NotOutward => "not-outward",
            WalkStop::Limit => "frame-limit",
            WalkStop::Lost => "ring-full",
            WalkStop::Pending => "binary-pending",
            WalkStop::InCopy => "not walked (in the copy)",
            WalkStop::Other(_) => "other",
        }
    }
}

/// One walk: the stack words the kernel read past the sample's copy, at the sample's instant.
#[derive(Debug)]
pub struct KernelStack {
    ip: u64,
    sp: u64,
    bp: u64,
    /// `(address, value)`, sorted by address.
    words: Vec<(u64, u64)>,
    /// Stack dumps (a walk that reached a binary still being read), a page at a time:
    /// consecutive words from each address, sorted by address. A page may be shared with the
    /// thread's earlier dumps (see [`Join`]).
    spans: Vec<DumpPage>,
    /// The 8 code bytes before each return address into JIT code, read at the sample's
    /// instant: `(address, bytes)`, sorted by address.
    code: Vec<(u64, u64)>,
    /// Frames the kernel walked.
    pub frames: u32,
    /// Why the walk ended.
    pub stop: WalkStop,
    /// The address the walk stopped at, and the stack pointer there.
    pub end: (u64, u64),
}

impl KernelStack {
    /// The word at `addr`, if the walk read it.
    pub fn word(&self, addr: u64) -> Option<u64> {
        if let Ok(i) = self.words.binary_search_by_key(&addr, |w| w.0) {
            return Some(self.words[i].1);
        }
        let i = self.spans.partition_point(|(start, _)| *start <= addr);
        let (start, values) = self.spans.get(i.checked_sub(1)?)?;
        let at = addr - start;
        at.is_multiple_of(8)
            .then(|| values.get(usize::try_from(at / 8).ok()?).copied())?
    }

    /// Whether this walk read exactly the words `other` read at and above `low` (neither with
    /// a stack dump), and ended the same way.
    pub fn same_from(&self, other: &KernelStack, low: u64) -> bool {
        fn from(w: &KernelStack, low: u64) -> &[(u64, u64)] {
            &w.words[w.words.partition_point(|&(a, _)| a < low)..]
        }
        self.spans.is_empty()
            && other.spans.is_empty()
            && (self.stop, self.end) == (other.stop, other.end)
            && from(self, low) == from(other, low)
    }

    /// A walk that read `words` (sorted by address) and reached the thread's root.
    #[cfg(test)]
    pub(crate) fn from_words(words: Vec<(u64, u64)>) -> KernelStack {
        KernelStack {
            ip: 0,
            sp: 0,
            bp: 0,
            words,
            spans: Vec::new(),
            code: Vec::new(),
            frames: 0,
            stop: WalkStop::Root,
            end: (0, 0),
        }
    }

    /// The code bytes the walk read before return addresses into JIT code: `(address, the 8
    /// bytes from it)`, sorted by address.
    pub fn code(&self) -> &[(u64, u64)] {
        &self.code
    }

    /// Bytes of its stack dumps (pages it shares with other walks counted in each).
    pub fn dump_bytes(&self) -> usize {
        self.spans.iter().map(|s| s.1.len() * 8).sum()
    }

    /// The same walk without its stack dumps.
    pub fn without_dumps(&self) -> KernelStack {
        KernelStack {
            words: self.words.clone(),
            spans: Vec::new(),
            code: self.code.clone(),
            ..*self
        }
    }

    /// Words held.
    pub fn len(&self) -> usize {
        self.words.len() + self.spans.iter().map(|s| s.1.len()).sum::<usize>()
    }

    /// Whether the walk read nothing past the copy.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A reader over the words, for [`crate::unwind::SampleStack::fallback`]: a read of any
    /// other address fails as past the copy.
    pub fn reader(&self) -> WordsReader<'_> {
        WordsReader { stack: self }
    }
}

/// Reads a walk's words; see [`KernelStack::reader`].
pub struct WordsReader<'a> {
    stack: &'a KernelStack,
}

impl MemoryReader for WordsReader<'_> {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        if buf.len() != 8 {
            return false;
        }
        match self.stack.word(addr) {
            Some(v) => {
                buf.copy_from_slice(&v.to_le_bytes());
                true
            }
            None => false,
        }
    }

    fn failure(&self) -> Option<ReadFailure> {
        Some(ReadFailure::BeyondCopy)
    }
}

/// Counts of the join.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinStats {
    /// Walks assembled whole.
    pub walks: u64,
    /// Walks dropped because a chunk of theirs was missing.
    pub broken: u64,
    /// Walks matched to a sample.
    pub matched: u64,
    /// Walks no sample claimed (their sample was lost, or not a user sample).
    pub unclaimed: u64,
    /// Walks that went on as task work past the interrupt's frame limit.
    pub continued: u64,
    /// Samples given the walk of an earlier sample of their thread (taken before that walk's
    /// task work finished: the same user stack).
    pub shared: u64,
    /// Bytes of stack dumps received.
    pub dump_bytes: u64,
    /// Of those, bytes the thread's previous dump held the same (kept once).
    pub dump_bytes_shared: u64,
}

/// How long a walk waits for its sample, in nanoseconds of the walk's clock.
const CLAIM_WINDOW_NS: u64 = 2_000_000_000;
/// Furthest a walk's time may lie from its sample's.
const MATCH_NS: u64 = 200_000;
/// Most walks kept per thread.
const PER_THREAD: usize = 4096;
/// Most bytes of the threads' last dumps remembered for sharing (past it, only the newest
/// dump is): a host's idle threads, each dumped once while its binaries were read, must not
/// keep their dumps.
const LAST_DUMP_BYTES: usize = 8 << 20;

/// The program's `STOP_CONTINUES`: (in a chunk that is not the last) the walk goes on as task
/// work.
const STOP_CONTINUES: u8 = 10;
/// The mark of a sent word that holds code bytes (`CODE_WORD` in the program).
const CODE_WORD: u64 = 1 << 63;
/// The program's `STOP_SAME`: the sample has the user stack of the thread's walk still going on.
const STOP_SAME: u8 = 11;

/// A walk being assembled: its first chunk's header (with the last chunk's number, and
/// `STOP_CONTINUES` as its stop once it goes on as task work), its words and its dumps.
type Assembling = (ChunkHeader, Vec<(u64, u64)>, Vec<DumpPage>);

/// One chunk of a stack dump (a page, or the part of one above the walk's stack pointer): its
/// first address and its words.
type DumpPage = (u64, Arc<[u64]>);

/// A walk ready for its sample: the sample's time (a walk shared by samples of one stack is
/// ready once for each) and the walk.
type Ready = (u64, Arc<KernelStack>);

/// Walks being assembled and waiting for their samples.
#[derive(Default)]
pub struct Join {
    assembling: HashMap<u32, Assembling>,
    ready: HashMap<u32, VecDeque<Ready>>,
    /// Per thread, the times of samples waiting for the walk that goes on as task work.
    followers: HashMap<u32, Vec<u64>>,
    /// Per thread, the last walk that went on as task work (a `same` walk may arrive after it).
    last_continued: HashMap<u32, Arc<KernelStack>>,
    /// Per thread, the pages of its last walk's stack dump. The outer part of a deep stack
    /// seldom changes between samples: a page of the next dump that holds the same words is
    /// shared instead of held again (a compiler's stack dumps, up to a MiB each while its
    /// largest library is read, are mostly the same pages).
    last_dump: HashMap<u32, Vec<DumpPage>>,
    /// Bytes of the pages in `last_dump` (at most [`LAST_DUMP_BYTES`]).
    last_dump_bytes: usize,
    /// Counts.
    pub stats: JoinStats,
}

impl Join {
    /// Adds one chunk as read from the ring buffer.
    pub fn chunk(&mut self, bytes: &[u8]) {
        let Some(h) = ChunkHeader::parse(bytes) else {
            return;
        };
        if h.stop == STOP_SAME && h.last && h.seq == 0 {
            self.same(&h);
            return;
        }
        let words = &bytes[CHUNK_HEADER_BYTES.min(bytes.len())..];
        let entry = self.assembling.remove(&h.tid);
        let (first, mut collected, mut spans) = match entry {
            Some((first, collected, spans)) if h.seq == first.seq + 1 && h.time == first.time => {
                (first, collected, spans)
            }
            other => {
                // A walk cut short (its later chunks lost) or a chunk whose walk's first was.
                let interrupted = other.is_some();
                if interrupted {
                    self.stats.broken += 1;
                }
                if h.seq != 0 {
                    if !interrupted {
                        self.stats.broken += 1;
                    }
                    return;
                }
                (h, Vec::new(), Vec::new())
            }
        };
        if !h.span {
            // Most walks are one chunk: one allocation instead of a vector doubling word by
            // word.
            collected.reserve(usize::from(h.words).min(words.len() / 16));
        }
        if h.span {
            let bytes = &words[..(8 * usize::from(h.words)).min(words.len() / 8 * 8)];
            let page = self.dump_page(h.tid, h.end_sp, bytes);
            spans.push((h.end_sp, page));
        } else {
            for pair in words.chunks_exact(16).take(usize::from(h.words)) {
                let addr = u64::from_le_bytes(pair[..8].try_into().unwrap_or_default());
                let value = u64::from_le_bytes(pair[8..].try_into().unwrap_or_default());
                collected.push((addr, value));
            }
        }
        if !h.last {
            let mut head = first;
            head.seq = h.seq;
            if h.stop == STOP_CONTINUES {
                head.stop = STOP_CONTINUES;
            }
            self.assembling.insert(h.tid, (head, collected, spans));
            return;
        }
        // Code bytes come marked among the stack words.
        let mut code = Vec::new();
        collected.retain(|&(addr, value)| {
            let is_code = addr & CODE_WORD != 0;
            if is_code {
                code.push((addr & !CODE_WORD, value));
            }
            !is_code
        });
        code.sort_unstable_by_key(|w| w.0);
        code.dedup_by_key(|w| w.0);
        // The walk reads outward and sends each frame's words in address order, so they come
        // sorted (a deep walk has tens of thousands); a walk that followed a guess may not.
        if !collected.is_sorted_by_key(|w| w.0) {
            collected.sort_by_key(|w| w.0);
        }
        collected.dedup_by_key(|w| w.0);
        // A dump's pages arrive in address order.
        if !spans.is_sorted_by_key(|p| p.0) {
            spans.sort_by_key(|p| p.0);
        }
        self.remember_dump(h.tid, &spans);
        self.stats.walks += 1;
        let walk = Arc::new(KernelStack {
            ip: first.ip,
            sp: first.sp,
            bp: first.bp,
            words: collected,
            spans,
            code,
            frames: h.frames,
            stop: WalkStop::from_code(h.stop),
            end: (h.end_ip, h.end_sp),
        });
        self.push_ready(h.tid, first.time, walk.clone());
        if first.stop == STOP_CONTINUES {
            self.stats.continued += 1;
            for time in self.followers.remove(&h.tid).unwrap_or_default() {
                self.stats.shared += 1;
                self.push_ready(h.tid, time, walk.clone());
            }
            self.last_continued.insert(h.tid, walk);
        }
    }

    /// Remembers `pages` as thread `tid`'s last dump (none: forgets its last), within
    /// [`LAST_DUMP_BYTES`].
    fn remember_dump(&mut self, tid: u32, pages: &[DumpPage]) {
        let bytes = |pages: &[DumpPage]| pages.iter().map(|p| p.1.len() * 8).sum::<usize>();
        if let Some(old) = self.last_dump.remove(&tid) {
            self.last_dump_bytes -= bytes(&old);
        }
        if pages.is_empty() {
            return;
        }
        let new = bytes(pages);
        if self.last_dump_bytes + new > LAST_DUMP_BYTES {
            self.last_dump.clear();
            self.last_dump_bytes = 0;
        }
        self.last_dump.insert(tid, pages.to_vec());
        self.last_dump_bytes += new;
    }

    /// The words of a dump chunk from `start` (`bytes`, little-endian): the page of the
    /// thread's last dump there when it holds the same words, else a page of their own.
    fn dump_page(&mut self, tid: u32, start: u64, bytes: &[u8]) -> Arc<[u64]> {
        let words = || {
            bytes
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
        };
        self.stats.dump_bytes += bytes.len() as u64;
        if let Some(pages) = self.last_dump.get(&tid)
            && let Ok(i) = pages.binary_search_by_key(&start, |p| p.0)
            && pages[i].1.len() == bytes.len() / 8
            && pages[i].1.iter().copied().eq(words())
        {
            self.stats.dump_bytes_shared += bytes.len() as u64;
            return Arc::clone(&pages[i].1);
        }
        words().collect()
    }

    fn push_ready(&mut self, tid: u32, time: u64, walk: Arc<KernelStack>) {
        let queue = self.ready.entry(tid).or_default();
        if queue.len() >= PER_THREAD {
            queue.pop_front();
            self.stats.unclaimed += 1;
        }
        queue.push_back((time, walk));
    }

    /// A sample taken while the thread's walk goes on as task work (the thread has not returned
    /// to user space since): it gets that walk, now or when it is finished.
    fn same(&mut self, h: &ChunkHeader) {
        let regs = (h.ip, h.sp, h.bp);
        if let Some((head, ..)) = self.assembling.get(&h.tid)
            && head.stop == STOP_CONTINUES
            && (head.ip, head.sp, head.bp) == regs
        {
            let waiting = self.followers.entry(h.tid).or_default();
            if waiting.len() < PER_THREAD {
                waiting.push(h.time);
            } else {
                self.stats.broken += 1;
            }
            return;
        }
        // Its task work finished before this sample's chunk was written.
        if let Some(walk) = self.last_continued.get(&h.tid)
            && (walk.ip, walk.sp, walk.bp) == regs
        {
            let walk = walk.clone();
            self.stats.shared += 1;
            self.push_ready(h.tid, h.time, walk);
            return;
        }
        self.stats.broken += 1;
    }

    /// Whether thread `tid`'s sample at `time` has a walk still going on as task work (or
    /// shares the stack of one): its sample should wait for it.
    pub fn in_flight(&self, tid: u32, time: u64) -> bool {
        if self
            .followers
            .get(&tid)
            .is_some_and(|times| times.iter().any(|t| t.abs_diff(time) < MATCH_NS))
        {
            return true;
        }
        self.assembling.get(&tid).is_some_and(|(head, ..)| {
            head.stop == STOP_CONTINUES && head.time.abs_diff(time) < MATCH_NS
        })
    }

    /// The walk of thread `tid`'s sample at `time` with user registers `(ip, sp, bp)`: the walk
    /// with the same registers closest in time (the kernel stamps the sample just before the
    /// program runs, so the walk's time is a few microseconds later; the thread's next sample
    /// is a sampling period away). Walks older than the claim window are dropped.
    pub fn claim(
        &mut self,
        tid: u32,
        time: u64,
        ip: u64,
        sp: u64,
        bp: u64,
    ) -> Option<Arc<KernelStack>> {
        let queue = self.ready.get_mut(&tid)?;
        while queue
            .front()
            .is_some_and(|(t, _)| t.saturating_add(CLAIM_WINDOW_NS) < time)
        {
            queue.pop_front();
            self.stats.unclaimed += 1;
        }
        let (i, _) = queue
            .iter()
            .enumerate()
            .filter(|(_, (t, w))| (w.ip, w.sp, w.bp) == (ip, sp, bp) && t.abs_diff(time) < MATCH_NS)
            .min_by_key(|(_, (t, _))| t.abs_diff(time))?;
        self.stats.matched += 1;
        let walk = queue.remove(i).map(|(_, w)| w);
        if queue.is_empty() {
            self.ready.remove(&tid);
        }
        walk
    }

    /// Forgets a thread that exited: a walk of it still going on as task work will not come
    /// (walks ready for its last samples stay, to be claimed).
    pub fn thread_exited(&mut self, tid: u32) {
        if self
            .assembling
            .get(&tid)
            .is_some_and(|(head, ..)| head.stop == STOP_CONTINUES)
        {
            self.assembling.remove(&tid);
            self.stats.broken += 1;
        }
        self.followers.remove(&tid);
        self.last_continued.remove(&tid);
        self.remember_dump(tid, &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk's header: thread `tid`'s walk at `time` (registers 0x1000/0x7000), chunk `seq`
    /// with `words` entries.
    fn header(time: u64, tid: u32, seq: u32, words: usize) -> Vec<u8> {
        let mut b = vec![0u8; CHUNK_HEADER_BYTES];
        b[0..8].copy_from_slice(&time.to_le_bytes());
        b[12..16].copy_from_slice(&tid.to_le_bytes());
        b[16..24].copy_from_slice(&0x1000u64.to_le_bytes());
        b[24..32].copy_from_slice(&0x7000u64.to_le_bytes());
        b[40..44].copy_from_slice(&seq.to_le_bytes());
        b[44..46].copy_from_slice(&(words as u16).to_le_bytes());
        b
    }

    fn chunk(time: u64, tid: u32, seq: u32, last: bool, words: &[(u64, u64)]) -> Vec<u8> {
        let mut b = header(time, tid, seq, words.len());
        b[46] = u8::from(last);
        b[47] = 1;
        for &(a, v) in words {
            b.extend_from_slice(&a.to_le_bytes());
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn chunks_assemble_and_match_their_sample() {
        let mut j = Join::default();
        j.chunk(&chunk(100, 7, 0, false, &[(0x9008, 1), (0x9000, 2)]));
        j.chunk(&chunk(100, 7, 1, true, &[(0xa008, 3)]));
        assert_eq!(j.stats.walks, 1);
        // Other registers, or a sample far from it in time, do not claim it.
        assert!(j.claim(7, 150, 0x1001, 0x7000, 0).is_none());
        assert!(j.claim(7, 1_000_000, 0x1000, 0x7000, 0).is_none());
        let w = j.claim(7, 150, 0x1000, 0x7000, 0).expect("matched");
        assert_eq!(w.word(0x9000), Some(2));
        assert_eq!(w.word(0xa008), Some(3));
        assert_eq!(w.word(0xa000), None);
        assert_eq!(w.stop, WalkStop::Root);
        assert!(j.claim(7, 150, 0x1000, 0x7000, 0).is_none());
    }

    /// A dump chunk: `values` from `start`.
    fn span(time: u64, tid: u32, seq: u32, start: u64, values: &[u64]) -> Vec<u8> {
        let mut b = header(time, tid, seq, values.len());
        b[52..56].copy_from_slice(&1u32.to_le_bytes());
        b[64..72].copy_from_slice(&start.to_le_bytes());
        for v in values {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn dumps_join_the_walks_words_and_can_be_dropped() {
        let mut j = Join::default();
        j.chunk(&chunk(100, 7, 0, false, &[(0x9008, 1)]));
        // Two pages of a dump that continue each other, then one elsewhere.
        j.chunk(&span(100, 7, 1, 0xa000, &[10, 11]));
        j.chunk(&span(100, 7, 2, 0xa010, &[12]));
        j.chunk(&span(100, 7, 3, 0xb000, &[20]));
        let mut last = chunk(100, 7, 4, true, &[]);
        last[47] = 9;
        j.chunk(&last);
        let w = j.claim(7, 150, 0x1000, 0x7000, 0).expect("matched");
        assert_eq!(w.stop, WalkStop::Pending);
        let words: Vec<_> = [0x9008, 0xa000, 0xa008, 0xa010, 0xa018, 0xa004, 0xb000]
            .iter()
            .map(|&a| w.word(a))
            .collect();
        assert_eq!(
            words,
            [Some(1), Some(10), Some(11), Some(12), None, None, Some(20)]
        );
        assert_eq!((w.len(), w.dump_bytes()), (5, 32));
        let bare = w.without_dumps();
        assert_eq!(
            (bare.word(0x9008), bare.word(0xa000), bare.len()),
            (Some(1), None, 1)
        );
    }

    /// A dump of pages `(start, values)` for thread `tid`'s sample at `time`, as one walk.
    fn dump_walk(j: &mut Join, tid: u32, time: u64, pages: &[(u64, &[u64])]) -> Arc<KernelStack> {
        j.chunk(&chunk(time, tid, 0, false, &[]));
        for (i, (start, values)) in pages.iter().enumerate() {
            j.chunk(&span(time, tid, i as u32 + 1, *start, values));
        }
        let mut last = chunk(time, tid, pages.len() as u32 + 1, true, &[]);
        last[47] = 9;
        j.chunk(&last);
        j.claim(tid, time + 50, 0x1000, 0x7000, 0).expect("matched")
    }

    #[test]
    fn a_dump_page_holding_the_same_words_as_the_threads_last_is_shared() {
        let mut j = Join::default();
        let first = dump_walk(&mut j, 7, 100, &[(0xa010, &[1, 2]), (0xb000, &[3, 4])]);
        // The same thread: its first page starts elsewhere, its second holds the same words.
        let second = dump_walk(&mut j, 7, 200, &[(0xa018, &[2]), (0xb000, &[3, 4])]);
        assert!(Arc::ptr_eq(&first.spans[1].1, &second.spans[1].1));
        assert_eq!(
            (second.word(0xa018), second.word(0xb008)),
            (Some(2), Some(4))
        );
        // A page whose words changed is its own, and reads its new words.
        let third = dump_walk(&mut j, 7, 300, &[(0xb000, &[3, 5])]);
        assert!(!Arc::ptr_eq(&second.spans[1].1, &third.spans[0].1));
        assert_eq!((third.word(0xb000), third.word(0xb008)), (Some(3), Some(5)));
        assert_eq!(second.word(0xb008), Some(4));
        // Another thread's dump shares nothing.
        let other = dump_walk(&mut j, 8, 400, &[(0xb000, &[3, 5])]);
        assert!(!Arc::ptr_eq(&third.spans[0].1, &other.spans[0].1));
        assert_eq!(
            (j.stats.dump_bytes, j.stats.dump_bytes_shared),
            (8 * 11, 8 * 2)
        );
        assert_eq!(j.last_dump_bytes, 2 * 16);
        // A thread that exited leaves nothing to share.
        j.thread_exited(7);
        assert_eq!(j.last_dump_bytes, 16);
        let after = dump_walk(&mut j, 7, 500, &[(0xb000, &[3, 5])]);
        assert!(!Arc::ptr_eq(&third.spans[0].1, &after.spans[0].1));
    }

    #[test]
    fn the_dumps_remembered_for_sharing_are_bounded() {
        let mut j = Join::default();
        let page = vec![7u64; 512];
        // Threads each dumped once: only as many dumps as fit are remembered.
        let dumps = LAST_DUMP_BYTES / 4096 + 10;
        for tid in 0..dumps as u32 {
            dump_walk(&mut j, tid, 100, &[(0xa000, &page)]);
            assert!(j.last_dump_bytes <= LAST_DUMP_BYTES);
        }
        assert!(j.last_dump.len() < dumps);
        // The newest is remembered, and shared by its thread's next dump.
        let last = dumps as u32 - 1;
        let before = j.stats.dump_bytes_shared;
        dump_walk(&mut j, last, 200, &[(0xa000, &page)]);
        assert_eq!(j.stats.dump_bytes_shared, before + 4096);
        // A walk without a dump forgets its thread's last.
        j.chunk(&chunk(300, last, 0, true, &[(0x9008, 1)]));
        assert!(!j.last_dump.contains_key(&last));
    }

    /// `chunk` with stop code `stop`.
    fn with_stop(mut b: Vec<u8>, stop: u8) -> Vec<u8> {
        b[47] = stop;
        b
    }

    #[test]
    fn a_walk_that_goes_on_as_task_work_is_awaited_and_shared_by_samples_meanwhile() {
        let mut j = Join::default();
        // The interrupt's part, then a sample taken while the task work had not yet run.
        j.chunk(&with_stop(
            chunk(100, 7, 0, false, &[(0x9008, 1)]),
            STOP_CONTINUES,
        ));
        assert!(j.in_flight(7, 150) && !j.in_flight(7, 5_000_000) && !j.in_flight(8, 150));
        assert!(j.claim(7, 150, 0x1000, 0x7000, 0).is_none());
        j.chunk(&with_stop(chunk(900, 7, 0, true, &[]), STOP_SAME));
        assert!(j.in_flight(7, 950));
        // The task work's part ends the walk: both samples get it.
        j.chunk(&chunk(100, 7, 1, true, &[(0xa008, 3)]));
        assert!(!j.in_flight(7, 150) && !j.in_flight(7, 950));
        let first = j.claim(7, 150, 0x1000, 0x7000, 0).expect("the walk");
        let second = j.claim(7, 950, 0x1000, 0x7000, 0).expect("the same walk");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!((first.word(0x9008), first.word(0xa008)), (Some(1), Some(3)));
        assert_eq!((j.stats.continued, j.stats.shared), (1, 1));
        // A sample whose `same` chunk came after the task work finished gets the walk too; one
        // with other registers does not.
        j.chunk(&with_stop(chunk(1_500, 7, 0, true, &[]), STOP_SAME));
        assert!(j.claim(7, 1_500, 0x1000, 0x7000, 0).is_some());
        let mut other = with_stop(chunk(2_000, 7, 0, true, &[]), STOP_SAME);
        other[16..24].copy_from_slice(&0x2000u64.to_le_bytes());
        j.chunk(&other);
        assert!(j.claim(7, 2_000, 0x2000, 0x7000, 0).is_none());
        assert_eq!(j.stats.broken, 1);
    }

    #[test]
    fn a_thread_that_exits_before_its_task_work_ran_waits_no_more() {
        let mut j = Join::default();
        j.chunk(&with_stop(chunk(100, 7, 0, false, &[]), STOP_CONTINUES));
        j.chunk(&with_stop(chunk(900, 7, 0, true, &[]), STOP_SAME));
        j.thread_exited(7);
        assert!(!j.in_flight(7, 100) && !j.in_flight(7, 900));
        assert!(j.claim(7, 100, 0x1000, 0x7000, 0).is_none());
    }

    #[test]
    fn a_walk_missing_a_chunk_is_dropped() {
        let mut j = Join::default();
        j.chunk(&chunk(100, 7, 0, false, &[(0x9008, 1)]));
        j.chunk(&chunk(100, 7, 2, true, &[(0xa008, 3)]));
        assert_eq!((j.stats.walks, j.stats.broken), (0, 1));
        assert!(j.claim(7, 150, 0x1000, 0x7000, 0).is_none());
    }
}

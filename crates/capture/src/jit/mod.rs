//! JIT code: names and frame states for code that has no file image and no unwind tables
//! (.NET, Mono, Node/V8, the JVM).
//!
//! What the caller does: keep one [`JitMaps`], and for each sample of process `pid` unwind with a
//! [`JitMemory`] (the sample's stack plus [`JitMaps::process`]), so that the unwinder can find the
//! start of the JIT function at an address and read its code; at symbolization, ask
//! [`JitProcess::symbol`] for the name of a JIT address.
//!
//! What this module does: finds the process's perf map the way the process itself wrote it —
//! through `/proc/PID/root` (its mount namespace: a container's own `/tmp`) under its PID in its
//! own PID namespace (`NSpid`) — and reads it only if it is a regular file (not a symlink) owned
//! by the target's user or root; reads it incrementally when an address misses ([`perfmap`]);
//! parses each runtime's name style ([`names`]); reads the jitdump file the process maps
//! ([`jitdump`]); for .NET, reads the image loads of `perfinfo-NSPID.map` ([`perfinfo`], found
//! and checked like the perf map) and names the precompiled code of each ReadyToRun image from
//! the image itself (with `rootline_dotnet::image`; each image read once for all processes and held to the
//! module memory budget, [`images`]); reads JIT
//! code from `/proc/PID/mem`, caching each function's bytes; and decides the frame state in JIT
//! code ([`rootline_unwind::x86_64::instruction_analysis::jit`]).

mod budget;
mod files;
pub mod hotspot;
pub mod images;
pub mod jitdump;
pub mod names;
pub mod perfinfo;
pub mod perfmap;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use files::{MapRefused, namespace_pid, open_map, perf_info_path, perf_map_path};
pub use images::{ImageCache, ImageError};
use names::HOTSPOT_SAFEPOINT_HANDLER;
pub use names::{JitName, parse_name};
pub use perfmap::{JitSymbol, PerfMap, SymbolTable};

use crate::unwind::{Memory, NoCfiRule, ReadFailure, SampleStack};
use rootline_dotnet::image::r2r::R2rImage;
use rootline_image::{ModuleBudget, TableCharge};

/// How often a missing perf map is looked for again.
const OPEN_RETRY: Duration = Duration::from_millis(250);
/// How often a perf map is re-read when an address misses.
const REREAD_INTERVAL: Duration = Duration::from_millis(10);
/// Function code cached per symbol, at most.
const CODE_CACHE_BYTES: u64 = 16 * 1024;
/// Memory one cached function's entry takes besides its code.
const CODE_ENTRY_BYTES: usize = 64;
/// Frame rules cached per process, at most (the cache starts over when full).
const RULE_CACHE_ENTRIES: usize = 1 << 16;

/// The JIT state of one process: its perf map, cached code, and a handle on its memory.
#[derive(Debug)]
pub struct JitProcess {
    pid: u32,
    map: Option<PerfMap<File>>,
    dump: Option<jitdump::JitDump<File>>,
    info: Option<perfinfo::PerfInfo<File>>,
    /// Image loads of `info` already handled.
    images_done: usize,
    /// The process's ReadyToRun images by load address: `(end, image)`.
    images: BTreeMap<u64, (u64, Arc<R2rImage>)>,
    /// Images read so far, shared with every other process.
    image_cache: ImageCache,
    /// The precompiled methods looked up so far, at their load addresses.
    precompiled: SymbolTable,
    /// Images whose precompiled code could not be named, and why.
    pub image_errors: Vec<String>,
    /// Images refused for the module budget, tried again once it has room.
    refused_images: Vec<RefusedImage>,
    /// A HotSpot JVM asked for its perf map.
    jvm: hotspot::JvmPerfMap,
    last_open_try: Option<Instant>,
    last_read: Option<Instant>,
    /// Why the perf map was last refused, when it exists but was not used.
    pub refused: Option<String>,
    mem: Option<File>,
    code: HashMap<u64, (u64, Arc<[u8]>)>,
    /// Memory of the cached code.
    code_bytes: usize,
    rules: HashMap<(u64, bool), (Range<u64>, Option<NoCfiRule>)>,
    /// Where the state's memory is counted.
    modules: ModuleBudget,
    /// The module memory budget the state is held to (see the `budget` module).
    budget: Option<usize>,
    /// The state's count in the module memory.
    charge: Option<TableCharge>,
    /// The tables were let go for the budget: the memory they needed.
    tables_refused: Option<usize>,
}

impl JitProcess {
    fn new(pid: u32, image_cache: ImageCache, budget: Option<usize>) -> JitProcess {
        let modules = image_cache.modules();
        JitProcess {
            pid,
            map: None,
            dump: None,
            info: None,
            images_done: 0,
            images: BTreeMap::new(),
            image_cache,
            precompiled: SymbolTable::default(),
            image_errors: Vec::new(),
            refused_images: Vec::new(),
            jvm: hotspot::JvmPerfMap::default(),
            last_open_try: None,
            last_read: None,
            refused: None,
            mem: None,
            code: HashMap::new(),
            code_bytes: 0,
            rules: HashMap::new(),
            modules,
            budget,
            charge: None,
            tables_refused: None,
        }
    }

    fn lookup(&self, addr: u64) -> Option<&JitSymbol> {
        self.map
            .as_ref()
            .and_then(|m| m.symbols.lookup(addr))
            .or_else(|| self.dump.as_ref()?.symbols.lookup(addr))
            .or_else(|| self.precompiled.lookup(addr))
    }

    /// The symbol at `addr` from the perf map, the jitdump file or a precompiled image,
    /// re-reading them (at most every 10 ms) when it misses.
    pub fn symbol(&mut self, addr: u64) -> Option<&JitSymbol> {
        if self.lookup(addr).is_none() && !self.precompiled_method(addr) {
            self.jvm.missed(self.pid, addr);
            self.refresh();
            self.precompiled_method(addr);
        }
        self.lookup(addr)
    }

    /// Adds the precompiled method at `addr` to the symbols, if an image has one there.
    fn precompiled_method(&mut self, addr: u64) -> bool {
        let Some((&base, (end, image))) = self.images.range(..=addr).next_back() else {
            return false;
        };
        if addr >= *end {
            return false;
        }
        let Some(m) = image.method_at((addr - base) as u32) else {
            return false;
        };
        let (Some(start), Some(end)) = (
            base.checked_add(u64::from(m.start)),
            base.checked_add(u64::from(m.end)),
        ) else {
            return false;
        };
        let symbol = JitSymbol {
            start,
            end,
            name: JitName::precompiled(image, m),
        };
        self.precompiled.insert(symbol);
        self.account();
        true
    }

    /// Reads what the runtime appended to its perf map and jitdump file, opening them first
    /// when they are not open yet (looked for again at most every 250 ms).
    pub fn refresh(&mut self) {
        if self.tables_still_refused() {
            return;
        }
        let now = Instant::now();
        // A JVM rewrites its perf map whole with each answer: read it from the start then, and
        // only then (not while it is being rewritten).
        let rewritten = self.jvm.rewritten();
        if rewritten {
            self.map.as_mut().map(PerfMap::rewind);
            self.last_open_try = None;
            self.last_read = None;
        }
        let mut read_map = rewritten || !self.jvm.asking();
        let missing = self.map.is_none() || self.dump.is_none() || self.info.is_none();
        if missing
            && self
                .last_open_try
                .is_none_or(|t| now.duration_since(t) >= OPEN_RETRY)
        {
            self.last_open_try = Some(now);
            if self.map.is_none()
                && let Some(f) = self.open(perf_map_path(self.pid))
            {
                self.map = Some(PerfMap::new(f));
                read_map = true;
            }
            if self.dump.is_none()
                && let Some(path) = jitdump::mapped_jitdump(self.pid)
                && let Some(f) = self.open(path)
            {
                self.dump = Some(jitdump::JitDump::new(f));
            }
            if self.info.is_none()
                && let Some(f) = self.open(perf_info_path(self.pid))
            {
                self.info = Some(perfinfo::PerfInfo::new(f));
            }
            self.last_read = None;
        }
        if self
            .last_read
            .is_some_and(|t| now.duration_since(t) < REREAD_INTERVAL)
        {
            return;
        }
        self.last_read = Some(now);
        if let Some(m) = self.map.as_mut().filter(|_| read_map) {
            let _ = m.read_more();
        }
        self.account();
        if let Some(d) = self.dump.as_mut() {
            let _ = d.read_more();
        }
        self.account();
        if let Some(info) = self.info.as_mut()
            && info.read_more().is_ok()
            && info.images.len() > self.images_done
        {
            let new = info.images[self.images_done..].to_vec();
            self.images_done = info.images.len();
            let mut maps = None;
            for image in new.iter().filter(|i| i.base != 0) {
                let maps = maps
                    .get_or_insert_with(|| crate::process::read_maps(self.pid).unwrap_or_default());
                self.load_image(image, maps);
            }
        }
    }

    /// Adds a ReadyToRun image the runtime loaded, once the process's mappings confirm it: the
    /// image's file mapped from offset 0 at the perfinfo base (a perfinfo file left behind by an
    /// earlier process with the same pid names other images). The image is read once for all
    /// processes, through `/proc/PID/map_files` (the very file mapped) or else the target's
    /// root (its mount namespace). `maps`: the process's mappings, read once for the new loads.
    fn load_image(&mut self, image: &perfinfo::ImageLoad, maps: &[crate::process::MapsEntry]) {
        let pid = self.pid;
        let mapped = maps.iter().find(|m| m.start == image.base && m.offset == 0);
        let m = match mapped {
            None => {
                self.image_error(
                    image,
                    format!("not mapped at its perfinfo base {:#x}", image.base),
                );
                return;
            }
            Some(m) if m.path.trim_end_matches(" (deleted)") != image.path => {
                let e = format!("{:#x} maps {}, not this image", image.base, m.path);
                self.image_error(image, e);
                return;
            }
            Some(m) => m,
        };
        let via_map = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
        let path = if std::fs::metadata(&via_map).is_ok() {
            via_map
        } else {
            format!("/proc/{pid}/root{}", image.path)
        };
        match self.image_cache.get(&path) {
            Ok(r2r) => {
                let end = image.base.saturating_add(u64::from(r2r.size));
                self.images.insert(image.base, (end, r2r));
            }
            Err(ImageError::OverBudget { needed, size, .. }) => {
                self.refused_images.push(RefusedImage {
                    load: image.clone(),
                    path,
                    end: image.base.saturating_add(u64::from(size)),
                    needed,
                });
            }
            Err(e) => self.image_error(image, e.to_string()),
        }
    }

    /// Notes why `image` could not be named from (the first 16 reasons are kept).
    fn image_error(&mut self, image: &perfinfo::ImageLoad, error: String) {
        if self.image_errors.len() < 16 {
            self.image_errors.push(format!("{}: {error}", image.path));
        }
    }

    /// Whether `addr` lies in a ReadyToRun image refused for the module budget: without its
    /// method table the bounds of its functions are unknown, so its frames cannot be unwound
    /// exactly. An image the budget now has room for, or that another process loaded since, is
    /// loaded first.
    pub fn image_refused(&mut self, addr: u64) -> bool {
        let refused_at = |p: &JitProcess| {
            p.refused_images
                .iter()
                .position(|r| r.load.base <= addr && addr < r.end)
        };
        let Some(i) = refused_at(self) else {
            return false;
        };
        let r = &self.refused_images[i];
        if !self.image_cache.has_room_for(r.needed) && !self.image_cache.holds(&r.path) {
            return true;
        }
        let refused = self.refused_images.swap_remove(i);
        let maps = crate::process::read_maps(self.pid).unwrap_or_default();
        self.load_image(&refused.load, &maps);
        refused_at(self).is_some()
    }

    fn open(&mut self, path: PathBuf) -> Option<File> {
        match open_map(self.pid, &path) {
            Ok(f) => Some(f),
            Err(MapRefused::Open { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            // Not this process's: as if it had written none yet.
            Err(MapRefused::Stale(_)) => None,
            Err(e) => {
                self.refused = Some(e.to_string());
                None
            }
        }
    }

    /// Number of symbols known (perf map, jitdump and precompiled images).
    pub fn symbol_count(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.symbols.len())
            + self.dump.as_ref().map_or(0, |d| d.symbols.len())
            + self
                .images
                .values()
                .map(|(_, i)| i.methods.len())
                .sum::<usize>()
    }

    /// Reads process memory at `addr` (code), from the cache of the enclosing symbol's bytes
    /// when possible.
    pub fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        let len = buf.len() as u64;
        if let Some(sym) = self.symbol(addr).cloned()
            && addr + len <= sym.end
        {
            let cached = match self.code.get(&sym.start) {
                Some((end, bytes)) if *end == sym.end => Some(bytes.clone()),
                _ => {
                    let n = (sym.end - sym.start).min(CODE_CACHE_BYTES);
                    let mut bytes = vec![0u8; n as usize];
                    if self.read_mem(sym.start, &mut bytes) {
                        let bytes: Arc<[u8]> = bytes.into();
                        self.code_bytes += bytes.len() + CODE_ENTRY_BYTES;
                        if let Some((_, old)) =
                            self.code.insert(sym.start, (sym.end, bytes.clone()))
                        {
                            self.code_bytes -= old.len() + CODE_ENTRY_BYTES;
                        }
                        self.account();
                        Some(bytes)
                    } else {
                        None
                    }
                }
            };
            if let Some(bytes) = cached {
                let off = (addr - sym.start) as usize;
                if let Some(src) = bytes.get(off..off + buf.len()) {
                    buf.copy_from_slice(src);
                    return true;
                }
            }
        }
        self.read_mem(addr, buf)
    }

    fn read_mem(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        if self.mem.is_none() {
            self.mem = File::open(format!("/proc/{}/mem", self.pid)).ok();
        }
        self.mem
            .as_ref()
            .is_some_and(|f| f.read_exact_at(buf, addr).is_ok())
    }
}

/// A ReadyToRun image refused for the module budget.
#[derive(Debug)]
struct RefusedImage {
    load: perfinfo::ImageLoad,
    /// The path it was read through.
    path: String,
    /// One past the image's last mapped byte.
    end: u64,
    /// Memory its method table needs.
    needed: usize,
}

/// JIT state of every process seen.
#[derive(Debug)]
pub struct JitMaps {
    procs: HashMap<u32, JitProcess>,
    images: ImageCache,
    budget: Option<usize>,
    /// JVMs are not asked for perf maps.
    pub(crate) ask_jvms_off: bool,
}

impl JitMaps {
    /// No processes yet; their JIT state and images are counted in `modules`.
    pub fn new(modules: ModuleBudget) -> JitMaps {
        JitMaps {
            procs: HashMap::new(),
            images: ImageCache::new(modules),
            budget: None,
            ask_jvms_off: false,
        }
    }

    /// The state of process `pid` (created on first use; nothing is read until needed).
    pub fn process(&mut self, pid: u32) -> &mut JitProcess {
        self.procs.entry(pid).or_insert_with(|| {
            let mut p = JitProcess::new(pid, self.images.clone(), self.budget);
            p.jvm = hotspot::JvmPerfMap::new(!self.ask_jvms_off);
            p
        })
    }

    /// Whether `pid`'s runtime has named any JIT code (without making state for it).
    pub fn names_code(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.symbol_count() > 0)
    }

    /// The process exec'd: its old JIT state no longer applies.
    pub fn exec(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Holds every process's JIT state and the ReadyToRun images to the module budget (see
    /// [`JitProcess::heap_bytes`], [`ImageCache::set_module_budget`]).
    pub fn set_module_budget(&mut self, bytes: usize) {
        self.budget = Some(bytes);
        self.images.set_module_budget(bytes);
        for p in self.procs.values_mut() {
            p.budget = Some(bytes);
        }
    }

    /// Lets go of images no process holds, under budget pressure or when something was
    /// `refused` for the budget (see [`ImageCache::sweep`]).
    pub fn sweep_images(&mut self, refused: bool) {
        self.images.sweep(refused);
    }

    /// Whether a process's ReadyToRun image or JIT tables were refused for the module budget.
    pub fn refuses_any(&self) -> bool {
        self.procs
            .values()
            .any(|p| !p.refused_images.is_empty() || p.tables_refused.is_some())
    }

    /// Memory the cached ReadyToRun images hold, in bytes.
    pub fn image_bytes(&self) -> usize {
        self.images.bytes()
    }

    /// Memory the JIT state of every process and the cached ReadyToRun images hold, in bytes
    /// (as counted in the module memory).
    pub fn bytes(&self) -> usize {
        self.images.bytes()
            + self
                .procs
                .values()
                .map(|p| p.charge.as_ref().map_or(0, TableCharge::bytes))
                .sum::<usize>()
    }
}

/// A sample's memory for the unwinder: its copied stack, plus JIT code and function starts of
/// its process.
pub struct JitMemory<'a> {
    /// The sample's stack.
    pub stack: SampleStack<'a>,
    /// The process's JIT state.
    pub jit: &'a mut JitProcess,
    /// Code bytes read at the sample's instant, 8 at each address (sorted): the in-kernel
    /// walk's, before each return address into JIT code, whose bytes may have changed since.
    pub sample_code: &'a [(u64, u64)],
}

/// The `len` bytes at `addr` when one of the sample's code words (`(address, 8 bytes)`, sorted)
/// holds them all.
fn sample_code_at(words: &[(u64, u64)], addr: u64, len: usize) -> Option<&[u8]> {
    let i = words.partition_point(|w| w.0 <= addr).checked_sub(1)?;
    let (at, bytes) = &words[i];
    let from = usize::try_from(addr - at).ok()?;
    bytemuck::bytes_of(bytes).get(from..from.checked_add(len)?)
}

impl Memory for JitMemory<'_> {
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
        self.stack.read_stack_u64(addr)
    }

    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        if let Some(bytes) = sample_code_at(self.sample_code, addr, buf.len()) {
            buf.copy_from_slice(bytes);
            return true;
        }
        self.jit.read_code(addr, buf)
    }

    fn copied_len(&self) -> Option<usize> {
        self.stack.copied_len()
    }

    fn jit_function(&mut self, addr: u64) -> Option<Range<u64>> {
        self.jit
            .symbol(addr)
            .filter(|s| s.name.single_function)
            .map(|s| s.start..s.end)
    }

    fn code_refused(&mut self, addr: u64) -> bool {
        self.jit.code_refused(addr)
    }

    fn jit_code_unnamed(&mut self, addr: u64) -> bool {
        // A JVM names every piece of its code cache in its perf map (the interpreter and stubs
        // too, which keep frame pointers and are unwound by them); an address it does not name
        // yet was compiled after its last answer, and the sample waits for the next one.
        self.jit.jvm.asking() && self.jit.symbol(addr).is_none()
    }

    fn jit_interrupt_handler(&mut self, addr: u64) -> bool {
        self.jit
            .symbol(addr)
            .is_some_and(|s| s.name.name == HOTSPOT_SAFEPOINT_HANDLER)
    }

    fn jit_interpreter(&mut self, addr: u64) -> bool {
        // The interpreter is the one blob whose returns are pushed (see `JitName`).
        self.jit.symbol(addr).is_some_and(|s| s.name.pushed_returns)
    }

    fn jit_rule(&mut self, lookup: u64, leaf: bool) -> Option<Option<NoCfiRule>> {
        let function = self.jit_function(lookup)?;
        if let Some((f, rule)) = self.jit.rules.get(&(lookup, leaf))
            && *f == function
        {
            return Some(*rule);
        }
        let rule = rootline_unwind::x86_64::instruction_analysis::jit::rule_in_memory(
            function.clone(),
            lookup,
            leaf,
            self,
        );
        if self.jit.rules.len() >= RULE_CACHE_ENTRIES {
            self.jit.rules.clear();
        }
        self.jit.rules.insert((lookup, leaf), (function, rule));
        self.jit.account();
        Some(rule)
    }
}

#[cfg(test)]
mod tests;

//! Processes as the profiler tracks them: executable mappings from `/proc/PID/maps` and from
//! MMAP2 records, names from COMM, address spaces copied on FORK and reset on exec. Binaries are
//! opened through `/proc/PID/map_files` (deleted or replaced files) or `/proc/PID/root`
//! (containers) and parsed once per distinct file (device, inode, path), shared by every process
//! that maps it.
//!
//! Parsing a large binary (ELF, symbols, FDE index) takes milliseconds to seconds, so with
//! [`Processes::with_loader`] it happens on a loader thread: the file is opened at once (so a
//! process that exits right away can still be read) and its region is *pending* until the parse
//! arrives ([`Processes::poll_loaded`], [`Processes::wait_loaded`]). The caller must not trust an
//! unwind that touched a pending region ([`Processes::is_pending`]); it waits and unwinds again.
//!
//! With [`Processes::set_module_budget`], parsed binaries are held to a memory budget; the file
//! cache, the loader and the budget live in `binaries`.

use std::fs::File;
use std::sync::Arc;

use foldhash::{HashMap as FastMap, HashMapExt};

mod binaries;

pub use binaries::{BinaryFile, FileKey};
use binaries::{FileEntry, LoadRequest, Loader, open_file, parse_binary, placeholder};

use rootline_image::ModuleBudget;

use crate::unwind::{AddressSpace, CodeModule};

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    /// Start address.
    pub start: u64,
    /// End address.
    pub end: u64,
    /// Whether the region is executable.
    pub exec: bool,
    /// File offset.
    pub offset: u64,
    /// Device major, minor and inode.
    pub file_key: (u32, u32, u64),
    /// Path or pseudo name (empty for anonymous memory).
    pub path: String,
}

/// An executable mapping as `/proc/PID/maps` or an MMAP2 record gives it.
struct Mapped<'a> {
    start: u64,
    end: u64,
    /// File offset mapped at `start`.
    offset: u64,
    /// Device major, minor and inode of the file.
    key: (u32, u32, u64),
    /// Path or pseudo name.
    path: &'a str,
}

/// Parses `/proc/PID/maps` text; lines that do not parse are skipped.
pub fn parse_maps(text: &str) -> Vec<MapsEntry> {
    text.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let dev = fields.next()?;
    let inode = fields.next()?.parse().ok()?;
    let path = fields.next().unwrap_or("").trim_start().to_string();
    let (start, end) = range.split_once('-')?;
    let (maj, min) = dev.split_once(':')?;
    Some(MapsEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        offset,
        file_key: (
            u32::from_str_radix(maj, 16).ok()?,
            u32::from_str_radix(min, 16).ok()?,
            inode,
        ),
        path,
    })
}

/// Reads and parses `/proc/PID/maps`.
pub fn read_maps(pid: u32) -> std::io::Result<Vec<MapsEntry>> {
    Ok(parse_maps(&std::fs::read_to_string(format!(
        "/proc/{pid}/maps"
    ))?))
}

/// The thread ids of a process, from `/proc/PID/task`.
pub fn thread_ids(pid: u32) -> std::io::Result<Vec<u32>> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// A thread's name from `/proc/PID/task/TID/comm`.
pub fn thread_name(pid: u32, tid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// The state of one tracked process.
pub struct ProcessState {
    /// Executable regions with unwind data.
    pub space: AddressSpace,
    /// Binaries of each region, by region start.
    pub binaries: FastMap<u64, Arc<BinaryFile>>,
    /// Whether `/proc/PID/maps` has been read since the last exec.
    pub maps_read: bool,
    /// Regions (by start) whose binary is still being parsed, and which file they wait for.
    pending: FastMap<u64, FileKey>,
    /// Whether the process exited (it is kept a while for its last samples).
    exited: bool,
}

impl ProcessState {
    /// Whether the region starting at `start` waits for its binary's parse.
    pub fn is_pending(&self, start: u64) -> bool {
        self.pending.contains_key(&start)
    }

    /// Appends the address ranges of the regions whose binary is still being parsed.
    pub fn pending_ranges(&self, out: &mut Vec<(u64, u64)>) {
        for &start in self.pending.keys() {
            if let Some(r) = self.space.region(start) {
                out.push((r.start, r.end));
            }
        }
    }
}

/// All tracked processes and the binaries they share.
#[derive(Default)]
pub struct Processes {
    procs: FastMap<u32, ProcessState>,
    files: FastMap<FileKey, FileEntry>,
    vdso: Option<Arc<BinaryFile>>,
    loader: Option<Loader>,
    /// Files installed, and processes that got them, since [`Processes::take_installed`].
    installed: Vec<FileKey>,
    installed_pids: Vec<u32>,
    /// Address spaces retired so far (their keys count up).
    retired: u32,
    /// Where loaded modules are counted.
    modules: ModuleBudget,
    /// Most memory the modules counted in `modules` may hold; None: no limit.
    module_budget: Option<usize>,
    /// Memory of the modules tracked processes mapped at the last sweep.
    module_bytes_in_use: usize,
    /// Processes were removed since the reclaimable room was last counted.
    reclaimable_stale: bool,
}

/// Whether a mapping's path names no file at all: anonymous memory, the kernel's special
/// mappings. (A memory file, `/memfd:NAME`, is opened: it may hold a program or JIT code, see
/// [`holds_elf`].)
fn is_pseudo(path: &str) -> bool {
    path.is_empty() || path.starts_with('[') || path.starts_with("//anon")
}

/// Whether an opened memory file (`/memfd:NAME`, no file on disk) holds an ELF file: a program
/// executed from memory (container runtimes, sandboxes and self-extracting tools run programs
/// so) rather than JIT code.
fn holds_elf(file: Option<&std::fs::File>) -> bool {
    use std::os::unix::fs::FileExt;
    let mut magic = [0u8; 4];
    file.is_some_and(|f| f.read_exact_at(&mut magic, 0).is_ok() && &magic == b"\x7fELF")
}

/// Maps `binary` at `start..end` (from file offset `offset`) in `state`'s address space.
fn map_binary(
    state: &mut ProcessState,
    start: u64,
    end: u64,
    offset: u64,
    binary: Arc<BinaryFile>,
) {
    state.space.add_region(binary.region(start, end, offset));
    state.binaries.insert(start, binary);
}

/// What a mapping of no binary (anonymous memory, JIT code) is mapped from.
fn no_binary(path: Arc<str>) -> BinaryFile {
    BinaryFile {
        path,
        file: None,
        module: None,
        refused: None,
    }
}

impl Processes {
    /// No processes yet; binaries are parsed on the calling thread when first mapped, and
    /// counted in `modules`.
    pub fn new(modules: ModuleBudget) -> Processes {
        Processes {
            modules,
            ..Processes::default()
        }
    }

    /// Whether some region of `pid` waits for its binary.
    pub fn has_pending(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| !p.pending.is_empty())
    }

    /// Whether `addr` lies in a region of `pid` whose binary is still being parsed.
    pub fn is_pending(&self, pid: u32, addr: u64) -> bool {
        self.pending_file(pid, addr).is_some()
    }

    /// The file that the region of `pid` containing `addr` waits for, if it waits.
    pub fn pending_file(&self, pid: u32, addr: u64) -> Option<&FileKey> {
        let p = self.procs.get(&pid)?;
        if p.pending.is_empty() {
            return None;
        }
        p.pending.get(&p.space.region(addr)?.start)
    }

    /// Files installed and the processes they were installed into since the last call.
    pub fn take_installed(&mut self) -> (Vec<FileKey>, Vec<u32>) {
        (
            std::mem::take(&mut self.installed),
            std::mem::take(&mut self.installed_pids),
        )
    }

    /// Whether some known region of `pid` overlaps `start..end`.
    pub fn overlaps(&self, pid: u32, start: u64, end: u64) -> bool {
        self.procs
            .get(&pid)
            .is_some_and(|p| p.space.regions().any(|r| r.start < end && r.end > start))
    }

    /// Moves `pid`'s address space aside under a new key (above any real pid) and returns the
    /// key: regions still waiting for a binary get it there too. `pid` is then untracked (until
    /// [`Processes::exec`], [`Processes::fork`] or a mapping recreates it).
    pub fn retire(&mut self, pid: u32) -> Option<u32> {
        let state = self.procs.remove(&pid)?;
        self.retired += 1;
        // Real pids stay below 2^22 (the kernel's PID_MAX_LIMIT).
        let key = (1 << 31) | (self.retired & 0x7fff_ffff);
        for (&start, file) in &state.pending {
            if let Some(FileEntry::Loading(waiting)) = self.files.get_mut(file) {
                waiting.push((key, start));
            }
        }
        self.procs.insert(key, state);
        Some(key)
    }

    /// The tracked processes (not the address spaces kept aside), by pid.
    pub fn tracked(&self) -> impl Iterator<Item = (u32, &ProcessState)> {
        self.procs
            .iter()
            .filter(|(pid, _)| **pid < 1 << 31)
            .map(|(&pid, state)| (pid, state))
    }

    /// Forgets a process that exited. The module budget's reclaimable room is recounted by
    /// [`Processes::settle_reclaimable`], once after a batch of these.
    pub fn remove(&mut self, pid: u32) {
        if self.procs.remove(&pid).is_some() {
            self.reclaimable_stale = true;
        }
    }

    /// The process exited (its last thread is gone): it is kept for its last samples, but the
    /// binaries only exited processes map no longer hold their room in the module budget
    /// against a running process's (see [`Processes::recount_reclaimable`]).
    pub fn exited(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.exited = true;
            self.recount_reclaimable();
        }
    }

    /// The process's state, reading `/proc/PID/maps` the first time (or after an exec).
    pub fn get(&mut self, pid: u32) -> &mut ProcessState {
        if !self.procs.get(&pid).is_some_and(|p| p.maps_read) {
            self.refresh(pid);
        }
        self.procs.entry(pid).or_insert_with(new_state)
    }

    /// The process's state if tracked, without touching `/proc`.
    pub fn existing(&self, pid: u32) -> Option<&ProcessState> {
        self.procs.get(&pid)
    }

    /// Re-reads `/proc/PID/maps` and adds every executable region not known yet.
    pub fn refresh(&mut self, pid: u32) {
        let entries = read_maps(pid).unwrap_or_default();
        let mut state = self.procs.remove(&pid).unwrap_or_else(new_state);
        for e in entries.iter().filter(|e| e.exec) {
            let known = state
                .space
                .region(e.start)
                .is_some_and(|r| r.start == e.start && r.end == e.end);
            if !known {
                let mapped = Mapped {
                    start: e.start,
                    end: e.end,
                    offset: e.offset,
                    key: e.file_key,
                    path: &e.path,
                };
                self.add_region(&mut state, pid, mapped);
            }
        }
        state.maps_read = true;
        self.procs.insert(pid, state);
    }

    /// Records an executable mapping (from an MMAP2 record).
    pub fn mmap(
        &mut self,
        pid: u32,
        start: u64,
        len: u64,
        offset: u64,
        key: (u32, u32, u64),
        path: &str,
    ) {
        let mut state = self.procs.remove(&pid).unwrap_or_else(new_state);
        let mapped = Mapped {
            start,
            end: start.saturating_add(len),
            offset,
            key,
            path,
        };
        self.add_region(&mut state, pid, mapped);
        self.procs.insert(pid, state);
    }

    /// A new process `pid` forked from `ppid`: it starts with a copy of the parent's mappings.
    pub fn fork(&mut self, pid: u32, ppid: u32) {
        if pid == ppid || self.procs.contains_key(&pid) {
            return;
        }
        let Some(parent) = self.procs.get(&ppid) else {
            return;
        };
        let mut child = new_state();
        for r in parent.space.regions() {
            child.space.add_region(r.clone());
        }
        child.binaries = parent.binaries.clone();
        child.pending = parent.pending.clone();
        child.maps_read = true;
        for (&start, key) in &child.pending {
            if let Some(FileEntry::Loading(waiting)) = self.files.get_mut(key) {
                waiting.push((pid, start));
            }
        }
        self.procs.insert(pid, child);
    }

    /// The process exec'd: forget its mappings (new MMAP2 records follow).
    pub fn exec(&mut self, pid: u32) {
        let mut state = new_state();
        state.maps_read = true;
        self.procs.insert(pid, state);
    }

    /// The binary of the region containing `addr` in `pid`.
    pub fn binary_at(
        &self,
        pid: u32,
        addr: u64,
    ) -> Option<(&crate::unwind::Region, &Arc<BinaryFile>)> {
        let p = self.procs.get(&pid)?;
        let r = p.space.region(addr)?;
        Some((r, p.binaries.get(&r.start)?))
    }

    fn add_region(&mut self, state: &mut ProcessState, pid: u32, mapped: Mapped<'_>) {
        let Mapped {
            start,
            end,
            offset,
            key,
            path,
        } = mapped;
        if !state.pending.is_empty() {
            // The regions this one replaces no longer wait for anything.
            state.pending.retain(|&s, _| {
                state
                    .space
                    .region(s)
                    .is_none_or(|r| r.end <= start || r.start >= end)
            });
        }
        let binary = if path == "[vdso]" {
            self.vdso(pid, start, end)
        } else if is_pseudo(path) {
            Arc::new(no_binary(path.into()))
        } else {
            let path: Arc<str> = path.into();
            let cache_key = (key.0, key.1, key.2, path.clone());
            if let Some(FileEntry::Ready(b)) = self.files.get(&cache_key)
                && b.refused.is_some_and(|needed| self.has_room_for(needed))
            {
                self.files.remove(&cache_key);
            }
            match self.files.get_mut(&cache_key) {
                Some(FileEntry::Ready(b)) => b.clone(),
                Some(FileEntry::Loading(waiting)) => {
                    waiting.push((pid, start));
                    state.pending.insert(start, cache_key);
                    placeholder(&path)
                }
                None => {
                    let file = open_file(pid, start, end, &path);
                    if path.starts_with("/memfd:") && !holds_elf(file.as_ref()) {
                        // JIT code in a memory file (.NET maps its code twice through one): no
                        // binary, for this mapping and the file's others.
                        let b = Arc::new(no_binary(path));
                        self.files.insert(cache_key, FileEntry::Ready(b.clone()));
                        return map_binary(state, start, end, offset, b);
                    }
                    match &mut self.loader {
                        Some(loader) => {
                            let request = LoadRequest {
                                key: cache_key.clone(),
                                file,
                                budget: self.module_budget,
                            };
                            match loader.requests.send(request) {
                                Ok(()) => {
                                    loader.outstanding += 1;
                                    self.files.insert(
                                        cache_key.clone(),
                                        FileEntry::Loading(vec![(pid, start)]),
                                    );
                                    state.pending.insert(start, cache_key);
                                    placeholder(&path)
                                }
                                Err(e) => {
                                    self.loader = None;
                                    let b = Arc::new(parse_binary(
                                        &path,
                                        e.0.file,
                                        &self.modules,
                                        self.module_budget,
                                    ));
                                    self.files.insert(cache_key, FileEntry::Ready(b.clone()));
                                    b
                                }
                            }
                        }
                        None => {
                            let b = Arc::new(parse_binary(
                                &path,
                                file,
                                &self.modules,
                                self.module_budget,
                            ));
                            if b.is_open() {
                                self.files.insert(cache_key, FileEntry::Ready(b.clone()));
                            }
                            b
                        }
                    }
                }
            }
        };
        map_binary(state, start, end, offset, binary);
    }

    fn vdso(&mut self, pid: u32, start: u64, end: u64) -> Arc<BinaryFile> {
        if let Some(v) = &self.vdso {
            return v.clone();
        }
        // The vDSO is the same image in every process of this kernel: read it once from memory.
        // It is a few KiB and is never refused (a refusal would leave its frames unwound by
        // guesswork): it is counted in the modules' memory but not held to the budget.
        let bytes = read_process_memory(pid, start, (end - start) as usize);
        let module = bytes.and_then(|b| {
            CodeModule::parse("[vdso]", b.into(), &self.modules, None)
                .ok()
                .map(Arc::new)
        });
        let v = Arc::new(BinaryFile {
            path: "[vdso]".into(),
            file: None,
            module,
            refused: None,
        });
        if v.module.is_some() {
            self.vdso = Some(v.clone());
        }
        v
    }
}

fn new_state() -> ProcessState {
    ProcessState {
        space: AddressSpace::new(),
        binaries: FastMap::new(),
        maps_read: false,
        pending: FastMap::new(),
        exited: false,
    }
}

/// What `/proc/PID/stat` says of a process's life: its state letter and its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LifeStat {
    /// The state (`R`, `S`, `T`, `Z` …; field 3).
    pub state: char,
    /// Clock ticks after boot when it started (field 22): tells a reused pid apart.
    pub start_time: u64,
}

impl LifeStat {
    /// Whether it has exited (a zombie not yet reaped, or dead).
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Process `pid`'s [`LifeStat`], None when it is gone (or the file cannot be read).
pub(crate) fn life_stat(pid: u32) -> Option<LifeStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) is in parentheses and may hold anything: fields follow its last `)`.
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(LifeStat { state, start_time })
}

/// Reads `len` bytes of a process's memory through `/proc/PID/mem`.
pub fn read_process_memory(pid: u32, addr: u64, len: usize) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, addr).ok()?;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse() {
        let text = "55d0c6a00000-55d0c6a01000 r-xp 00001000 08:01 1234 /usr/bin/x y\n\
                    7ffd1000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]\n\
                    7f00-8000 rw-p 00000000 00:00 0 \n";
        let e = parse_maps(text);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].path, "/usr/bin/x y");
        assert!(e[0].exec);
        assert_eq!(e[0].offset, 0x1000);
        assert_eq!(e[0].file_key, (8, 1, 1234));
        assert_eq!(e[1].path, "[vdso]");
        assert!(!e[2].exec);
        assert_eq!(e[2].path, "");
    }

    #[test]
    fn own_process_maps_have_this_binary_with_cfi() {
        let mut p = Processes::new(rootline_image::ModuleBudget::new());
        let pid = std::process::id();
        let here = own_process_maps_have_this_binary_with_cfi as fn() as usize as u64;
        let state = p.get(pid);
        let region = state.space.region(here).expect("test function is mapped");
        let module = region.module.as_ref().expect("test binary parses");
        assert!(module.eh_frame_covers(region.svma(here)));
    }
}

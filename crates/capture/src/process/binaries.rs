//! The binaries processes map, as the profiler opens and parses them: one [`BinaryFile`] per
//! distinct file, shared by every process that maps it, parsed on the loader thread when there is
//! one, held to the memory budget for modules, and forgotten once no process maps it.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};

use super::Processes;
use rootline_image::{ModuleBudget, ModuleError};

use crate::unwind::{CodeModule, Region};

/// A binary the profiler opened: the open file (kept so it stays readable after the target
/// unmaps or deletes it) and its parse, when it parsed.
#[derive(Debug)]
pub struct BinaryFile {
    /// Path as the target sees it.
    pub path: Arc<str>,
    /// The open file when it did not parse (a parsed module keeps its own).
    pub file: Option<File>,
    /// The parsed ELF, when the file is one.
    pub module: Option<Arc<CodeModule>>,
    /// Memory the module would need, when the budget for binaries refused to load it.
    pub refused: Option<usize>,
}

impl BinaryFile {
    /// The open file, for symbolization after the target is gone.
    pub fn open_file(&self) -> Option<&File> {
        self.module
            .as_ref()
            .and_then(|m| m.file())
            .or(self.file.as_ref())
    }

    /// The region `start..end` mapping this binary from `file_offset`: with its module, or marked
    /// refused when the budget for binaries refused it.
    pub fn region(&self, start: u64, end: u64, file_offset: u64) -> Region {
        Region::new(
            start,
            end,
            file_offset,
            self.path.clone(),
            self.module.clone(),
        )
        .refused(self.refused.is_some())
    }

    /// Whether the file could be opened.
    pub fn is_open(&self) -> bool {
        self.open_file().is_some()
    }

    /// A path through which this process can reopen the file (`/proc/self/fd/N`).
    pub fn reopen_path(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        self.open_file()
            .map(|f| PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
    }
}

/// Identity of a mapped file: device major, minor, inode and path.
pub type FileKey = (u32, u32, u64, Arc<str>);

pub(super) enum FileEntry {
    Ready(Arc<BinaryFile>),
    /// Being parsed; these `(pid, region start)` wait for it.
    Loading(Vec<(u32, u64)>),
}

/// A parse for the loader thread, and its answer.
pub(super) struct LoadRequest {
    pub(super) key: FileKey,
    pub(super) file: Option<File>,
    pub(super) budget: Option<usize>,
}

pub(super) struct Loaded {
    key: FileKey,
    binary: Arc<BinaryFile>,
}

/// The loader thread's channels and the number of parses it still owes.
pub(super) struct Loader {
    pub(super) requests: Sender<LoadRequest>,
    loaded: Receiver<Loaded>,
    pub(super) outstanding: usize,
}

impl Processes {
    /// No processes yet; binaries are parsed on a loader thread (see the module documentation)
    /// and counted in `modules`. Falls back to parsing on the calling thread if the thread
    /// cannot be started.
    pub fn with_loader(modules: ModuleBudget) -> Processes {
        let counted = modules.clone();
        let (requests, rx) = std::sync::mpsc::channel::<LoadRequest>();
        let (tx, loaded) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("rootline-loader".into())
            .spawn(move || {
                for LoadRequest { key, file, budget } in rx {
                    let binary = Arc::new(parse_binary(&key.3, file, &counted, budget));
                    if tx.send(Loaded { key, binary }).is_err() {
                        break;
                    }
                }
            });
        Processes {
            loader: spawned.is_ok().then_some(Loader {
                requests,
                loaded,
                outstanding: 0,
            }),
            modules,
            ..Processes::default()
        }
    }

    /// Parses still owed by the loader thread.
    pub fn loads_outstanding(&self) -> usize {
        self.loader.as_ref().map_or(0, |l| l.outstanding)
    }

    /// Installs every parse the loader has finished, without waiting. True if any arrived.
    pub fn poll_loaded(&mut self) -> bool {
        let mut any = false;
        while let Some(done) = self.loader.as_ref().and_then(|l| l.loaded.try_recv().ok()) {
            self.install(done);
            any = true;
        }
        any
    }

    /// Waits for the loader's next parse and installs it (and any others finished). False when
    /// nothing is outstanding (or the loader is gone).
    pub fn wait_loaded(&mut self) -> bool {
        if self.loads_outstanding() == 0 {
            return false;
        }
        let Some(done) = self.loader.as_ref().and_then(|l| l.loaded.recv().ok()) else {
            // The loader thread is gone: nothing more will come.
            self.loader = None;
            return false;
        };
        self.install(done);
        self.poll_loaded();
        true
    }

    /// Puts a parsed binary into every region waiting for it.
    fn install(&mut self, Loaded { key, binary }: Loaded) {
        if let Some(l) = self.loader.as_mut() {
            l.outstanding = l.outstanding.saturating_sub(1);
        }
        let waiting = match self.files.remove(&key) {
            Some(FileEntry::Loading(waiting)) => waiting,
            Some(ready) => {
                self.files.insert(key, ready);
                return;
            }
            None => Vec::new(),
        };
        self.installed.push(key.clone());
        // A file that could not be opened is tried again by the next process that maps it.
        if binary.is_open() {
            self.files
                .insert(key.clone(), FileEntry::Ready(binary.clone()));
        }
        for (pid, start) in waiting {
            let Some(state) = self.procs.get_mut(&pid) else {
                continue;
            };
            if state.pending.get(&start) != Some(&key) {
                continue; // replaced by a later mapping, or the process exec'd
            }
            state.pending.remove(&start);
            let Some(r) = state.space.region(start).filter(|r| r.start == start) else {
                continue;
            };
            let region = binary.region(start, r.end, r.file_offset);
            state.space.add_region(region);
            state.binaries.insert(start, binary.clone());
            self.installed_pids.push(pid);
        }
        self.recount_reclaimable();
    }

    /// Limits the memory all loaded modules may hold ([`ModuleBudget::live_bytes`]): a binary that would
    /// take it past `bytes` is not loaded, and frames in it end their stacks
    /// ([`crate::unwind::TruncateReason::ModuleMemoryLimit`]) until there is room.
    pub fn set_module_budget(&mut self, bytes: usize) {
        self.module_budget = Some(bytes);
    }

    /// The memory budget for modules, if any.
    pub fn module_budget(&self) -> Option<usize> {
        self.module_budget
    }

    /// Where the modules of these processes are counted.
    pub fn modules(&self) -> &ModuleBudget {
        &self.modules
    }

    /// Whether a binary some tracked process maps was refused for the module budget.
    fn refuses_any(&self) -> bool {
        self.procs
            .values()
            .any(|p| p.space.regions().any(|r| r.refused))
    }

    /// Tells the module budget how much of it no running process needs: binaries kept for
    /// processes to come, or mapped only by processes that exited (kept a while for their last
    /// samples). A binary a running process maps may take that room
    /// ([`ModuleBudget::set_reclaimable`]) instead of being refused; [`Processes::over_budget`]
    /// then says the caller is to let those go at once.
    pub fn recount_reclaimable(&mut self) {
        self.reclaimable_stale = false;
        if self.module_budget.is_none() {
            return;
        }
        let mut needed: foldhash::HashSet<*const BinaryFile> = foldhash::HashSet::default();
        for (&pid, p) in &self.procs {
            // A retired space (its key past any pid) holds samples still to be unwound.
            if !p.exited || pid >= 1 << 31 {
                needed.extend(p.binaries.values().map(Arc::as_ptr));
            }
        }
        let mut counted: foldhash::HashSet<*const BinaryFile> = foldhash::HashSet::default();
        let exited = self
            .procs
            .values()
            .filter(|p| p.exited)
            .flat_map(|p| p.binaries.values());
        let cached = self.files.values().filter_map(|e| match e {
            FileEntry::Ready(b) => Some(b),
            FileEntry::Loading(_) => None,
        });
        let mut bytes = 0;
        for b in exited.chain(cached) {
            let at = Arc::as_ptr(b);
            if !needed.contains(&at) && counted.insert(at) {
                bytes += b.module.as_ref().map_or(0, |m| m.heap_bytes());
            }
        }
        self.modules.set_reclaimable(bytes);
    }

    /// Recounts the reclaimable room if processes were removed since it was last counted.
    pub fn settle_reclaimable(&mut self) {
        if self.reclaimable_stale {
            self.recount_reclaimable();
        }
    }

    /// Whether the modules hold more than the budget: a load took the room of binaries no
    /// running process needs ([`Processes::recount_reclaimable`]), which are to go now (the
    /// exited processes forgotten, the files swept, the tables that name their frames started
    /// over).
    pub fn over_budget(&self) -> bool {
        self.module_budget
            .is_some_and(|budget| self.modules.live_bytes() > budget)
    }

    /// Memory of the modules tracked processes mapped at the last [`Processes::sweep_files`].
    pub fn module_bytes_in_use(&self) -> usize {
        self.module_bytes_in_use
    }

    pub(super) fn has_room_for(&self, needed: usize) -> bool {
        self.module_budget
            .is_none_or(|budget| self.modules.fits(needed, budget))
    }

    /// Under a module budget, once modules hold more than three quarters of it, or something
    /// was refused for it (here, or elsewhere when `refused_elsewhere`: a .NET image, a process's
    /// JIT tables): forgets the cached binaries no tracked process maps any more (their memory is
    /// freed once no recorded frame refers to them either) and measures the modules still in use.
    /// Binaries stay cached otherwise, so that processes started one after another (a build's
    /// compilers) share one parse. And wherever the budget now has room, drops the regions it
    /// refused so that the next read of the process's maps loads them. Returns whether something
    /// is refused (here or elsewhere).
    pub fn sweep_files(&mut self, refused_elsewhere: bool) -> bool {
        let Some(budget) = self.module_budget else {
            return refused_elsewhere;
        };
        let refused_any = self.refuses_any();
        let pressure =
            self.modules.live_bytes() > budget / 4 * 3 || refused_any || refused_elsewhere;
        if !pressure {
            return false;
        }
        let mut used: foldhash::HashSet<*const BinaryFile> = foldhash::HashSet::default();
        let mut in_use = 0;
        for p in self.procs.values() {
            for b in p.binaries.values() {
                if used.insert(Arc::as_ptr(b)) {
                    in_use += b.module.as_ref().map_or(0, |m| m.heap_bytes());
                }
            }
        }
        if pressure {
            self.files.retain(|_, entry| match entry {
                FileEntry::Loading(_) => true,
                FileEntry::Ready(b) => used.contains(&Arc::as_ptr(b)),
            });
        }
        self.module_bytes_in_use = in_use;
        self.recount_reclaimable();
        if !refused_any {
            return refused_elsewhere;
        }
        let modules = self.modules.clone();
        let room = |needed: usize| modules.fits(needed, budget);
        for state in self.procs.values_mut() {
            let retry: Vec<(u64, u64)> = state
                .space
                .regions()
                .filter(|r| r.refused)
                .filter(|r| {
                    state
                        .binaries
                        .get(&r.start)
                        .and_then(|b| b.refused)
                        .is_some_and(&room)
                })
                .map(|r| (r.start, r.end))
                .collect();
            for (start, end) in retry {
                state.space.remove_range(start, end);
                state.binaries.remove(&start);
                state.maps_read = false;
            }
        }
        true
    }
}

/// Stands in for a binary whose parse has not arrived (no module: not to be unwound through).
pub(super) fn placeholder(path: &Arc<str>) -> Arc<BinaryFile> {
    Arc::new(BinaryFile {
        path: path.clone(),
        file: None,
        module: None,
        refused: None,
    })
}

/// Opens a mapped binary: through `/proc/PID/map_files/START-END` (works for deleted or replaced
/// files), else `/proc/PID/root/PATH` (the target's mount namespace), else the path itself.
pub(super) fn open_file(pid: u32, start: u64, end: u64, path: &str) -> Option<File> {
    let candidates = [
        format!("/proc/{pid}/map_files/{start:x}-{end:x}"),
        format!("/proc/{pid}/root{}", path.trim_end_matches(" (deleted)")),
        path.to_string(),
    ];
    candidates.iter().find_map(|c| File::open(c).ok())
}

/// Where the layouts of large binaries are kept between recordings (named once).
fn layout_cache_dir() -> Option<&'static std::path::Path> {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| crate::cache_dir::cache_dir("layouts"))
        .as_deref()
}

/// Parses an opened binary (the slow part: runs on the loader thread when there is one). The
/// module keeps the file; a file that is not ELF, or that the `budget` for binaries refuses, is
/// kept as it is.
pub(super) fn parse_binary(
    path: &Arc<str>,
    file: Option<File>,
    modules: &ModuleBudget,
    budget: Option<usize>,
) -> BinaryFile {
    let Some(file) = file else {
        return BinaryFile {
            path: path.clone(),
            file: None,
            module: None,
            refused: None,
        };
    };
    // The parse needs its own handle; the original is kept if it fails.
    let parsed = file
        .try_clone()
        .map(|f| CodeModule::open_cached(path, f, modules, budget, layout_cache_dir()));
    let (module, refused) = match parsed {
        Ok(Ok(m)) => (Some(Arc::new(m)), None),
        Ok(Err(ModuleError::OverBudget { needed, .. })) => (None, Some(needed)),
        _ => (None, None),
    };
    BinaryFile {
        path: path.clone(),
        file: module.is_none().then_some(file),
        module,
        refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_binaries_load_once_the_budget_has_room() {
        let mut p = Processes::new(rootline_image::ModuleBudget::new());
        p.set_module_budget(0);
        let pid = std::process::id();
        let here = refused_binaries_load_once_the_budget_has_room as fn() as usize as u64;
        let region = p
            .get(pid)
            .space
            .region(here)
            .expect("test function is mapped");
        assert!(region.refused && region.module.is_none());
        // Still no room: the sweep keeps the refusal.
        let _ = p.sweep_files(false);
        assert!(p.get(pid).space.region(here).is_some_and(|r| r.refused));
        p.set_module_budget(usize::MAX);
        let _ = p.sweep_files(false);
        let region = p.get(pid).space.region(here).expect("mapped again");
        assert!(!region.refused);
        let module = region.module.as_ref().expect("loaded now");
        assert!(module.eh_frame_covers(region.svma(here)));
    }

    #[test]
    fn binaries_only_exited_processes_map_are_reclaimable() {
        let modules = rootline_image::ModuleBudget::new();
        let mut p = Processes::new(modules.clone());
        p.set_module_budget(usize::MAX);
        let pid = std::process::id();
        let child = pid + 1_000_000;
        p.get(pid);
        p.fork(child, pid);
        let held = modules.live_bytes();
        assert!(held > 0, "this test's binaries are loaded");
        p.recount_reclaimable();
        assert_eq!(modules.reclaimable(), 0, "both processes run");
        p.exited(pid);
        assert_eq!(
            modules.reclaimable(),
            0,
            "the child still maps every binary"
        );
        p.exited(child);
        let reclaimable = modules.reclaimable();
        assert!(
            reclaimable > 0 && reclaimable <= held,
            "{reclaimable} of {held} bytes reclaimable once both exited"
        );
        // A budget the modules already fill has room for the binaries of running processes
        // only in what exited ones hold, and is then over-committed until they go.
        // (The code page cache all modules share has its room set aside.)
        let full = held + rootline_image::PAGE_CACHE_BYTES;
        p.set_module_budget(full);
        assert!(!p.over_budget());
        assert!(p.has_room_for(reclaimable / 2));
        modules.set_reclaimable(0);
        assert!(!p.has_room_for(reclaimable / 2));
        p.recount_reclaimable();
        p.set_module_budget(held / 2);
        assert!(p.over_budget());
        p.remove(pid);
        p.remove(child);
        p.settle_reclaimable();
        assert!(
            modules.reclaimable() <= reclaimable,
            "forgotten processes' binaries are no longer counted as theirs"
        );
    }

    #[test]
    fn loader_thread_parses_off_the_caller_and_fills_pending_regions() {
        let mut p = Processes::with_loader(rootline_image::ModuleBudget::new());
        let pid = std::process::id();
        let here =
            loader_thread_parses_off_the_caller_and_fills_pending_regions as fn() as usize as u64;
        p.get(pid);
        // Right after the maps are read, this binary's parse is still owed: its region is
        // pending and carries no unwind tables.
        assert!(p.loads_outstanding() > 0);
        assert!(p.is_pending(pid, here));
        assert!(p.has_pending(pid));
        // A forked child waits for the same parse.
        p.fork(pid + 1_000_000, pid);
        assert!(p.is_pending(pid + 1_000_000, here));
        while p.wait_loaded() {}
        assert_eq!(p.loads_outstanding(), 0);
        for pid in [pid, pid + 1_000_000] {
            assert!(!p.has_pending(pid));
            let state = p.get(pid);
            let region = state.space.region(here).expect("test function is mapped");
            let module = region.module.as_ref().expect("parsed on the loader thread");
            assert!(module.eh_frame_covers(region.svma(here)));
        }
    }
}

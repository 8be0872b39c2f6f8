//! Processes as the profiler tracks them: executable mappings from `/proc/PID/maps` and from
//! MMAP2 records, names from COMM, address spaces copied on FORK and reset on exec. Binaries are
//! opened through `/proc/PID/map_files` (deleted or replaced files) or `/proc/PID/root`
//! (containers) and parsed once per distinct file.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use crate::unwind::{AddressSpace, CodeModule, Region};

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

/// A binary the profiler opened: the open file (kept so it stays readable after the target
/// unmaps or deletes it) and its parse, when it parsed.
#[derive(Debug)]
pub struct BinaryFile {
    /// Path as the target sees it.
    pub path: Arc<str>,
    /// The open file, for symbolization after the target is gone.
    pub file: Option<File>,
    /// The parsed ELF, when the file is one.
    pub module: Option<Arc<CodeModule>>,
}

impl BinaryFile {
    /// A path through which this process can reopen the file (`/proc/self/fd/N`).
    pub fn reopen_path(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        self.file
            .as_ref()
            .map(|f| PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
    }
}

/// The state of one tracked process.
pub struct ProcessState {
    /// Executable regions with unwind data.
    pub space: AddressSpace,
    /// Binaries of each region, by region start.
    pub binaries: HashMap<u64, Arc<BinaryFile>>,
    /// Whether `/proc/PID/maps` has been read since the last exec.
    pub maps_read: bool,
}

/// All tracked processes and the binaries they share.
#[derive(Default)]
pub struct Processes {
    procs: HashMap<u32, ProcessState>,
    files: HashMap<(u32, u32, u64, Arc<str>), Arc<BinaryFile>>,
    vdso: Option<Arc<BinaryFile>>,
}

fn is_pseudo(path: &str) -> bool {
    path.is_empty()
        || path.starts_with('[')
        || path.starts_with("//anon")
        || path.starts_with("/memfd:")
}

impl Processes {
    /// No processes yet.
    pub fn new() -> Processes {
        Processes::default()
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
                self.add_region(
                    &mut state, pid, e.start, e.end, e.offset, e.file_key, &e.path,
                );
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
        self.add_region(
            &mut state,
            pid,
            start,
            start.saturating_add(len),
            offset,
            key,
            path,
        );
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
        child.maps_read = true;
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

    #[allow(clippy::too_many_arguments)]
    fn add_region(
        &mut self,
        state: &mut ProcessState,
        pid: u32,
        start: u64,
        end: u64,
        offset: u64,
        key: (u32, u32, u64),
        path: &str,
    ) {
        let binary = if path == "[vdso]" {
            self.vdso(pid, start, end)
        } else if is_pseudo(path) {
            Arc::new(BinaryFile {
                path: path.into(),
                file: None,
                module: None,
            })
        } else {
            let path: Arc<str> = path.into();
            let cache_key = (key.0, key.1, key.2, path.clone());
            match self.files.get(&cache_key) {
                Some(b) => b.clone(),
                None => {
                    let b = Arc::new(open_binary(pid, start, end, &path));
                    self.files.insert(cache_key, b.clone());
                    b
                }
            }
        };
        let region = Region::new(
            start,
            end,
            offset,
            binary.path.clone(),
            binary.module.clone(),
        );
        state.space.add_region(region);
        state.binaries.insert(start, binary);
    }

    fn vdso(&mut self, pid: u32, start: u64, end: u64) -> Arc<BinaryFile> {
        if let Some(v) = &self.vdso {
            return v.clone();
        }
        // The vDSO is the same image in every process of this kernel: read it once from memory.
        let bytes = read_process_memory(pid, start, (end - start) as usize);
        let module = bytes.and_then(|b| CodeModule::parse("[vdso]", b.into()).ok().map(Arc::new));
        let v = Arc::new(BinaryFile {
            path: "[vdso]".into(),
            file: None,
            module,
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
        binaries: HashMap::new(),
        maps_read: false,
    }
}

/// Opens a mapped binary: through `/proc/PID/map_files/START-END` (works for deleted or replaced
/// files), else `/proc/PID/root/PATH` (the target's mount namespace), else the path itself.
fn open_binary(pid: u32, start: u64, end: u64, path: &Arc<str>) -> BinaryFile {
    let candidates = [
        format!("/proc/{pid}/map_files/{start:x}-{end:x}"),
        format!("/proc/{pid}/root{}", path.trim_end_matches(" (deleted)")),
        path.to_string(),
    ];
    for c in candidates {
        let Ok(mut file) = File::open(&c) else {
            continue;
        };
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            continue;
        }
        let module = CodeModule::parse(path, bytes.into()).ok().map(Arc::new);
        return BinaryFile {
            path: path.clone(),
            file: Some(file),
            module,
        };
    }
    BinaryFile {
        path: path.clone(),
        file: None,
        module: None,
    }
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
        let mut p = Processes::new();
        let pid = std::process::id();
        let here = own_process_maps_have_this_binary_with_cfi as fn() as usize as u64;
        let state = p.get(pid);
        let region = state.space.region(here).expect("test function is mapped");
        let module = region.module.as_ref().expect("test binary parses");
        assert!(module.eh_frame_covers(region.svma(here)));
    }
}

//! Attaching allocation recording to a target: the sampler library written out and preloaded
//! into a launched command, with a uprobe on its sampled-allocation function; uprobes on the libc
//! allocation functions of a `-p` process, filtered by the BPF sampler ([`super::alloc_bpf`]).

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use foldhash::{HashMap as FastMap, HashMapExt};
use object::{Object, ObjectSegment, ObjectSymbol};
use rootline_profile::pseudo::NATIVE_ALLOC_FUNCTIONS;

use super::alloc::{AllocKind, AllocSource, SHIM_NAME};
use super::alloc_bpf::KernelSampler;
use super::options::{RecordError, RecordOptions, Target};
use crate::perf_event::{EventConfig, EventTarget, OpenError, PerfEvent, UprobeSite};

/// Bytes kept at the alignment the ELF reader needs for its headers.
#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

/// The sampler library for launched commands.
static SHIM_FILE: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("OUT_DIR"),
    "/librootline_alloc.so"
)));
const SHIM: &[u8] = &SHIM_FILE.0;
/// The function the library calls for each sampled allocation.
const MARKER: &str = "rootline_alloc_sampled";

/// The file offset of the defined symbol `name` in the ELF `data`.
fn symbol_file_offset(data: &[u8], name: &str) -> Option<u64> {
    let file = object::File::parse(data).ok()?;
    let address = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.name() == Ok(name) && !s.is_undefined())?
        .address();
    file.segments().find_map(|seg| {
        let (offset, size) = seg.file_range();
        (address >= seg.address() && address < seg.address() + size)
            .then(|| address - seg.address() + offset)
    })
}

/// The sampler library written out for a launched command (removed when dropped).
pub(crate) struct Shim {
    _dir: tempfile::TempDir,
    /// Its path, for `LD_PRELOAD`.
    pub path: PathBuf,
    /// The uprobe site of its sampled-allocation function.
    pub site: UprobeSite,
}

impl Shim {
    /// Writes the library into a private temporary directory.
    pub fn write() -> io::Result<Shim> {
        use std::os::unix::fs::PermissionsExt;
        let offset = symbol_file_offset(SHIM, MARKER)
            .ok_or_else(|| io::Error::other(format!("{MARKER} is missing from {SHIM_NAME}")))?;
        let dir = tempfile::Builder::new()
            .prefix("rootline-alloc-")
            .tempdir()?;
        let path = dir.path().join(SHIM_NAME);
        std::fs::write(&path, SHIM)?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(Shim {
            _dir: dir,
            site: UprobeSite {
                path: path.clone(),
                offset,
            },
            path,
        })
    }

    /// The `LD_PRELOAD` value that loads the library before any already asked for.
    pub fn preload(&self) -> std::ffi::OsString {
        let mut value = self.path.clone().into_os_string();
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            value.push(":");
            value.push(old);
        }
        value
    }
}

/// A probed libc function: its file offset, what it is, and its address in the process.
type LibcFunction = (u64, AllocKind, u64);

/// The probe sites of one process's libc.
pub(crate) struct LibcSites {
    /// The uprobe site of each allocation function.
    pub sites: Vec<UprobeSite>,
    /// `(file offset, kind, address in the process)` of each, to tell their samples apart.
    pub kinds: Vec<LibcFunction>,
    /// The addresses of libc's code in the process, `[start, end)`.
    pub text: Option<(u64, u64)>,
}

/// The allocation functions of the libc process `pid` runs: their uprobe sites (through
/// `/proc/PID/root`, so a process in another mount namespace is probed in its own file), what
/// each is, and where libc's code lies.
pub(crate) fn libc_sites(pid: u32) -> io::Result<LibcSites> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            let name = p.rsplit('/').next().unwrap_or(p);
            name.starts_with("libc.so") || (name.starts_with("libc-") && name.ends_with(".so"))
        })
        .ok_or_else(|| io::Error::other(format!("process {pid} has no libc mapped")))?;
    let path = Path::new(&format!("/proc/{pid}/root")).join(libc.trim_start_matches('/'));
    let data = std::fs::read(&path)?;
    let mut sites = Vec::new();
    let mut kinds = Vec::new();
    for (i, name) in NATIVE_ALLOC_FUNCTIONS.iter().enumerate() {
        let Some(offset) = symbol_file_offset(&data, name) else {
            continue;
        };
        // Aliases share an address: one probe each.
        if kinds.iter().any(|&(o, _, _)| o == offset) {
            continue;
        }
        let Some(address) = address_of(&maps, libc, offset) else {
            continue;
        };
        let Some(kind) = AllocKind::nth(i) else {
            continue;
        };
        kinds.push((offset, kind, address));
        sites.push(UprobeSite {
            path: path.clone(),
            offset,
        });
    }
    if sites.is_empty() {
        return Err(io::Error::other(format!(
            "{libc} of process {pid} exports no allocation function"
        )));
    }
    Ok(LibcSites {
        sites,
        kinds,
        text: text_range(&maps, libc),
    })
}

/// The lowest and highest addresses of the executable mappings of `path`, per the `maps` text.
fn text_range(maps: &str, path: &str) -> Option<(u64, u64)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            if fields.nth(3)? != path || !perms.contains('x') {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            ))
        })
        .reduce(|(s0, e0), (s1, e1)| (s0.min(s1), e0.max(e1)))
}

/// The address at which file offset `offset` of `path` is mapped, per the `maps` text.
fn address_of(maps: &str, path: &str, offset: u64) -> Option<u64> {
    maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let range = fields.next()?;
        let perms = fields.next()?;
        let pgoff = u64::from_str_radix(fields.next()?, 16).ok()?;
        if fields.nth(2)? != path || !perms.contains('x') {
            return None;
        }
        let (start, end) = range.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        (offset >= pgoff && offset - pgoff < end - start).then(|| start + offset - pgoff)
    })
}

/// Opens one uprobe event per site and CPU, for thread `tid` or (None) for every task on the
/// CPU; the events of CPU `cpus[i]` write into the ring of `events[i]`, created by the first site
/// when `events` is empty.
///
/// The events never inherit: the kernel creates an inherited uprobe event by reading its file's
/// path again from the opener's pointer, in the new thread's address space, and the thread's
/// creation fails with `EFAULT`.
pub(crate) fn open_alloc_events(
    tid: Option<u32>,
    cfg: &EventConfig,
    cpus: &[u32],
    events: &mut Vec<PerfEvent>,
    sites: &[UprobeSite],
) -> Result<(), OpenError> {
    // Allocations come in bursts (a program filling a table): rings four times the CPU
    // sampling's, so a burst waits for the reader instead of being lost.
    // No callchain: the kernel frames would be the uprobe handler's own, and the user stack is
    // unwound from the copy; asking for the kernel's callchain cost several µs per sample.
    let cfg = &EventConfig {
        ring_pages: (cfg.ring_pages * 4).clamp(64, 8192),
        kernel: false,
        user_callchain: 0,
        ..*cfg
    };
    let pmu = crate::perf_event::uprobe_pmu_type().map_err(|e| {
        OpenError::Other(io::Error::other(format!(
            "this kernel has no uprobe PMU (/sys/bus/event_source/devices/uprobe): {e}"
        )))
    })?;
    let mut opened: Vec<PerfEvent> = Vec::with_capacity(cpus.len() * sites.len());
    for site in sites {
        for (i, &cpu) in cpus.iter().enumerate() {
            let target = match tid {
                Some(tid) => EventTarget::Thread {
                    tid,
                    cpu,
                    inherit: false,
                    enable_on_exec: false,
                },
                None => EventTarget::Cpu(cpu),
            };
            let output = events.get(i).or(opened.get(i));
            let e = PerfEvent::open_uprobe(target, cfg, output, pmu, site)?;
            opened.push(e);
        }
    }
    events.extend(opened);
    Ok(())
}

/// Attaching allocation recording to a recording's target: the sampler library for a launched
/// command, uprobes on libc for `-p`; inert when allocations are not recorded.
pub(crate) struct Attach {
    rate: Option<u64>,
    /// The smallest anonymous mmap counted.
    mmap_min: u64,
    /// Kept (and its file) until the recording ends.
    shim: Option<Shim>,
    source: Option<AllocSource>,
    /// The BPF sampler for `-p` (None before the first process, or when it could not load).
    kernel: Option<KernelSampler>,
    /// Whether loading the BPF sampler was tried.
    kernel_tried: bool,
    /// What the user should know about how allocations are sampled, one line each.
    pub notes: Vec<String>,
    /// The `-p` processes probed: their sites, functions and the threads with events.
    probed: Vec<Probed>,
    /// The event layout and CPUs of the `-p` events, for threads found later.
    layout: Option<(EventConfig, Vec<u32>)>,
}

/// A `-p` process whose libc is probed.
struct Probed {
    pid: u32,
    sites: Vec<UprobeSite>,
    kinds: Vec<LibcFunction>,
    tids: std::collections::HashSet<u32>,
}

impl Attach {
    /// Writes the sampler library out when `opts` launch a command with allocations recorded.
    pub fn new(opts: &RecordOptions) -> Result<Attach, RecordError> {
        let shim = match (&opts.target, opts.alloc_rate) {
            (Target::Command(_), Some(_)) => Some(Shim::write().map_err(|e| {
                RecordError::Open(OpenError::Other(io::Error::other(format!(
                    "cannot write the allocation sampler library to the temporary directory: {e}"
                ))))
            })?),
            _ => None,
        };
        Ok(Attach {
            rate: opts.alloc_rate.map(|r| r.max(1)),
            mmap_min: opts.alloc_mmap_min,
            shim,
            source: None,
            kernel: None,
            kernel_tried: false,
            notes: Vec::new(),
            probed: Vec::new(),
            layout: None,
        })
    }

    /// The environment of a launched command: `base`, plus the sampler library and its rate.
    pub fn launch_env(&self, base: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
        let mut env = base.to_vec();
        if let (Some(shim), Some(rate)) = (&self.shim, self.rate) {
            env.push(("LD_PRELOAD".into(), shim.preload()));
            env.push(("ROOTLINE_ALLOC_RATE".into(), rate.to_string().into()));
            env.push((
                "ROOTLINE_ALLOC_MMAP_MIN".into(),
                self.mmap_min.to_string().into(),
            ));
        }
        env
    }

    /// Opens the sampler library's uprobe for the launched command `pid` (enabled at its exec).
    pub fn open_command(
        &mut self,
        pid: u32,
        cfg: &EventConfig,
        cpus: &[u32],
        events: &mut Vec<PerfEvent>,
    ) -> Result<(), OpenError> {
        let Some(shim) = &self.shim else {
            return Ok(());
        };
        let site = std::slice::from_ref(&shim.site);
        // The library is a private file only the command and its descendants map: probed on
        // every CPU, its samples come from all their threads, however they start. Without the
        // right to watch whole CPUs, the command's first thread only.
        let first = events.len();
        match open_alloc_events(None, cfg, cpus, events, site) {
            Ok(()) => {}
            Err(OpenError::Permission { .. }) => {
                events.truncate(first);
                open_alloc_events(Some(pid), cfg, cpus, events, site)?;
                self.notes.push(
                    "allocations are sampled on the command's first thread only (watching every \
                     CPU for the sampler library needs kernel.perf_event_paranoid <= 0 or \
                     CAP_PERFMON)"
                        .into(),
                );
            }
            Err(e) => return Err(e),
        }
        for e in &events[first..] {
            e.enable().map_err(OpenError::Other)?;
        }
        self.source = Some(AllocSource::Shim);
        Ok(())
    }

    /// Opens uprobes on the allocation functions of the libc of process `pid`, for each of its
    /// threads (threads it starts later are not followed: see [`open_alloc_events`]).
    pub fn open_pid(
        &mut self,
        pid: u32,
        cfg: &EventConfig,
        cpus: &[u32],
        events: &mut Vec<PerfEvent>,
    ) -> Result<(), RecordError> {
        let Some(rate) = self.rate else {
            return Ok(());
        };
        if !self.kernel_tried {
            self.kernel_tried = true;
            match KernelSampler::load(rate, self.mmap_min) {
                Ok(k) => self.kernel = Some(k),
                Err(e) => self.notes.push(format!(
                    "allocations are sampled in user space, every call trapping ({e})"
                )),
            }
        }
        let LibcSites { sites, kinds, text } = libc_sites(pid).map_err(|e| {
            RecordError::Open(OpenError::Other(io::Error::other(format!(
                "allocations of process {pid} cannot be probed: {e}"
            ))))
        })?;
        let tids = crate::process::thread_ids(pid).map_err(|_| RecordError::TargetGone(pid))?;
        if let Some(kernel) = self.kernel.as_mut() {
            let told = text
                .ok_or_else(|| "its libc's code was not found in its maps".to_string())
                .and_then(|(start, end)| kernel.set_libc_text(pid, start, end));
            if let Err(e) = told {
                self.kernel = None;
                self.notes.push(format!(
                    "allocations are sampled in user space, every call trapping (the BPF \
                     sampler cannot tell process {pid}'s own mmaps from malloc's: {e})"
                ));
            }
        }
        let mut probed = Probed {
            pid,
            sites,
            kinds: kinds.clone(),
            tids: Default::default(),
        };
        for tid in tids {
            let first = events.len();
            match open_alloc_events(Some(tid), cfg, cpus, events, &probed.sites) {
                Ok(()) => {
                    self.attach_kernel(tid, cpus, &events[first..], &kinds);
                    probed.tids.insert(tid);
                }
                Err(OpenError::NoSuchThread(_)) => {}
                Err(OpenError::Permission { paranoid }) => {
                    return Err(RecordError::Permission(OpenError::Permission { paranoid }));
                }
                Err(e) => return Err(RecordError::Open(e)),
            }
        }
        self.probed.push(probed);
        self.layout = Some((*cfg, cpus.to_vec()));
        if !matches!(self.source, Some(AllocSource::Libc { .. })) {
            self.source = Some(AllocSource::Libc {
                sites: Vec::new(),
                addresses: FastMap::new(),
                mmap_min: self.mmap_min,
                kernel_decides: false,
            });
        }
        if let Some(AllocSource::Libc {
            sites, addresses, ..
        }) = &mut self.source
        {
            for (offset, kind, address) in kinds {
                if !sites.contains(&(offset, kind)) {
                    sites.push((offset, kind));
                }
                addresses.insert(address, kind);
            }
        }
        Ok(())
    }

    /// Opens (enabled) the uprobe events of the threads the `-p` processes started since the
    /// last call. A thread is found a moment after it starts: allocations in that moment are
    /// missed.
    pub fn follow_new_threads(&mut self) -> Vec<PerfEvent> {
        let mut opened = Vec::new();
        let Some((cfg, cpus)) = self.layout.clone() else {
            return opened;
        };
        let mut probed = std::mem::take(&mut self.probed);
        for p in &mut probed {
            let Ok(tids) = crate::process::thread_ids(p.pid) else {
                continue;
            };
            for tid in tids {
                if !p.tids.insert(tid) {
                    continue;
                }
                let mut events = Vec::new();
                if open_alloc_events(Some(tid), &cfg, &cpus, &mut events, &p.sites).is_err() {
                    continue; // it exited already
                }
                self.attach_kernel(tid, &cpus, &events, &p.kinds);
                for e in events {
                    if e.enable().is_ok() {
                        opened.push(e);
                    }
                }
            }
            // Forget the threads that exited.
            if let Ok(live) = crate::process::thread_ids(p.pid) {
                p.tids.retain(|t| live.contains(t));
            }
        }
        self.probed = probed;
        opened
    }

    /// Attaches the BPF sampler to `opened`, thread `tid`'s events (site-major, one per CPU of
    /// `cpus`, sites as in `kinds`); on failure, detaches it everywhere and says so.
    fn attach_kernel(
        &mut self,
        tid: u32,
        cpus: &[u32],
        opened: &[PerfEvent],
        kinds: &[LibcFunction],
    ) {
        let Some(kernel) = self.kernel.as_mut() else {
            return;
        };
        for (j, event) in opened.iter().enumerate() {
            let (site, cpu) = (j / cpus.len(), cpus[j % cpus.len()]);
            let cookie = u64::from(cpu) << 32 | u64::from(tid);
            if let Err(e) = kernel.attach(event, kinds[site].1, cookie) {
                self.kernel = None;
                self.notes.push(format!(
                    "allocations are sampled in user space, every call trapping (the BPF \
                     sampler could not attach to a uprobe: {e})"
                ));
                return;
            }
        }
    }

    /// Notes the rate and how samples are taken in the profile's metadata.
    pub fn describe(&self, extra: &mut std::collections::BTreeMap<String, String>) {
        let Some(rate) = self.rate else {
            return;
        };
        extra.insert("alloc.rate_bytes".into(), rate.to_string());
        let how = match self.source {
            Some(AllocSource::Shim) => "preload",
            Some(AllocSource::Libc { .. }) if self.kernel.is_some() => "uprobe-bpf",
            Some(AllocSource::Libc { .. }) => "uprobe-every-call",
            None => "none",
        };
        extra.insert("alloc.attach".into(), how.into());
    }

    /// Where the pipeline's allocation samples come from, and the rate.
    pub fn take_source(&mut self) -> Option<(AllocSource, u64)> {
        let mut source = self.source.take()?;
        if let AllocSource::Libc { kernel_decides, .. } = &mut source {
            *kernel_decides = self.kernel.is_some();
        }
        Some((source, self.rate?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_s_code_is_its_executable_mappings() {
        let maps = "\
55d0a000-55d0b000 r--p 00000000 08:01 10 /usr/bin/prog
7f10000000-7f10028000 r--p 00000000 08:01 20 /usr/lib/x86_64-linux-gnu/libc.so.6
7f10028000-7f1019d000 r-xp 00028000 08:01 20 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1019d000-7f101f5000 r--p 0019d000 08:01 20 /usr/lib/x86_64-linux-gnu/libc.so.6
7f20000000-7f20001000 r-xp 00000000 08:01 30 /usr/lib/x86_64-linux-gnu/libm.so.6
";
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        assert_eq!(
            text_range(maps, libc),
            Some((0x007f_1002_8000, 0x007f_1019_d000))
        );
        assert_eq!(text_range(maps, "/usr/lib/libnone.so"), None);
        assert_eq!(address_of(maps, libc, 0x29000), Some(0x007f_1002_9000));
    }

    #[test]
    fn the_library_s_marker_is_found_in_its_file() {
        let offset = symbol_file_offset(SHIM, MARKER).unwrap();
        assert!(offset > 0 && (offset as usize) < SHIM.len());
        assert_eq!(
            AllocKind::from_shim(1).unwrap().frame_name(),
            "[alloc: malloc]"
        );
        assert_eq!(
            AllocKind::from_shim(9).unwrap().frame_name(),
            "[alloc: mmap]"
        );
        assert_eq!(AllocKind::from_shim(10), None);
        assert_eq!(AllocKind::from_shim(0), None);
    }
}

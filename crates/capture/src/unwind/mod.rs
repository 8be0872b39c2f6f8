//! The unwinder: from a sample's registers and stack bytes to a list of code addresses.
//!
//! Pure: it is fed the address space ([`AddressSpace`], built from mappings and parsed
//! [`CodeModule`]s) and memory through the [`Memory`] trait, so the same code runs on live samples
//! and in unit tests. CFI from `.eh_frame` and `.debug_frame` is executed by framehop (both are
//! consulted, per address, whichever has an FDE covering it); code without CFI goes through
//! [`instr`]'s leaf and frame-pointer analysis. Every step is validated (stack pointer strictly
//! increasing, return address right after a call in an executable mapping); a failed step ends
//! the stack with a [`TruncateReason`] from [`policy`].

pub mod instr;
pub mod live_memory;
pub mod module;
pub mod policy;

use std::collections::BTreeMap;
use std::sync::Arc;

use framehop::Unwinder as _;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};

pub use instr::NoCfiRule;
pub use live_memory::LiveMemory;
pub use module::{CodeModule, ModuleError, SectionBytes};
pub use policy::{ReadFailure, StackEnd, TruncateReason};

/// Memory of the sampled thread, as the unwinder may read it.
pub trait Memory {
    /// Reads the 8-byte little-endian word at `addr` on the stack.
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure>;
    /// Reads code bytes at `addr` for regions without a file image (JIT). False when unavailable.
    fn read_code(&mut self, _addr: u64, _buf: &mut [u8]) -> bool {
        false
    }
    /// Address range of the JIT function containing `addr` (code without a file image), from
    /// the runtime's perf map or jitdump, when known.
    fn jit_function(&mut self, _addr: u64) -> Option<std::ops::Range<u64>> {
        None
    }
    /// The rule for a frame at `lookup` in JIT code (`leaf`: the sampled instruction; else a
    /// return address minus one): None when `lookup` is in no known JIT function, `Some(None)`
    /// when its state cannot be decided. Implementations may cache it.
    fn jit_rule(&mut self, lookup: u64, leaf: bool) -> Option<Option<NoCfiRule>> {
        let function = self.jit_function(lookup)?;
        Some(crate::jit::frame_state::rule_in_memory(
            function, lookup, leaf, self,
        ))
    }
    /// Whether `ra` lies in JIT code that returns to addresses it pushed itself (so a return
    /// address there need not follow a call instruction).
    fn jit_pushed_return(&mut self, _ra: u64) -> bool {
        false
    }
    /// How many stack bytes the sample carries, when it carries a copy.
    fn copied_len(&self) -> Option<usize> {
        None
    }
}

/// A live reader of process memory, used past the end of a sample's copied stack (and for code
/// without a file image). The seam for continuing an unwind beyond the copy.
pub trait MemoryReader {
    /// Fills `buf` from address `addr`; false when the memory cannot be read.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool;
    /// Why the last failed [`MemoryReader::read`] failed (None: plain unreadable memory).
    fn failure(&self) -> Option<ReadFailure> {
        None
    }
}

/// The stack bytes a sample carries (copied from its stack pointer upwards), plus an optional
/// live fallback for addresses past the copy.
pub struct SampleStack<'a> {
    /// Address of `bytes[0]` (the sampled stack pointer).
    pub base: u64,
    /// The copied bytes.
    pub bytes: &'a [u8],
    /// Reader for memory the copy does not hold.
    pub fallback: Option<&'a mut dyn MemoryReader>,
}

impl Memory for SampleStack<'_> {
    fn read_stack_u64(&mut self, addr: u64) -> Result<u64, ReadFailure> {
        if addr >= self.base {
            let off = addr - self.base;
            if let Some(word) = usize::try_from(off)
                .ok()
                .and_then(|o| self.bytes.get(o..o.checked_add(8)?))
            {
                return Ok(u64::from_le_bytes(word.try_into().unwrap_or([0; 8])));
            }
        }
        let mut buf = [0u8; 8];
        match self.fallback.as_mut().map(|r| r.read(addr, &mut buf)) {
            Some(true) => Ok(u64::from_le_bytes(buf)),
            Some(false) => Err(self
                .fallback
                .as_ref()
                .and_then(|r| r.failure())
                .unwrap_or(ReadFailure::Unreadable)),
            None if addr >= self.base => Err(ReadFailure::BeyondCopy),
            None => Err(ReadFailure::Unreadable),
        }
    }

    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        self.fallback.as_mut().is_some_and(|r| r.read(addr, buf))
    }

    fn copied_len(&self) -> Option<usize> {
        Some(self.bytes.len())
    }
}

/// An executable region of an address space.
#[derive(Debug, Clone)]
pub struct Region {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset mapped at `start`.
    pub file_offset: u64,
    /// Path of the backing file, or a pseudo name (`[anon]`, `[vdso]`, …).
    pub path: Arc<str>,
    /// The parsed file, when the region is file-backed and the file could be read.
    pub module: Option<Arc<CodeModule>>,
    /// Runtime address minus link-time address (0 when there is no module).
    pub bias: u64,
}

impl Region {
    /// A region; computes the load bias from the module's segments.
    pub fn new(
        start: u64,
        end: u64,
        file_offset: u64,
        path: Arc<str>,
        module: Option<Arc<CodeModule>>,
    ) -> Region {
        let bias = module
            .as_ref()
            .and_then(|m| m.svma_of_file_offset(file_offset))
            .map_or(0, |svma| start.wrapping_sub(svma));
        Region {
            start,
            end,
            file_offset,
            path,
            module,
            bias,
        }
    }

    /// The link-time address of runtime address `addr`.
    pub fn svma(&self, addr: u64) -> u64 {
        addr.wrapping_sub(self.bias)
    }
}

/// The executable regions of one process, with their unwind data loaded into framehop.
pub struct AddressSpace {
    regions: BTreeMap<u64, Region>,
    eh: UnwinderX86_64<SectionBytes>,
    debug: UnwinderX86_64<SectionBytes>,
    eh_cache: CacheX86_64,
    debug_cache: CacheX86_64,
}

impl Default for AddressSpace {
    fn default() -> Self {
        AddressSpace {
            regions: BTreeMap::new(),
            eh: UnwinderX86_64::new(),
            debug: UnwinderX86_64::new(),
            eh_cache: CacheX86_64::new(),
            debug_cache: CacheX86_64::new(),
        }
    }
}

impl AddressSpace {
    /// An empty address space.
    pub fn new() -> AddressSpace {
        AddressSpace::default()
    }

    /// Adds an executable region, replacing any regions it overlaps.
    pub fn add_region(&mut self, region: Region) {
        self.remove_range(region.start, region.end);
        if let Some(m) = &region.module {
            let (eh, debug) = m.fde_counts();
            let range = region.start..region.end;
            if eh > 0 {
                self.eh.add_module(framehop::Module::new(
                    m.name().to_string(),
                    range.clone(),
                    region.bias,
                    m.section_info(false),
                ));
            }
            if debug > 0 {
                self.debug.add_module(framehop::Module::new(
                    m.name().to_string(),
                    range,
                    region.bias,
                    m.section_info(true),
                ));
            }
        }
        self.regions.insert(region.start, region);
    }

    /// Removes every region overlapping `start..end` (an `munmap` or a replacing `mmap`).
    pub fn remove_range(&mut self, start: u64, end: u64) {
        let overlapping: Vec<u64> = self
            .regions
            .range(..end)
            .rev()
            .take_while(|(_, r)| r.end > start)
            .map(|(&s, _)| s)
            .collect();
        for s in overlapping {
            self.regions.remove(&s);
            self.eh.remove_module(s);
            self.debug.remove_module(s);
        }
    }

    /// The region containing `addr`.
    pub fn region(&self, addr: u64) -> Option<&Region> {
        let (_, r) = self.regions.range(..=addr).next_back()?;
        (addr < r.end).then_some(r)
    }

    /// All regions in address order.
    pub fn regions(&self) -> impl Iterator<Item = &Region> {
        self.regions.values()
    }

    /// Unwinds one sample. `out` receives the instruction pointer followed by each return
    /// address, leaf first; the result says whether the stack reached its root.
    pub fn unwind(
        &mut self,
        ip: u64,
        sp: u64,
        bp: u64,
        mem: &mut dyn Memory,
        out: &mut Vec<u64>,
    ) -> StackEnd {
        self.unwind_with_sps(ip, sp, bp, mem, out, None)
    }

    /// [`AddressSpace::unwind`], also filling `sps` (when given) with each frame's stack pointer,
    /// parallel to `out`: a return address `out[i]` (i > 0) was read just below `sps[i]`.
    pub fn unwind_with_sps(
        &mut self,
        ip: u64,
        sp: u64,
        bp: u64,
        mem: &mut dyn Memory,
        out: &mut Vec<u64>,
        mut sps: Option<&mut Vec<u64>>,
    ) -> StackEnd {
        out.clear();
        out.push(ip);
        if let Some(sps) = sps.as_mut() {
            sps.clear();
            sps.push(sp);
        }
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut first = true;
        loop {
            let pc = regs.ip();
            let lookup = if first { pc } else { pc.wrapping_sub(1) };
            let old_sp = regs.sp();
            let step = match self.step(first, lookup, &mut regs, mem) {
                Ok(step) => step,
                Err(_) if first && self.at_thread_entry(pc) => return StackEnd::Root,
                Err(TruncateReason::StackCopyExhausted) if mem.copied_len() == Some(0) => {
                    return StackEnd::Truncated(TruncateReason::StackNotCopied);
                }
                Err(reason) => return StackEnd::Truncated(reason),
            };
            let Some(ra) = step else {
                return StackEnd::Root;
            };
            if regs.sp() <= old_sp {
                return StackEnd::Truncated(TruncateReason::SpNotIncreasing);
            }
            if let Err(reason) = self.check_return_address(ra, mem) {
                return StackEnd::Truncated(reason);
            }
            out.push(ra);
            if let Some(sps) = sps.as_mut() {
                sps.push(regs.sp());
            }
            regs.set_ip(ra);
            first = false;
        }
    }

    /// One step: the caller's return address (None at the root), with `regs` moved to the caller.
    fn step(
        &mut self,
        first: bool,
        lookup: u64,
        regs: &mut UnwindRegsX86_64,
        mem: &mut dyn Memory,
    ) -> Result<Option<u64>, TruncateReason> {
        let region = self.region(lookup).ok_or(TruncateReason::UnmappedAddress)?;
        let svma = region.svma(lookup);
        let cfi = match &region.module {
            Some(m) if m.eh_frame_covers(svma) => Some(false),
            Some(m) if m.debug_frame_covers(svma) => Some(true),
            _ => None,
        };
        let Some(use_debug) = cfi else {
            let rule = no_cfi_rule(region, first, lookup, mem)?;
            return exec_no_cfi(rule, regs, mem);
        };
        let address = if first {
            framehop::FrameAddress::from_instruction_pointer(regs.ip())
        } else {
            framehop::FrameAddress::from_return_address(regs.ip())
                .ok_or(TruncateReason::CfiError)?
        };
        let mut read_failure = None;
        let mut read = |addr: u64| {
            mem.read_stack_u64(addr).map_err(|e| {
                read_failure = Some(e);
            })
        };
        let result = if use_debug {
            self.debug
                .unwind_frame(address, regs, &mut self.debug_cache, &mut read)
        } else {
            self.eh
                .unwind_frame(address, regs, &mut self.eh_cache, &mut read)
        };
        result.map_err(|e| TruncateReason::from_framehop(e, read_failure))
    }

    /// Whether `pc` lies in a function that starts threads (see [`policy::is_thread_entry`]).
    fn at_thread_entry(&self, pc: u64) -> bool {
        self.region(pc).is_some_and(|r| {
            r.module
                .as_ref()
                .and_then(|m| m.symbol_name(r.svma(pc)))
                .is_some_and(policy::is_thread_entry)
        })
    }

    /// Validates a recovered return address: inside an executable region, right after a call.
    fn check_return_address(&self, ra: u64, mem: &mut dyn Memory) -> Result<(), TruncateReason> {
        let region = self
            .region(ra.wrapping_sub(1))
            .ok_or(TruncateReason::NotAfterCall)?;
        if region.module.is_none() && mem.jit_pushed_return(ra) {
            return Ok(());
        }
        let mut buf = [0u8; 8];
        let before = code_before(region, ra, &mut buf, mem);
        match before {
            Some(bytes) if instr::is_after_call(bytes) => Ok(()),
            Some(_) => Err(TruncateReason::NotAfterCall),
            // Code we cannot see (anonymous memory without a reader): the executable mapping is
            // all that can be checked.
            None => Ok(()),
        }
    }
}

/// Up to 8 code bytes ending at `addr`.
fn code_before<'b>(
    region: &Region,
    addr: u64,
    buf: &'b mut [u8; 8],
    mem: &mut dyn Memory,
) -> Option<&'b [u8]> {
    let start = addr.saturating_sub(8).max(region.start);
    let len = usize::try_from(addr - start).ok()?;
    match &region.module {
        Some(m) => {
            let bytes = m.code(region.svma(start), len)?;
            buf[..bytes.len()].copy_from_slice(bytes);
            Some(&buf[..bytes.len()])
        }
        None => mem.read_code(start, &mut buf[..len]).then_some(&buf[..len]),
    }
}

/// Decides the rule for a frame in code without CFI (see [`instr`]).
fn no_cfi_rule(
    region: &Region,
    first: bool,
    lookup: u64,
    mem: &mut dyn Memory,
) -> Result<NoCfiRule, TruncateReason> {
    const WINDOW: usize = 4096;
    let mut at_ip_buf = [0u8; 16];
    let mut prev_buf = [0u8; 2];
    type Analysis<'c> = (&'c [u8], [Option<u8>; 2], Option<(&'c [u8], usize)>);
    let (at_ip, prev, function): Analysis<'_> = match &region.module {
        Some(m) => {
            let svma = region.svma(lookup);
            let at_ip = m.code(svma, 16).unwrap_or(&[]);
            let byte = |a: u64| m.code(a, 1).and_then(|b| b.first().copied());
            let prev = [byte(svma.wrapping_sub(2)), byte(svma.wrapping_sub(1))];
            let function = m.function_start(svma).and_then(|start| {
                let offset = usize::try_from(svma - start).ok().filter(|&o| o < WINDOW)?;
                let code = m.code(start, offset + 16)?;
                Some((code, offset))
            });
            (at_ip, prev, function)
        }
        None => {
            if let Some(rule) = mem.jit_rule(lookup, first) {
                return rule.ok_or(TruncateReason::NoUnwindInfo);
            }
            let at_ip: &[u8] = if mem.read_code(lookup, &mut at_ip_buf) {
                &at_ip_buf
            } else {
                &[]
            };
            let prev = if mem.read_code(lookup.wrapping_sub(2), &mut prev_buf) {
                [Some(prev_buf[0]), Some(prev_buf[1])]
            } else {
                [None; 2]
            };
            (at_ip, prev, None)
        }
    };
    let rule = if first {
        instr::leaf_rule(at_ip, prev, function)
    } else {
        instr::caller_rule(function.map(|(code, _)| code))
    };
    // Code in a file without CFI whose prologue is not at its start (e.g. V8's embedded
    // builtins in node): simulate the prologue as for JIT code.
    let rule = rule.or_else(|| {
        let (code, offset) = function?;
        if first {
            let m = region.module.as_ref()?;
            let at = m.code(region.svma(lookup), 384)?;
            crate::jit::frame_state::leaf_rule(code, offset, at)
        } else {
            crate::jit::frame_state::caller_rule(code, offset + 1)
        }
    });
    rule.ok_or(TruncateReason::NoUnwindInfo)
}

/// Executes a no-CFI rule on `regs`.
fn exec_no_cfi(
    rule: NoCfiRule,
    regs: &mut UnwindRegsX86_64,
    mem: &mut dyn Memory,
) -> Result<Option<u64>, TruncateReason> {
    let sp = regs.sp();
    let bp = regs.bp();
    let read = |mem: &mut dyn Memory, addr: u64| {
        mem.read_stack_u64(addr).map_err(TruncateReason::from_read)
    };
    let (ra, new_sp, new_bp) = match rule {
        NoCfiRule::ReturnAtSp => (read(mem, sp)?, sp.checked_add(8), bp),
        NoCfiRule::ReturnAtSpPlus8 => (read(mem, sp.wrapping_add(8))?, sp.checked_add(16), bp),
        NoCfiRule::FramePointer => {
            if bp == 0 {
                return Ok(None);
            }
            if bp < sp || !bp.is_multiple_of(8) {
                return Err(TruncateReason::BadFramePointer);
            }
            let ra = read(mem, bp.wrapping_add(8))?;
            (ra, bp.checked_add(16), read(mem, bp)?)
        }
        NoCfiRule::ReturnAt { ra, saved_bp } => {
            let new_bp = match saved_bp {
                Some(o) => read(mem, sp.wrapping_add(u64::from(o)))?,
                None => bp,
            };
            let ra_at = sp.wrapping_add(u64::from(ra));
            (read(mem, ra_at)?, ra_at.checked_add(8), new_bp)
        }
    };
    let new_sp = new_sp.ok_or(TruncateReason::BadFramePointer)?;
    if ra == 0 {
        return Ok(None);
    }
    regs.set_sp(new_sp);
    regs.set_bp(new_bp);
    Ok(Some(ra))
}

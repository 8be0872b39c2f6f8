//! The address space and the step function: from a sample's registers and stack bytes to a list
//! of code addresses.
//!
//! An [`AddressSpace`] holds a process's executable [`Region`]s, each with its [`Binary`] when it
//! is file-backed. CFI from `.eh_frame` and `.debug_frame` (both are consulted, per address,
//! whichever has an FDE covering it) is run as a [`FrameRule`] remembered per lookup address
//! while its rows need only rip, rsp and rbp, and by the full-register evaluator
//! ([`crate::full`]) otherwise; code without CFI goes through the instruction analysis
//! ([`crate::nocfi`]). Every step is validated (stack pointer
//! strictly increasing, return address right after a call in an executable mapping); a failed
//! step ends the stack with a [`TruncateReason`] from [`crate::policy`].

use std::collections::BTreeMap;

use foldhash::HashMap;

use crate::binary::Binary;
use crate::fde_rules::FdeRuleCache;
use crate::frame_rule::{FrameRule, RuleFailure};
use crate::full;
use crate::memory::{FrameObserver, Memory, NoObserver};
use crate::nocfi;
use crate::policy::{StackEnd, TruncateReason};
use crate::region::Region;
use crate::regs::{self, Registers};
use crate::x86_64::instruction_analysis::{
    DEOPTIMIZATION_HANDLER_BYTES, NoCfiRule, is_after_call, is_deoptimization_handler,
};

/// The executable regions of one process, and what was found at the addresses unwound.
pub struct AddressSpace<M> {
    regions: BTreeMap<u64, Region<M>>,
    evaluator: full::Evaluator,
    /// Return addresses in a binary's code already checked, by address: the check reads the
    /// code before each one from the file, and the same call sites recur in every sample.
    /// Cleared when the regions change, and past [`MAX_RETURN_CHECKS`].
    return_checks: HashMap<u64, Result<ReturnKind, TruncateReason>>,
    /// Which CFI covers each lookup address met, found by binary searches over a binary's
    /// FDEs (hundreds of thousands in a compiler), with its row's [`FrameRule`]: cleared with
    /// `return_checks`, and past [`MAX_CFI_LOOKUPS`].
    cfi_at: HashMap<u64, CfiAt>,
    /// The frame rules of every row of the FDEs `cfi_at`'s lookups met: a new address in a
    /// function met before is found without parsing its FDE again. Cleared with `cfi_at`.
    fde_rules: FdeRuleCache,
    full_register_unwinds: u64,
    /// Indices into the last unwind's output of frames whose address is an instruction, not a
    /// return address (see [`AddressSpace::instruction_frames`]).
    instruction_frames: Vec<usize>,
    /// The frame just unwound was an out-of-line prologue that has not built its caller's frame
    /// yet ([`NoCfiRule::OutOfLinePrologue`]): the caller has pushed nothing.
    caller_at_entry: bool,
    /// The frame just unwound returns into V8's interpreter re-entry
    /// ([`crate::policy::is_interpreter_reentry`]): its caller is an interpreter frame.
    resumes_interpreter: bool,
}

/// Most return addresses an [`AddressSpace`] remembers as checked (a few hundred KiB: rustc's
/// hot call sites fit).
const MAX_RETURN_CHECKS: usize = 1 << 14;

/// Most lookup addresses an [`AddressSpace`] remembers the covering CFI of (as many as the
/// return checks: the same call sites, plus the leaves).
const MAX_CFI_LOOKUPS: usize = 1 << 14;

/// The CFI covering a lookup address in a binary's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CfiAt {
    /// No FDE covers it.
    None,
    /// An FDE of `.debug_frame` (`debug`) or `.eh_frame`; `rule`: its row as a [`FrameRule`]
    /// (None: the row needs registers the fast walk does not track, or could not be read).
    Fde {
        debug: bool,
        rule: Option<FrameRule>,
    },
}

/// What a validated return address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReturnKind {
    /// It follows a call (or lies in code that cannot be read).
    AfterCall,
    /// A signal trampoline's entry (where a handler returns), symbolized as an instruction.
    SignalTrampoline,
    /// A V8 interpreter re-entry builtin's entry, symbolized as an instruction.
    InterpreterReentry,
    /// A HotSpot deoptimization handler in the compiled method whose frame this is
    /// ([`is_deoptimization_handler`]): the frame is unwound as at a call.
    DeoptimizationHandler,
}

impl<M> Default for AddressSpace<M> {
    fn default() -> Self {
        AddressSpace {
            regions: BTreeMap::new(),
            evaluator: full::Evaluator::default(),
            return_checks: HashMap::default(),
            cfi_at: HashMap::default(),
            fde_rules: FdeRuleCache::default(),
            full_register_unwinds: 0,
            instruction_frames: Vec::new(),
            caller_at_entry: false,
            resumes_interpreter: false,
        }
    }
}

/// Why a walk stopped before deciding how the stack ends.
enum Stop {
    /// The stack ends here, for this reason.
    Truncated(TruncateReason),
    /// A frame needs registers the fast walk does not track: walk again from the leaf with all
    /// registers.
    NeedsFullRegisters,
}

impl From<TruncateReason> for Stop {
    fn from(reason: TruncateReason) -> Stop {
        Stop::Truncated(reason)
    }
}

/// [`cfi_at`] for runtime address `lookup` (link-time `svma` in `module`), remembered in `cache`.
fn remembered_cfi_at<B: Binary + ?Sized>(
    cache: &mut HashMap<u64, CfiAt>,
    evaluator: &mut full::Evaluator,
    fde_rules: &mut FdeRuleCache,
    lookup: u64,
    module: &B,
    svma: u64,
) -> CfiAt {
    if let Some(&at) = cache.get(&lookup) {
        return at;
    }
    let at = cfi_at(module.unwind_sections(), evaluator, fde_rules, lookup, svma);
    if cache.len() >= MAX_CFI_LOOKUPS {
        cache.clear();
    }
    cache.insert(lookup, at);
    at
}

/// Which CFI covers link-time address `svma` (runtime `lookup`; `.eh_frame` first), and its
/// row's frame rule, from the rules of its FDE's rows (`fde_rules`). None for a row that needs
/// registers the fast walk does not track (one [`crate::cfi::CfiIndex::row_class`] calls
/// [`crate::cfi::RowClass::FullRegisters`]), in a signal trampoline, or where the rows cannot
/// be read.
fn cfi_at(
    sections: &crate::sections::UnwindSections,
    evaluator: &mut full::Evaluator,
    fde_rules: &mut FdeRuleCache,
    lookup: u64,
    svma: u64,
) -> CfiAt {
    let (debug, fde_start) = match sections.cfi(false).fde_start_at(svma) {
        Some(start) => (false, start),
        None => match sections.cfi(true).fde_start_at(svma) {
            Some(start) => (true, start),
            None => return CfiAt::None,
        },
    };
    let rule = if sections.cfi(debug).is_signal_trampoline(svma) {
        None
    } else {
        let at = full::RowAt {
            sections,
            debug,
            svma,
        };
        fde_rules.rule(evaluator, at, fde_start, lookup)
    };
    CfiAt::Fde { debug, rule }
}

fn region_in<M>(regions: &BTreeMap<u64, Region<M>>, addr: u64) -> Option<&Region<M>> {
    let (_, r) = regions.range(..=addr).next_back()?;
    (addr < r.end).then_some(r)
}

impl<M: Binary> AddressSpace<M> {
    /// An empty address space.
    pub fn new() -> AddressSpace<M> {
        AddressSpace::default()
    }

    /// Adds an executable region, replacing any regions it overlaps.
    pub fn add_region(&mut self, region: Region<M>) {
        self.remove_range(region.start, region.end);
        self.forget_lookups();
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
            self.forget_lookups();
        }
    }

    /// Forgets what was found at addresses (the regions change).
    fn forget_lookups(&mut self) {
        self.return_checks.clear();
        self.cfi_at.clear();
        self.fde_rules.clear();
    }

    /// The region containing `addr`.
    pub fn region(&self, addr: u64) -> Option<&Region<M>> {
        region_in(&self.regions, addr)
    }

    /// All regions in address order.
    pub fn regions(&self) -> impl Iterator<Item = &Region<M>> {
        self.regions.values()
    }

    /// How many samples so far needed the full-register walk (a frame whose CFI uses registers
    /// other than rip/rsp/rbp, or a zero frame pointer or return address the CFI does not call
    /// a root).
    pub fn full_register_unwinds(&self) -> u64 {
        self.full_register_unwinds
    }

    /// Indices `i > 0` of the last unwind's output whose address is to be symbolized as it is,
    /// not as a return address (whose call lies just before it): the instruction a signal
    /// interrupted, and the signal trampoline a handler returns into.
    pub fn instruction_frames(&self) -> &[usize] {
        &self.instruction_frames
    }

    /// Unwinds one sample from its instruction, stack and frame pointers only (any other
    /// register a frame's CFI needs is unknown). `out` receives the instruction pointer followed
    /// by each return address, leaf first; the result says whether the stack reached its root.
    pub fn unwind(
        &mut self,
        ip: u64,
        sp: u64,
        bp: u64,
        mem: &mut dyn Memory,
        out: &mut Vec<u64>,
    ) -> StackEnd {
        self.unwind_with_sps(&Registers::new(ip, sp, bp), mem, out, None)
    }

    /// Unwinds one sample from its registers, also filling `sps` (when given) with each frame's
    /// stack pointer, parallel to `out`: a return address `out[i]` (i > 0) was read just below
    /// `sps[i]`.
    ///
    /// Frames are unwound by their [`FrameRule`]s while their CFI needs only rip, rsp and rbp;
    /// a frame that needs more (or a zero return address the CFI does not call a root)
    /// restarts the walk from the leaf with every register tracked (see [`full`]).
    pub fn unwind_with_sps(
        &mut self,
        regs: &Registers,
        mem: &mut dyn Memory,
        out: &mut Vec<u64>,
        sps: Option<&mut Vec<u64>>,
    ) -> StackEnd {
        self.unwind_observed(regs, mem, &mut NoObserver, out, sps)
    }

    /// [`AddressSpace::unwind_with_sps`], telling `observer` each recovered caller frame's
    /// complete state; the observer may stop the walk there ([`StackEnd::Stopped`]).
    pub fn unwind_observed(
        &mut self,
        regs: &Registers,
        mem: &mut dyn Memory,
        observer: &mut dyn FrameObserver,
        out: &mut Vec<u64>,
        mut sps: Option<&mut Vec<u64>>,
    ) -> StackEnd {
        if let Some(end) = self.walk(false, *regs, mem, observer, out, sps.as_deref_mut()) {
            return end;
        }
        self.full_register_unwinds += 1;
        self.walk(true, *regs, mem, observer, out, sps)
            .unwrap_or(StackEnd::Truncated(TruncateReason::CfiError))
    }

    /// One walk from the leaf; None when it needs all registers and `full` is off.
    pub(crate) fn walk(
        &mut self,
        full: bool,
        mut regs: Registers,
        mem: &mut dyn Memory,
        observer: &mut dyn FrameObserver,
        out: &mut Vec<u64>,
        mut sps: Option<&mut Vec<u64>>,
    ) -> Option<StackEnd> {
        out.clear();
        out.push(regs.ip());
        self.instruction_frames.clear();
        self.caller_at_entry = false;
        self.resumes_interpreter = false;
        if let Some(sps) = sps.as_mut() {
            sps.clear();
            sps.push(regs.sp());
        }
        // `first`: the frame's pc is the instruction that was executing (the sampled one, or one
        // a signal interrupted), not a return address.
        let mut first = true;
        loop {
            let pc = regs.ip();
            let mut lookup = if first { pc } else { pc.wrapping_sub(1) };
            if out.len() == 1
                && !self.in_signal_trampoline(pc)
                && self.in_signal_trampoline(pc.wrapping_sub(1))
            {
                // Sampled inside `rt_sigreturn`: the pc follows the trampoline's last instruction
                // (the system call), past the end of its FDE.
                lookup = pc.wrapping_sub(1);
            }
            if out.len() == 1 {
                match self.clone_gap(&regs) {
                    Some(CloneGap::Child) => return Some(StackEnd::Root),
                    Some(CloneGap::Parent { cfi_end }) => lookup = cfi_end - 1,
                    None => {}
                }
            }
            let old_sp = regs.sp();
            let step = match self.step(full, first, lookup, &mut regs, mem) {
                Ok(step) => step,
                Err(Stop::NeedsFullRegisters) => return None,
                Err(_) if first && self.at_thread_entry(pc) => return Some(StackEnd::Root),
                Err(Stop::Truncated(TruncateReason::StackCopyExhausted))
                    if mem.copied_len() == Some(0) =>
                {
                    return Some(StackEnd::Truncated(TruncateReason::StackNotCopied));
                }
                Err(Stop::Truncated(reason)) => return Some(StackEnd::Truncated(reason)),
            };
            let Some((ra, in_signal_trampoline)) = step else {
                return Some(StackEnd::Root);
            };
            // Each caller's frame lies above its callee's. Only the executing frame may share
            // its caller's stack pointer: one whose return address is in a register (glibc's
            // `__vfork` pops it into rdi around the system call), which cannot repeat.
            let same_sp_leaf = first && ra != pc && regs.sp() == old_sp;
            if regs.sp() <= old_sp && !same_sp_leaf {
                return Some(StackEnd::Truncated(TruncateReason::SpNotIncreasing));
            }
            // A signal trampoline's caller is the interrupted instruction, which need not follow
            // a call; it must still lie in executable code.
            let mut checked = if in_signal_trampoline {
                self.region(ra)
                    .map(|_| ReturnKind::SignalTrampoline)
                    .ok_or(TruncateReason::UnmappedAddress)
            } else {
                self.checked_return_address(ra, mem)
            };
            // A handler entered in place of an instruction it interrupted (HotSpot's safepoint
            // handler) returns to that instruction, which follows no call, as a signal frame
            // does (a return poll's handler returns to a real call's return address). Asked
            // only where the return address is no plain one.
            let interrupted = !in_signal_trampoline
                && !matches!(checked, Ok(ReturnKind::AfterCall))
                && mem.jit_interrupt_handler(lookup);
            if interrupted {
                checked = self
                    .region(ra)
                    .map(|_| ReturnKind::SignalTrampoline)
                    .ok_or(TruncateReason::UnmappedAddress);
            }
            match checked {
                Ok(ReturnKind::SignalTrampoline) => self.instruction_frames.push(out.len()),
                Ok(ReturnKind::InterpreterReentry) => {
                    self.instruction_frames.push(out.len());
                    self.resumes_interpreter = true;
                }
                Ok(ReturnKind::AfterCall | ReturnKind::DeoptimizationHandler) => {}
                Err(reason) => return Some(StackEnd::Truncated(reason)),
            }
            out.push(ra);
            if let Some(sps) = sps.as_mut() {
                sps.push(regs.sp());
            }
            first = in_signal_trampoline || interrupted;
            if !observer.on_frame(out.len() - 1, &regs, full) {
                return Some(StackEnd::Stopped);
            }
        }
    }

    /// One step: the caller's return address (None at the root), with `regs` moved to the
    /// caller, and whether the frame was a signal trampoline (so the caller was interrupted).
    fn step(
        &mut self,
        full: bool,
        first: bool,
        lookup: u64,
        regs: &mut Registers,
        mem: &mut dyn Memory,
    ) -> Result<Option<(u64, bool)>, Stop> {
        let caller_at_entry = std::mem::take(&mut self.caller_at_entry);
        if std::mem::take(&mut self.resumes_interpreter) {
            let frame = nocfi::Frame {
                rule: NoCfiRule::FramePointer,
                may_end: false,
            };
            return Ok(nocfi::exec(frame, regs, mem)?.map(|ra| (ra, false)));
        }
        let region = region_in(&self.regions, lookup).ok_or(TruncateReason::UnmappedAddress)?;
        let svma = region.svma(lookup);
        let cfi = region.module.as_deref().map(|m| {
            let at = remembered_cfi_at(
                &mut self.cfi_at,
                &mut self.evaluator,
                &mut self.fde_rules,
                lookup,
                m,
                svma,
            );
            (m, at)
        });
        let Some((module, CfiAt::Fde { debug, rule })) = cfi else {
            if region.refused {
                return Err(TruncateReason::ModuleMemoryLimit.into());
            }
            let frame = if caller_at_entry {
                // Stopped at the call that begins its code, before the callee built its frame.
                nocfi::Frame {
                    rule: NoCfiRule::ReturnAtSp,
                    may_end: false,
                }
            } else {
                nocfi::frame(region, first, lookup, mem)?
            };
            self.caller_at_entry = matches!(frame.rule, NoCfiRule::OutOfLinePrologue { .. });
            return Ok(nocfi::exec(frame, regs, mem)?.map(|ra| (ra, false)));
        };
        let sections = module.unwind_sections();
        let at = full::RowAt {
            sections,
            debug,
            svma,
        };
        if full {
            let signal = sections.cfi(debug).is_signal_trampoline(svma);
            let ra = self.evaluator.step(at, first, regs, mem)?;
            return Ok(ra.map(|ra| (ra, signal)));
        }
        // The fast walk: a row that needs more than rip, rsp and rbp sends the sample to the
        // full walk.
        let rule = rule.ok_or(Stop::NeedsFullRegisters)?;
        match rule.exec(first, regs, mem) {
            Ok(ra) => Ok(ra.map(|ra| (ra, false))),
            Err(RuleFailure::Truncated(reason)) => Err(reason.into()),
            Err(RuleFailure::NeedsFullRegisters) => Err(Stop::NeedsFullRegisters),
        }
    }

    /// Whether the CFI covering `lookup` is a signal trampoline's (see
    /// [`crate::cfi::CfiIndex::is_signal_trampoline`]).
    fn in_signal_trampoline(&self, lookup: u64) -> bool {
        self.region(lookup)
            .is_some_and(|r| signal_trampoline_at(r, lookup))
    }

    /// Whether `pc` lies in a function that starts threads (see [`crate::policy::is_thread_entry`]).
    fn at_thread_entry(&self, pc: u64) -> bool {
        self.region(pc).is_some_and(|r| {
            r.module
                .as_ref()
                .is_some_and(|m| m.in_thread_entry(r.svma(pc)))
        })
    }

    /// Whether the sampled pc lies between `clone`/`clone3`'s system call and the child's
    /// `thread_start` ([`crate::cfi::CfiIndex::clone_gap`]), and on whose side: the system call
    /// returned 0 to the child, whose fresh stack is empty, and the child's id (or an error) to
    /// the parent; during the call, rax reads as -ENOSYS. (`clone3` is not among libc's exported
    /// symbols, so names cannot say where it is.)
    fn clone_gap(&mut self, regs: &Registers) -> Option<CloneGap> {
        let rax = regs.get(regs::RAX)?;
        let pc = regs.ip();
        let region = region_in(&self.regions, pc)?;
        let module = region.module.as_deref()?;
        let svma = region.svma(pc);
        if remembered_cfi_at(
            &mut self.cfi_at,
            &mut self.evaluator,
            &mut self.fde_rules,
            pc,
            module,
            svma,
        ) != CfiAt::None
        {
            // Covered by CFI: no gap (the leaf's step finds this again, remembered).
            return None;
        }
        let sections = module.unwind_sections();
        let cfi_end = sections.clone_gap(svma)?;
        Some(if rax == 0 {
            CloneGap::Child
        } else {
            CloneGap::Parent {
                cfi_end: pc - (svma - cfi_end),
            }
        })
    }

    /// [`AddressSpace::check_return_address`], remembered for return addresses in a binary's
    /// code (JIT code changes under the same address).
    fn checked_return_address(
        &mut self,
        ra: u64,
        mem: &mut dyn Memory,
    ) -> Result<ReturnKind, TruncateReason> {
        if let Some(&checked) = self.return_checks.get(&ra) {
            return checked;
        }
        let region = self.region(ra.wrapping_sub(1));
        let in_binary = region.is_some_and(|r| r.module.is_some());
        let checked = self.check_return_address(region, ra, mem);
        if in_binary {
            if self.return_checks.len() >= MAX_RETURN_CHECKS {
                self.return_checks.clear();
            }
            self.return_checks.insert(ra, checked);
        }
        checked
    }

    /// Validates a recovered return address: inside an executable region (`region`, the one
    /// holding `ra - 1`), right after a call, or one of the few entries frames return into by
    /// design (see [`ReturnKind`]).
    fn check_return_address(
        &self,
        region: Option<&Region<M>>,
        ra: u64,
        mem: &mut dyn Memory,
    ) -> Result<ReturnKind, TruncateReason> {
        let region = region.ok_or(TruncateReason::NotAfterCall)?;
        if region.module.is_none() && mem.jit_interpreter(ra) {
            return Ok(ReturnKind::AfterCall);
        }
        // A signal handler returns into the signal trampoline, which the kernel pushed as its
        // return address (the trampoline's FDE starts a byte early so `ra - 1` finds it).
        if signal_trampoline_at(region, ra.wrapping_sub(1)) {
            return Ok(ReturnKind::SignalTrampoline);
        }
        let mut buf = [0u8; 8];
        let before = code_before(region, ra, &mut buf, mem);
        match before {
            Some(bytes) if is_after_call(bytes) => Ok(ReturnKind::AfterCall),
            // A frame V8's deoptimizer materialized: its callee returns into the interpreter,
            // at the very entry of a builtin named for it (the same mapping: the builtins are
            // laid out back to back).
            Some(_)
                if self.region(ra).is_some_and(|r| {
                    r.module
                        .as_ref()
                        .is_some_and(|m| m.is_interpreter_reentry(r.svma(ra)))
                }) =>
            {
                Ok(ReturnKind::InterpreterReentry)
            }
            // A compiled JVM frame being deoptimized: its return address was redirected to the
            // handler that hands the frame to the deoptimizer (JIT code: no file image).
            Some(_) if region.module.is_none() && deoptimization_handler_at(ra, mem) => {
                Ok(ReturnKind::DeoptimizationHandler)
            }
            Some(_) => Err(TruncateReason::NotAfterCall),
            // Code we cannot see (anonymous memory without a reader): the executable mapping is
            // all that can be checked.
            None => Ok(ReturnKind::AfterCall),
        }
    }
}

/// A leaf in the CFI gap of `clone`/`clone3` (see [`AddressSpace::clone_gap`]).
enum CloneGap {
    /// The new thread, before its first frame: the stack's root.
    Child,
    /// The calling thread, whose frame the CFI ending at `cfi_end` (a runtime address)
    /// describes.
    Parent { cfi_end: u64 },
}

/// Whether `addr` (in `region`) lies in a signal trampoline's FDE.
fn signal_trampoline_at<M: Binary>(region: &Region<M>, addr: u64) -> bool {
    region.module.as_ref().is_some_and(|m| {
        let svma = region.svma(addr);
        let sections = m.unwind_sections();
        sections.cfi(false).is_signal_trampoline(svma)
            || sections.cfi(true).is_signal_trampoline(svma)
    })
}

/// Whether JIT code at `addr` is a HotSpot deoptimization handler (see
/// [`is_deoptimization_handler`]).
fn deoptimization_handler_at(addr: u64, mem: &mut dyn Memory) -> bool {
    let mut code = [0u8; DEOPTIMIZATION_HANDLER_BYTES];
    mem.read_code(addr, &mut code) && is_deoptimization_handler(addr, &code)
}

/// Up to 8 code bytes ending at `addr`.
fn code_before<'b, M: Binary>(
    region: &Region<M>,
    addr: u64,
    buf: &'b mut [u8; 8],
    mem: &mut dyn Memory,
) -> Option<&'b [u8]> {
    let start = addr.saturating_sub(8).max(region.start);
    let len = usize::try_from(addr - start).ok()?;
    match &region.module {
        Some(m) => m.code(region.svma(start), &mut buf[..len]),
        None => mem.read_code(start, &mut buf[..len]).then_some(&buf[..len]),
    }
}

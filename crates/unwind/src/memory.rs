//! How the unwinder reads the sampled thread's memory: the [`Memory`] trait, and
//! [`SampleStack`], the stack bytes a sample carries with an optional live reader past them.

use crate::policy::ReadFailure;
use crate::regs::Registers;
use crate::x86_64::instruction_analysis::{NoCfiRule, jit};

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
        Some(jit::rule_in_memory(function, lookup, leaf, self))
    }
    /// The Tier-0 frame under a .NET On-Stack-Replacement method, from `ret`, the return address
    /// its return-address slot holds (see [`NoCfiRule::Osr`]): the offsets of the real return
    /// address and of the saved caller's `rbp` above the slot's end. None when `ret` is not after
    /// a call in JIT code with a fixed frame-pointer frame.
    fn osr_tier0_frame(&mut self, ret: u64) -> Option<(u32, u32)> {
        let function = self.jit_function(ret.checked_sub(1)?)?;
        jit::tier0_frame_in_memory(function, ret, self)
    }
    /// Whether `addr` lies in a handler entered in place of an interrupted instruction, which it
    /// keeps as its frame's return address (HotSpot's `SafepointBlob`, run when compiled code
    /// stops at a safepoint poll): such a return address follows no call, and the frame above is
    /// stopped at that instruction.
    fn jit_interrupt_handler(&mut self, _addr: u64) -> bool {
        false
    }
    /// Whether `addr` lies in HotSpot's template interpreter, whose frames keep their caller's
    /// stack pointer (see [`NoCfiRule::InterpreterFrame`]), and which returns to addresses it
    /// pushed itself (so a return address there need not follow a call instruction).
    fn jit_interpreter(&mut self, _addr: u64) -> bool {
        false
    }
    /// Whether `addr` lies in code without a file image the unwinder reads (JIT code, a .NET
    /// ReadyToRun image) whose tables were not loaded for the module memory budget: the bounds
    /// of its functions are unknown, so its frames cannot be unwound exactly.
    fn code_refused(&mut self, _addr: u64) -> bool {
        false
    }
    /// Whether `addr`, in code without a file image and without a name, belongs to a
    /// runtime that names all its compiled code (a JVM asked for its perf map): the name is only
    /// late, so the frame's state is not guessed from byte patterns (which can skip a caller in
    /// a frame that keeps no frame pointer yet), and the stack ends here until the runtime
    /// answers.
    fn jit_code_unnamed(&mut self, _addr: u64) -> bool {
        false
    }
    /// How many stack bytes the sample carries, when it carries a copy.
    fn copied_len(&self) -> Option<usize> {
        None
    }
}

/// Watches an unwind frame by frame; passed to [`crate::AddressSpace::unwind_observed`].
pub trait FrameObserver {
    /// Called each time the unwinder has recovered a caller frame (index `index` of the
    /// output, after it was added) with its complete state: the frame's registers and whether
    /// the walk tracks every register (`full`). The rest of the stack depends only on that state
    /// and the memory read from there on. False stops the unwind with
    /// [`crate::StackEnd::Stopped`] (the caller knows the rest). A walk that restarts from the
    /// leaf calls it again from index 1.
    fn on_frame(&mut self, index: usize, regs: &Registers, full: bool) -> bool;
}

/// The observer of an unwind nobody watches: every frame goes on.
pub struct NoObserver;

impl FrameObserver for NoObserver {
    fn on_frame(&mut self, _index: usize, _regs: &Registers, _full: bool) -> bool {
        true
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
        // Below the sampled stack pointer lies no frame's memory: only a slot an epilogue has
        // already popped (whose value the register now holds), which the live process may have
        // overwritten since. The fast walk and the full evaluator take the register's value when
        // such a read is refused.
        if addr < self.base {
            return Err(ReadFailure::Unreadable);
        }
        if let Some(word) = usize::try_from(addr - self.base)
            .ok()
            .and_then(|o| self.bytes.get(o..o.checked_add(8)?))
        {
            return Ok(u64::from_le_bytes(word.try_into().unwrap_or([0; 8])));
        }
        let mut buf = [0u8; 8];
        match self.fallback.as_mut().map(|r| r.read(addr, &mut buf)) {
            Some(true) => Ok(u64::from_le_bytes(buf)),
            Some(false) => Err(self
                .fallback
                .as_ref()
                .and_then(|r| r.failure())
                .unwrap_or(ReadFailure::Unreadable)),
            None => Err(ReadFailure::BeyondCopy),
        }
    }

    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        self.fallback.as_mut().is_some_and(|r| r.read(addr, buf))
    }

    fn copied_len(&self) -> Option<usize> {
        Some(self.bytes.len())
    }
}

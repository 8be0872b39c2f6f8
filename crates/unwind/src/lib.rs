//! The rootline unwinder: from a sample's registers and stack bytes to the code addresses of its
//! frames, leaf first, and how the stack ends.
//!
//! What the caller does: build an [`AddressSpace`] from a process's executable mappings, giving
//! each file-backed [`Region`] its binary (any type implementing [`Binary`]: unwind sections,
//! code bytes, function starts; the image layer provides one), and hand each sample's
//! [`Registers`] and memory (a type implementing [`Memory`], usually a [`SampleStack`] over the
//! bytes the kernel copied, with an optional live [`MemoryReader`] past them) to
//! [`AddressSpace::unwind_with_sps`], or to [`AddressSpace::unwind_observed`] with a
//! [`FrameObserver`] that sees each recovered frame's state and may stop the walk there. JIT code
//! bounds and runtime-specific rules come in through the other [`Memory`] methods.
//!
//! What this crate does: executes CFI (`.eh_frame` and `.debug_frame`) as compact rules
//! remembered per address while a row needs only rip, rsp and rbp ([`frame_rule`]; read for all
//! of an FDE's rows at once, [`fde_rules`]), and with a full-register gimli evaluator otherwise
//! ([`full`]; FDEs indexed in [`cfi`]); decides frames in code without CFI from its
//! instructions ([`x86_64::instruction_analysis`]: prologue and epilogue analysis of native and
//! JIT code, run by [`nocfi`]); validates every step (the stack pointer strictly increases, a
//! return address follows a call in executable code); and ends every stack either at its root
//! or with a [`TruncateReason`] decided in [`policy`], never silently.
//!
//! Pure: no system calls, no unsafe code, no platform code; its tests need no perf access.

#![forbid(unsafe_code)]

pub mod binary;
pub mod cfi;
pub mod fde_rules;
pub mod frame_rule;
pub mod full;
pub mod kernel_rows;
pub mod memory;
pub mod nocfi;
pub mod policy;
pub mod region;
pub mod regs;
pub mod sections;
pub mod space;
pub mod x86_64;

#[cfg(test)]
mod synthetic;
#[cfg(test)]
mod tests;

pub use binary::Binary;
pub use memory::{FrameObserver, Memory, MemoryReader, NoObserver, SampleStack};
pub use policy::{ReadFailure, StackEnd, TruncateReason};
pub use region::Region;
pub use regs::Registers;
pub use sections::{Section, SectionLayout, UnwindSections};
pub use space::AddressSpace;
pub use x86_64::instruction_analysis::NoCfiRule;

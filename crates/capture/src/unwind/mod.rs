//! The unwinder as capture uses it: [`rootline_unwind`]'s address space over
//! [`rootline_image`]'s binaries.

pub use rootline_image::CodeModule;
pub use rootline_unwind::{
    Binary, FrameObserver, Memory, MemoryReader, NoCfiRule, ReadFailure, Registers, SampleStack,
    StackEnd, TruncateReason, policy, regs,
};

/// A process's executable regions with their binaries.
pub type AddressSpace = rootline_unwind::AddressSpace<CodeModule>;
/// One executable region, with its binary when file-backed.
pub type Region = rootline_unwind::Region<CodeModule>;

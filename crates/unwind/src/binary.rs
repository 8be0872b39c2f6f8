//! What the unwinder needs from a binary (an ELF file mapped into the address space): its
//! unwind sections, its code bytes, where its functions start, and which functions begin
//! threads. The image layer implements [`Binary`]; tests implement it over bytes in memory.

use std::sync::Arc;

use crate::sections::UnwindSections;

/// A binary as the unwinder reads it. Addresses are link-time addresses (SVMA).
pub trait Binary: Send + Sync {
    /// Name used in messages.
    fn name(&self) -> &str;
    /// The binary's unwind sections.
    fn unwind_sections(&self) -> &Arc<UnwindSections>;
    /// Code bytes at link-time address `svma` into `buf`; None when they cannot be read in
    /// full.
    fn code<'b>(&self, svma: u64, buf: &'b mut [u8]) -> Option<&'b [u8]>;
    /// The start of the function containing `svma`, from the symbol tables.
    fn function_start(&self, svma: u64) -> Option<u64>;
    /// The end of the function containing `svma`, when its symbol has a size.
    fn function_end(&self, _svma: u64) -> Option<u64> {
        None
    }
    /// Whether `svma` lies in a function that starts threads (see
    /// [`crate::policy::is_thread_entry`]).
    fn in_thread_entry(&self, svma: u64) -> bool;
    /// Whether `svma` is the first instruction of a function frames return into without a call
    /// (see [`crate::policy::is_interpreter_reentry`]). Asked only of return addresses that do
    /// not follow a call, so it may read the symbol's name.
    fn is_interpreter_reentry(&self, svma: u64) -> bool;
    /// The link-time address of file offset `offset` (to compute a mapping's load bias).
    fn svma_of_file_offset(&self, offset: u64) -> Option<u64>;
}

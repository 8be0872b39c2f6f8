//! Binary images: ELF files as rootline's unwinder and symbolizer read them.
//!
//! What the caller does: owns one [`ModuleBudget`] (a recorder, an agent) and opens each binary
//! it meets with [`CodeModule::open`] (or [`CodeModule::parse`] for bytes in memory, such as the
//! vDSO), giving that budget and, optionally, a limit: a binary that would take the budget's live
//! memory past the limit is refused with [`ModuleError::OverBudget`]. A caller that records again
//! and again may name a cache directory ([`CodeModule::open_cached`]), where the layouts and FDE
//! indexes of large binaries are kept between runs. Other tables the owner
//! keeps for unwinding and naming (a .NET image's methods, a JIT process's symbols) are counted
//! in the same budget through [`ModuleBudget::charge`].
//!
//! What this crate does: reads an ELF file's layout (segments, sections, function symbols, the
//! functions that start threads, build id) without reading the file whole, copies out only the
//! unwind sections (handed to the unwinder as [`rootline_unwind::UnwindSections`]), reads code
//! bytes through a small page cache and symbol names on demand, and counts every byte it keeps
//! in the owner's budget. [`CodeModule`] implements [`rootline_unwind::Binary`].
//!
//! Pure: std file reads only, no unsafe code, no process access.

#![forbid(unsafe_code)]

mod budget;
mod bytes;
pub mod cache_file;
mod layout;
mod layout_cache;
mod module;

pub use budget::PAGE_CACHE_BYTES;
pub use budget::{ModuleBudget, TableCharge};
pub use layout::Segment;
pub use layout_cache::{FileKey, key_name as file_key_name, key_of as file_key};
pub use module::{CodeModule, ModuleError};

/// What is wrong with an ELF file.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The parser's error (malformed headers or tables).
    #[error(transparent)]
    Malformed(#[from] object::Error),
    /// A well-formed file of a kind the unwinder does not read.
    #[error("{0}")]
    Unsupported(&'static str),
}

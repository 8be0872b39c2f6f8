//! One executable region of an address space: its addresses, the file mapped there and, when
//! the unwinder reads that file, its binary and load bias.

use std::sync::Arc;

use crate::binary::Binary;

/// An executable region of an address space, backed by a binary of type `M` when file-backed.
pub struct Region<M> {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset mapped at `start`.
    pub file_offset: u64,
    /// Path of the backing file, or a pseudo name (`[anon]`, `[vdso]`, …).
    pub path: Arc<str>,
    /// The parsed file, when the region is file-backed and the file could be read.
    pub module: Option<Arc<M>>,
    /// Runtime address minus link-time address (0 when there is no module).
    pub bias: u64,
    /// The file was not loaded because the memory budget for binaries was full: frames here
    /// end the stack ([`crate::policy::TruncateReason::ModuleMemoryLimit`]).
    pub refused: bool,
}

impl<M> Clone for Region<M> {
    fn clone(&self) -> Self {
        Region {
            start: self.start,
            end: self.end,
            file_offset: self.file_offset,
            path: Arc::clone(&self.path),
            module: self.module.clone(),
            bias: self.bias,
            refused: self.refused,
        }
    }
}

impl<M> std::fmt::Debug for Region<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("start", &self.start)
            .field("end", &self.end)
            .field("file_offset", &self.file_offset)
            .field("path", &self.path)
            .field("module", &self.module.is_some())
            .field("bias", &self.bias)
            .field("refused", &self.refused)
            .finish()
    }
}

impl<M: Binary> Region<M> {
    /// A region; computes the load bias from the module's segments.
    pub fn new(
        start: u64,
        end: u64,
        file_offset: u64,
        path: Arc<str>,
        module: Option<Arc<M>>,
    ) -> Region<M> {
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
            refused: false,
        }
    }

    /// The same region, marked as refused by the memory budget for binaries (see
    /// [`Region::refused`]).
    pub fn refused(mut self, refused: bool) -> Region<M> {
        self.refused = refused;
        self
    }

    /// The link-time address of runtime address `addr`.
    pub fn svma(&self, addr: u64) -> u64 {
        addr.wrapping_sub(self.bias)
    }
}

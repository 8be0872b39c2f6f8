//! A binary held in memory, for tests: code bytes at one link-time address, an optional
//! `.eh_frame`, and function symbols.

use std::sync::Arc;

use crate::binary::Binary;
use crate::policy::{is_interpreter_reentry, is_thread_entry};
use crate::sections::{Section, SectionLayout, UnwindSections};

/// A binary made of `code` at `text_svma`, its `.eh_frame` and symbols.
pub(crate) struct SyntheticBinary {
    text_svma: u64,
    code: Vec<u8>,
    sections: Arc<UnwindSections>,
    /// `(start, end, is a thread entry, is an interpreter re-entry)`, sorted by start.
    functions: Vec<(u64, u64, bool, bool)>,
}

impl SyntheticBinary {
    /// `code` at `text_svma`, `.eh_frame` bytes at `eh_frame_svma` (none when empty), and
    /// function symbols `(start, end, name)` in address order.
    pub(crate) fn new(
        text_svma: u64,
        code: &[u8],
        eh_frame_svma: u64,
        eh_frame: &[u8],
        symbols: &[(u64, u64, &str)],
    ) -> SyntheticBinary {
        let layout = SectionLayout {
            text: Some(text_svma..text_svma + code.len() as u64),
            eh_frame: (!eh_frame.is_empty()).then(|| Section {
                svma: eh_frame_svma..eh_frame_svma + eh_frame.len() as u64,
                data: eh_frame.into(),
            }),
            ..SectionLayout::default()
        };
        SyntheticBinary {
            text_svma,
            code: code.to_vec(),
            sections: Arc::new(UnwindSections::new(layout)),
            functions: symbols
                .iter()
                .map(|&(start, end, name)| {
                    let reentry = is_interpreter_reentry(name);
                    (start, end, is_thread_entry(name), reentry)
                })
                .collect(),
        }
    }

    fn function(&self, svma: u64) -> Option<&(u64, u64, bool, bool)> {
        self.functions
            .iter()
            .find(|&&(start, end, ..)| svma >= start && svma < end)
    }
}

impl Binary for SyntheticBinary {
    fn name(&self) -> &str {
        "synthetic"
    }

    fn unwind_sections(&self) -> &Arc<UnwindSections> {
        &self.sections
    }

    fn code<'b>(&self, svma: u64, buf: &'b mut [u8]) -> Option<&'b [u8]> {
        let at = usize::try_from(svma.checked_sub(self.text_svma)?).ok()?;
        let bytes = self.code.get(at..)?;
        let n = buf.len().min(bytes.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Some(&buf[..n])
    }

    fn function_start(&self, svma: u64) -> Option<u64> {
        self.function(svma).map(|f| f.0)
    }

    fn function_end(&self, svma: u64) -> Option<u64> {
        self.function(svma).map(|f| f.1)
    }

    fn in_thread_entry(&self, svma: u64) -> bool {
        self.function(svma).is_some_and(|f| f.2)
    }

    fn is_interpreter_reentry(&self, svma: u64) -> bool {
        self.function(svma).is_some_and(|f| f.3 && f.0 == svma)
    }

    fn svma_of_file_offset(&self, offset: u64) -> Option<u64> {
        Some(self.text_svma + offset)
    }
}

//! `perfinfo-PID.map`: the image loads a .NET runtime (CoreCLR with perf maps enabled) writes
//! beside its perf map, one line per assembly it loads:
//!
//! ```text
//! ImageLoad;/path/System.Private.CoreLib.dll;{82d8e023-e6b4-4028-a9dc-44dee6b6a537};00007F59784D0000;
//! ```
//!
//! `TYPE;PATH;GUID;BASE;` with BASE in hexadecimal: where the runtime mapped the image's
//! precompiled (ReadyToRun) code, or 0 for an assembly it runs from IL only. The path is as the
//! target sees it (inside its mount namespace) and may itself hold `;`, so the fields after it
//! are taken from the right. Lines of other types are kept aside; a torn last line waits for its
//! newline, like a perf map's ([`super::perfmap`]).

use std::io::{self, Read, Seek};

use super::perfmap::{AppendedLines, LineError};

/// One `ImageLoad` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageLoad {
    /// The image's path as the target sees it.
    pub path: String,
    /// The module version id, as written (`{…}`).
    pub guid: String,
    /// Where the image is mapped; 0 for an IL-only image (no precompiled code).
    pub base: u64,
}

/// A parsed perfinfo line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerfInfoLine {
    /// An assembly was loaded.
    ImageLoad(ImageLoad),
    /// A line of another type, kept as written (`TYPE`, the rest).
    Other(String, String),
}

/// Parses one line (without its newline). `line` is the 1-based number used in errors.
pub fn parse_line(text: &str, line: u64) -> Result<PerfInfoLine, LineError> {
    let err = |reason| LineError { line, reason };
    let text = text.trim_end_matches('\r');
    let (kind, rest) = text.split_once(';').ok_or(err("no ';' after the type"))?;
    if kind.is_empty() {
        return Err(err("empty type"));
    }
    if kind != "ImageLoad" {
        return Ok(PerfInfoLine::Other(kind.to_string(), rest.to_string()));
    }
    let rest = rest
        .strip_suffix(';')
        .ok_or(err("ImageLoad line does not end in ';'"))?;
    let mut fields = rest.rsplitn(3, ';');
    let (Some(base), Some(guid), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
        return Err(err("ImageLoad needs PATH;GUID;BASE"));
    };
    if path.is_empty() {
        return Err(err("empty image path"));
    }
    if !(guid.starts_with('{') && guid.ends_with('}')) {
        return Err(err("GUID is not in braces"));
    }
    let digits = base
        .strip_prefix("0x")
        .or_else(|| base.strip_prefix("0X"))
        .unwrap_or(base);
    if digits.is_empty() || digits.len() > 16 {
        return Err(err("base address is not hexadecimal"));
    }
    let base =
        u64::from_str_radix(digits, 16).map_err(|_| err("base address is not hexadecimal"))?;
    Ok(PerfInfoLine::ImageLoad(ImageLoad {
        path: path.to_string(),
        guid: guid.to_string(),
        base,
    }))
}

/// An incrementally read perfinfo file.
#[derive(Debug)]
pub struct PerfInfo<R> {
    source: R,
    lines: AppendedLines,
    /// Every image load read so far, in file order.
    pub images: Vec<ImageLoad>,
    /// Lines that did not parse (at most 16 kept; the rest of the file is still used).
    pub bad_lines: Vec<LineError>,
}

impl<R: Read + Seek> PerfInfo<R> {
    /// A perfinfo file read from `source` (nothing is read until [`PerfInfo::read_more`]).
    pub fn new(source: R) -> PerfInfo<R> {
        PerfInfo {
            source,
            lines: AppendedLines::default(),
            images: Vec::new(),
            bad_lines: Vec::new(),
        }
    }

    /// Reads what was appended since the last call; returns the number of new image loads.
    pub fn read_more(&mut self) -> io::Result<usize> {
        let before = self.images.len();
        for (line, text) in self.lines.read(&mut self.source)? {
            match parse_line(&text, line) {
                Ok(PerfInfoLine::ImageLoad(image)) => self.images.push(image),
                Ok(PerfInfoLine::Other(..)) => {}
                Err(e) => {
                    if self.bad_lines.len() < 16 {
                        self.bad_lines.push(e);
                    }
                }
            }
        }
        Ok(self.images.len() - before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn image_loads_parse_and_odd_lines_say_why() {
        let l = parse_line(
            "ImageLoad;/usr/share/dotnet/shared/Microsoft.NETCore.App/3.1.23/System.Private.CoreLib.dll;{82d8e023-e6b4-4028-a9dc-44dee6b6a537};00007F59784D0000;",
            1,
        )
        .unwrap();
        let PerfInfoLine::ImageLoad(i) = l else {
            panic!("{l:?}")
        };
        assert_eq!(i.base, 0x7f59_784d_0000);
        assert!(i.path.ends_with("/System.Private.CoreLib.dll"));
        assert_eq!(i.guid, "{82d8e023-e6b4-4028-a9dc-44dee6b6a537}");
        // IL-only image; a path holding ';'; CRLF.
        let l = parse_line("ImageLoad;/a;b/Lib.exe;{0};0000000000000000;\r", 2).unwrap();
        assert_eq!(
            l,
            PerfInfoLine::ImageLoad(ImageLoad {
                path: "/a;b/Lib.exe".into(),
                guid: "{0}".into(),
                base: 0
            })
        );
        assert_eq!(
            parse_line("ProcessInfo;something;", 3).unwrap(),
            PerfInfoLine::Other("ProcessInfo".into(), "something;".into())
        );
        for (bad, why) in [
            (
                "ImageLoad;/a.dll;{0};7F00",
                "ImageLoad line does not end in ';'",
            ),
            ("ImageLoad;{0};7F00;", "ImageLoad needs PATH;GUID;BASE"),
            ("ImageLoad;;{0};7F00;", "empty image path"),
            ("ImageLoad;/a.dll;0;7F00;", "GUID is not in braces"),
            (
                "ImageLoad;/a.dll;{0};zz;",
                "base address is not hexadecimal",
            ),
            ("ImageLoad;/a.dll;{0};;", "base address is not hexadecimal"),
            (
                "ImageLoad;/a.dll;{0};11112222333344445;",
                "base address is not hexadecimal",
            ),
            ("no separator", "no ';' after the type"),
            (";x;", "empty type"),
        ] {
            let e = parse_line(bad, 9).unwrap_err();
            assert_eq!((e.line, e.reason), (9, why), "{bad}");
        }
    }

    #[test]
    fn a_torn_last_line_waits_for_its_newline() {
        let first = "ImageLoad;/x/A.dll;{1};00007F0000000000;\n";
        let second = "ImageLoad;/x/B.dll;{2};00007F0000100000;\n";
        let mut bytes = format!("{first}garbage\n{}", &second[..20]).into_bytes();
        let mut info = PerfInfo::new(Cursor::new(bytes.clone()));
        assert_eq!(info.read_more().unwrap(), 1);
        assert_eq!(info.images[0].path, "/x/A.dll");
        assert_eq!(info.bad_lines.len(), 1);
        assert_eq!(info.bad_lines[0].line, 2);
        bytes.extend_from_slice(&second.as_bytes()[20..]);
        *info.source.get_mut() = bytes;
        assert_eq!(info.read_more().unwrap(), 1);
        assert_eq!(info.images[1].base, 0x7f00_0010_0000);
        assert_eq!(info.read_more().unwrap(), 0);
    }
}

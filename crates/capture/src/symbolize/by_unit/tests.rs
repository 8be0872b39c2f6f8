//! Tests of reading by unit against `addr2line` reading whole files: small programs built here
//! and, where installed, libc's and ld.so's separate debug files.

use super::super::dwarf::DwarfReader;
use super::*;
use std::process::Command;

/// The frames and symbol at `addr` by unit and by `addr2line` reading the whole file.
fn both(
    by_unit: &UnitDwarf,
    whole: &addr2line::Loader,
    addr: u64,
) -> [(Vec<SymbolFrame>, Option<String>); 2] {
    let mut a = Vec::new();
    by_unit.find_frames(addr, &|_| None, &mut a);
    let mut b = Vec::new();
    super::super::push_frames(whole.find_frames(addr).ok(), &|_| None, &mut b);
    [
        (a, by_unit.find_symbol(addr).map(str::to_string)),
        (b, whole.find_symbol(addr).map(str::to_string)),
    ]
}

/// Builds a two-unit C program with inlined functions, with `flags`, in `dir`.
fn build(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    std::fs::write(
        dir.join("a.c"),
        "static inline int sq(int x) { return x * x; }\n\
         int b(int);\n\
         int main(int argc, char **argv) { return b(sq(argc)) + sq(argc + (argv != 0)); }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("b.c"),
        "static inline int tw(int x) { return x * 2 + 1; }\n\
         __attribute__((noinline)) int b(int x) { return tw(x) + tw(x * 3); }\n",
    )
    .unwrap();
    let out = dir.join(name);
    let status = Command::new("cc")
        .args(flags)
        .arg(dir.join("a.c"))
        .arg(dir.join("b.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc runs");
    assert!(status.success());
    out
}

/// Every address of `.text`.
fn text(path: &Path) -> std::ops::Range<u64> {
    let data = std::fs::read(path).unwrap();
    let elf = ElfFile64::<Endianness, _>::parse(&*data).unwrap();
    let text = elf.section_by_name(".text").unwrap();
    text.address()..text.address() + text.size()
}

#[test]
fn a_compressed_programs_units_read_alone_name_every_address_as_the_whole_file_does() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "zlib", &["-O2", "-g", "-gz=zlib"]);
    let by_unit = UnitDwarf::open(&exe).expect("compressed, every unit listed");
    let whole = addr2line::Loader::new(&exe).unwrap();
    let (mut inlined, mut named) = (0, 0);
    for addr in text(&exe) {
        let [a, b] = both(&by_unit, &whole, addr);
        assert_eq!(a, b, "at {addr:#x}");
        named += usize::from(!a.0.is_empty());
        inlined += usize::from(a.0.len() >= 2);
    }
    assert!(named > 0 && inlined > 0, "{named} named, {inlined} inlined");
    assert_eq!(by_unit.units.len(), 2);
    assert_eq!(by_unit.units_read(), 2);
    assert!(!by_unit.reads_whole());

    // DWARF not compressed is read whole.
    let plain = build(dir.path(), "plain", &["-O2", "-g"]);
    assert!(matches!(
        UnitDwarf::open(&plain),
        Err(ByUnitError::NotCompressed)
    ));
}

#[test]
fn a_section_inflates_only_to_its_stated_size() {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&[7u8; 5000]).unwrap();
    let compressed = z.finish().unwrap();
    assert_eq!(&*inflate(&compressed, 5000).unwrap(), &[7u8; 5000][..]);
    assert!(matches!(
        inflate(&compressed, 4999),
        Err(ByUnitError::Inflate)
    ));
    assert!(matches!(
        inflate(&compressed, 5001),
        Err(ByUnitError::Inflate)
    ));
    assert!(matches!(
        inflate(&compressed[..20], 5000),
        Err(ByUnitError::Inflate)
    ));
    // A stated size past what deflate can reach is refused before anything is allocated.
    assert!(matches!(
        inflate(&compressed, 1 << 60),
        Err(ByUnitError::Inflate)
    ));
}

#[test]
fn a_unit_referring_outside_itself_sends_the_file_to_the_whole_reading() {
    // A unit whose name attribute is an offset into another unit (DW_FORM_ref_addr), then one
    // whose attributes stay inside (a string offset, an implicit constant).
    let outside = [1, 0x2e, 0, 0x31, 0x10, 0, 0, 0];
    let inside = [1, 0x2e, 1, 0x03, 0x0e, 0x3a, 0x21, 0x7f, 0, 0, 0];
    let reader = |b: &[u8]| Reader::new(Arc::from(b), gimli::RunTimeEndian::Little);
    assert!(refers_outside(&reader(&outside), 0).unwrap());
    assert!(!refers_outside(&reader(&inside), 0).unwrap());
    assert!(
        refers_outside(&reader(&inside[..5]), 0).is_err(),
        "cut short"
    );

    // A unit naming a type by its signature in .debug_types (DWARF 4 type units): the file is
    // read whole from then on, and names every address as addr2line does.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c.c"),
        "struct point { int x, y; };\n\
         static inline int norm(struct point p) { return p.x * p.x + p.y * p.y; }\n\
         __attribute__((noinline)) int c(int x) { struct point p = { x, x + 1 }; return norm(p); }\n",
    )
    .unwrap();
    let c = dir.path().join("c.c");
    let c = c.to_str().unwrap();
    let exe = build(
        dir.path(),
        "types",
        &[
            "-O2",
            "-g",
            "-gdwarf-4",
            "-fdebug-types-section",
            "-gz=zlib",
            c,
        ],
    );
    let reader = DwarfReader::open(&exe).expect("DWARF");
    let whole = addr2line::Loader::new(&exe).unwrap();
    for addr in text(&exe) {
        let mut a = Vec::new();
        reader.find_frames(addr, &|_| None, &mut a);
        let mut b = Vec::new();
        super::super::push_frames(whole.find_frames(addr).ok(), &|_| None, &mut b);
        assert_eq!(a, b, "at {addr:#x}");
    }
    match reader {
        DwarfReader::ByUnit(by_unit) => assert!(by_unit.reads_whole()),
        DwarfReader::Whole(_) => panic!("expected the fallback"),
    }
}

#[test]
fn libcs_separate_debug_file_read_by_unit_names_as_the_whole_file_does() {
    let Some(debug) = libc_debug_file() else {
        println!("skipped: no separate debug file for libc (Debian's libc6-dbg)");
        return;
    };
    let by_unit = UnitDwarf::open(&debug).expect("libc6-dbg: compressed, units listed");
    let whole = addr2line::Loader::new(&debug).unwrap();
    let step = (by_unit.ranges.len() / 1_500).max(1);
    let mut inlined = 0;
    for &(begin, end, _) in by_unit.ranges.iter().step_by(step) {
        for addr in [begin, begin + (end - begin) / 2, end - 1] {
            let [a, b] = both(&by_unit, &whole, addr);
            assert_eq!(a, b, "at {addr:#x}");
            inlined += usize::from(a.0.len() >= 2);
        }
    }
    assert!(
        inlined > 100,
        "only {inlined} addresses with inlined frames"
    );
    assert!(!by_unit.reads_whole());
    assert!(by_unit.units_read() < by_unit.units.len());
    same_symbols_at_every_symbol(&debug);
}

#[test]
fn libcs_inflated_sections_are_kept_and_what_is_kept_is_what_names() {
    let Some(debug) = libc_debug_file() else {
        println!("skipped: no separate debug file for libc (Debian's libc6-dbg)");
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let inflated = UnitDwarf::open_kept(&debug, Some(cache.path())).unwrap();
    let kept = |ext: &str| {
        std::fs::read_dir(cache.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == ext)
            })
            .count()
    };
    assert_eq!(kept("sections"), 1, "libc's sections are kept");
    let read_back = UnitDwarf::open_kept(&debug, Some(cache.path())).unwrap();
    let step = (inflated.ranges.len() / 300).max(1);
    let addrs: Vec<u64> = inflated
        .ranges
        .iter()
        .step_by(step)
        .map(|r| r.0 + (r.1 - r.0) / 2)
        .collect();
    let frames = |d: &UnitDwarf, addr| {
        let mut out = Vec::new();
        d.find_frames(addr, &|_| None, &mut out);
        out
    };
    let mut lines = 0;
    for &addr in &addrs {
        let a = frames(&inflated, addr);
        assert_eq!(a, frames(&read_back, addr), "at {addr:#x}");
        lines += a.iter().filter(|f| f.line.is_some()).count();
    }
    assert!(lines > 100, "only {lines} frames with a line");
    // The sections are read from the cache: kept without `.debug_aranges`, the file is
    // not one to read by unit any more.
    let key = rootline_image::file_key(&std::fs::metadata(&debug).unwrap());
    let sections = super::super::inflated_cache::load(cache.path(), &key, &READ).unwrap();
    let without_aranges: Vec<(&str, Option<&[u8]>)> = sections
        .iter()
        .map(|(name, data)| (*name, data.as_deref().filter(|_| *name != ".debug_aranges")))
        .collect();
    super::super::inflated_cache::store(cache.path(), &key, &without_aranges);
    assert!(matches!(
        UnitDwarf::open_kept(&debug, Some(cache.path())),
        Err(ByUnitError::NotListed)
    ));
}

#[test]
fn ld_sos_symbols_are_named_as_the_whole_file_does() {
    let Some(debug) = debug_file_of("/ld-linux-x86-64.so") else {
        println!("skipped: no separate debug file for ld.so (Debian's libc6-dbg)");
        return;
    };
    // ld.so's entry `_start` and `_dl_start_user` are labels of no type and no size.
    same_symbols_at_every_symbol(&debug);
}

/// The symbol named at each symbol-table symbol's address (and the next byte) is the one
/// `addr2line` names.
fn same_symbols_at_every_symbol(path: &Path) {
    use object::ObjectSymbol;
    let by_unit = UnitDwarf::open(path).unwrap();
    let whole = addr2line::Loader::new(path).unwrap();
    let data = std::fs::read(path).unwrap();
    let elf = ElfFile64::<Endianness, _>::parse(&*data).unwrap();
    let mut named = 0;
    for symbol in elf.symbols() {
        for addr in [symbol.address(), symbol.address() + 1] {
            let ours = by_unit.find_symbol(addr);
            assert_eq!(ours, whole.find_symbol(addr), "at {addr:#x}");
            named += usize::from(ours.is_some());
        }
    }
    assert!(named > 1_000, "only {named} named");
}

/// The separate debug file of this process's libc, when installed.
fn libc_debug_file() -> Option<PathBuf> {
    debug_file_of("/libc.so")
}

/// The separate debug file of the library mapped in this process whose path contains
/// `name`, when installed.
fn debug_file_of(name: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains(name))?;
    let data = std::fs::read(libc).ok()?;
    let elf = ElfFile64::<Endianness, _>::parse(&*data).ok()?;
    let id: String = elf
        .build_id()
        .ok()??
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &id[..2],
        &id[2..]
    ));
    path.is_file().then_some(path)
}

//! Files of every `.rlp` version this crate knows: version 1 (before functions had a system name
//! and a code tier) still reads, and version 2 keeps both.

use rootline_profile::{
    FrameKind, Function, Profile, RLP_OLDEST_VERSION, RLP_VERSION, SampleType, read_rlp, write_rlp,
};

/// Written by the version-1 writer: `Recording::new(15)` of `tests/common`, 12 stacks over 20
/// frames, 40 samples.
const V1: &[u8] = include_bytes!("fixtures/rlp-v1.rlp");

#[test]
fn a_version_1_file_still_reads() {
    assert_eq!(u32::from_le_bytes(V1[8..12].try_into().unwrap()), 1);
    assert_eq!(RLP_OLDEST_VERSION, 1);
    let read = read_rlp(V1).unwrap();
    assert!(read.tail.is_none(), "{:?}", read.tail);
    let p = &read.profile;
    assert_eq!(
        (
            p.strings().len(),
            p.mappings().len(),
            p.functions().len(),
            p.frames().len(),
            p.stacks().len(),
            p.samples().len(),
            p.threads().len()
        ),
        (35, 3, 20, 20, 56, 40, 1)
    );
    let f = &p.functions()[0];
    assert_eq!(p.string(f.name), "module::function_0");
    assert_eq!(f.file.map(|s| p.string(s)), Some("src/file_0.rs"));
    assert!(
        p.functions()
            .iter()
            .all(|f| f.system_name.is_none() && f.tier.is_none())
    );
    let totals: Vec<i64> = p.samples().values.iter().map(|c| c.iter().sum()).collect();
    assert_eq!(totals, [40_038_647, 40]);
    assert_eq!(p.metadata.producer, "rootline record");
    // Written again, it is a current-version file with the same content.
    let again = write_rlp(Vec::new(), p).unwrap();
    assert_eq!(
        u32::from_le_bytes(again[8..12].try_into().unwrap()),
        RLP_VERSION
    );
    let reread = read_rlp(&again[..]).unwrap().profile;
    assert_eq!(reread.functions(), p.functions());
    assert_eq!(reread.samples(), p.samples());
}

/// One method at two code tiers: two functions that display alike.
fn two_tiers() -> Profile {
    let mut p = Profile::new(vec![SampleType::samples()]);
    let t = p.intern_thread(1, 1);
    let main = p.intern_named_frame("Calls::Main(string[])", FrameKind::Managed);
    let name = p.intern_string("Calls::Spin(int32)");
    for (tier, count) in [("QuickJitted", 2), ("OptimizedTier1OSR", 3)] {
        let raw = format!("int32 [Calls] Calls::Spin(int32)[{tier}]");
        let function = Function {
            system_name: Some(p.intern_string(&raw)),
            tier: Some(p.intern_string(tier)),
            ..Function::new(name, None)
        };
        let function = p.intern_function(function);
        let frame = p.intern_frame(rootline_profile::Frame {
            function,
            mapping: None,
            address: 0x1000 + count,
            line: None,
            inline_depth: 0,
            kind: FrameKind::Managed,
            from_live_memory: false,
        });
        let root = p.intern_stack(None, main);
        let leaf = p.intern_stack(Some(root), frame);
        for i in 0..count {
            p.push_sample(i, t, leaf, &[1]).unwrap();
        }
    }
    p
}

#[test]
fn system_names_and_tiers_round_trip() {
    let p = two_tiers();
    let bytes = write_rlp(Vec::new(), &p).unwrap();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 2);
    let read = read_rlp(&bytes[..]).unwrap();
    assert!(read.tail.is_none());
    let r = &read.profile;
    assert_eq!(r.functions(), p.functions());
    let tiers: Vec<(&str, &str)> = r
        .functions()
        .iter()
        .filter_map(|f| Some((r.string(f.tier?), r.string(f.system_name?))))
        .collect();
    assert_eq!(
        tiers,
        [
            (
                "QuickJitted",
                "int32 [Calls] Calls::Spin(int32)[QuickJitted]"
            ),
            (
                "OptimizedTier1OSR",
                "int32 [Calls] Calls::Spin(int32)[OptimizedTier1OSR]"
            ),
        ]
    );
    // The two functions show one name: the stacks fold to one line.
    let mut folded = std::collections::BTreeMap::<String, u64>::new();
    let mut frames = Vec::new();
    for &stack in &r.samples().stacks {
        r.stack_frames_root_first(stack, &mut frames);
        let line: Vec<&str> = frames.iter().map(|&f| r.frame_name(f)).collect();
        *folded.entry(line.join(";")).or_default() += 1;
    }
    assert_eq!(
        folded.into_iter().collect::<Vec<_>>(),
        [("Calls::Main(string[]);Calls::Spin(int32)".to_string(), 5)]
    );
}

#[test]
fn a_newer_version_is_refused_by_number() {
    let mut bytes = write_rlp(Vec::new(), &two_tiers()).unwrap();
    bytes[8..12].copy_from_slice(&(RLP_VERSION + 1).to_le_bytes());
    let Err(err) = read_rlp(&bytes[..]) else {
        panic!("a newer version must be refused")
    };
    assert!(err.to_string().contains("1 to 2"), "{err}");
}

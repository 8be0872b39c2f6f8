//! The loaded program's maps as user space keeps them. These load the program (root, BPF):
//! outside CI a machine that cannot is skipped with the reason.

use super::*;

fn loaded() -> Option<KernelWalk> {
    let opts = KernelWalkOptions {
        rows: 1024,
        ring_bytes: 1 << 16,
        ..KernelWalkOptions::default()
    };
    match KernelWalk::load(opts) {
        Ok(kw) => Some(kw),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("the program does not load: {e}"),
    }
}

/// Every CPU's row memo, as bytes.
fn memos(kw: &mut KernelWalk) -> PerCpuArray<&mut MapData, [u8; ROW_MEMO_BYTES]> {
    kw.ebpf
        .map_mut("row_memos")
        .expect("the row memos")
        .try_into()
        .expect("a per-CPU array of ROW_MEMO_BYTES")
}

/// Whether every byte of every CPU's memo is `b`.
fn memos_are(kw: &mut KernelWalk, b: u8) -> bool {
    let values = memos(kw).get(&0, 0).expect("read");
    values.iter().all(|memo| memo.iter().all(|&x| x == b))
}

#[test]
fn generations_start_again_at_one_with_the_row_memos_emptied() {
    let Some(mut kw) = loaded() else {
        return;
    };
    let cpus = aya::util::nr_cpus().expect("CPU count");
    let full = PerCpuValues::try_from(vec![[7u8; ROW_MEMO_BYTES]; cpus]).expect("values");
    memos(&mut kw).set(0, full, 0).expect("written");
    assert!(memos_are(&mut kw, 7));
    kw.proc_generation = u32::MAX - 1;
    assert_eq!(kw.next_generation(), u32::MAX);
    assert!(memos_are(&mut kw, 7), "emptied before the numbers ran out");
    assert_eq!(kw.next_generation(), 1);
    assert!(
        memos_are(&mut kw, 0),
        "rows memoized under old generations kept"
    );
    assert_eq!(kw.next_generation(), 2);
}

#[test]
fn each_process_entry_written_has_a_new_generation() {
    let Some(mut kw) = loaded() else {
        return;
    };
    let mut seen = Vec::new();
    for pid in [100, 100, 200] {
        let mut proc = Box::<Proc>::default();
        kw.write_proc(pid, &mut proc).expect("written");
        let kept = kw.procs.get(&pid, 0).expect("read back");
        assert_eq!(kept.generation, proc.generation);
        seen.push(kept.generation);
    }
    assert_eq!(seen, [1, 2, 3]);
}

//! Linking the program's one kfunc call. A walk goes on past `max_frames` as task work
//! (`bpf_task_work_schedule_resume_impl`, Linux 6.18), but the loader links no kfunc calls, so
//! the program calls it as a helper with an id no helper has, and [`link`] rewrites that
//! instruction before loading: into a call of the kfunc by its id in the running kernel's BTF.
//! Where the kernel has no such kfunc (or the caller turned the continuation off), the program
//! that calls it is not loaded (a kernel verifies only what is loaded) and walks end at
//! `max_frames`; the placeholder is still rewritten, into `r0 = -1` ("could not schedule").

use std::path::Path;

use object::{Object, ObjectSection, SectionKind};

/// `call 0x7ffff001`: the placeholder clang emits for `schedule_task_work`.
const PLACEHOLDER: [u8; 8] = [0x85, 0x00, 0x00, 0x00, 0x01, 0xf0, 0xff, 0x7f];
/// The kfunc the placeholder stands for.
pub(super) const KFUNC: &str = "bpf_task_work_schedule_resume_impl";
/// `r0 = -1` (`BPF_ALU64 | BPF_MOV | BPF_K`).
const FAILED: [u8; 8] = [0xb7, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff];

/// `kfunc`'s call: `BPF_JMP | BPF_CALL`, `src_reg = BPF_PSEUDO_KFUNC_CALL`, the kfunc's BTF id.
fn kfunc_call(id: u32) -> [u8; 8] {
    let mut insn = [0x85, 0x20, 0, 0, 0, 0, 0, 0];
    insn[4..].copy_from_slice(&id.to_le_bytes());
    insn
}

/// The running kernel's BTF id of [`KFUNC`]; None when it has none (older than 6.18, or no BTF).
/// Finding it reads the kernel's whole BTF (6 MB, a few milliseconds of every recording's start),
/// so it is kept in the cache directory for the boot it was found in (the kernel, and so its
/// BTF, cannot change without a reboot).
pub(super) fn kfunc_id() -> Option<u32> {
    kfunc_id_in(crate::cache_dir::cache_dir("kernel-walk").as_deref())
}

/// [`kfunc_id`], kept in `dir`.
fn kfunc_id_in(dir: Option<&Path>) -> Option<u32> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok();
    let boot = boot.as_deref().map(str::trim).filter(|b| !b.is_empty());
    if let (Some(boot), Some(dir)) = (boot, dir)
        && let Some(kept) = kept_id(dir, boot)
    {
        return kept;
    }
    let id = std::fs::read("/sys/kernel/btf/vmlinux")
        .ok()
        .and_then(|btf| super::btf_scan::func_id(&btf, KFUNC));
    if let (Some(boot), Some(dir)) = (boot, dir) {
        keep_id(dir, boot, id);
    }
    id
}

/// The name of the file that keeps the id.
const KEPT: &str = "kfunc-id";

/// The id kept for `boot` (None inside: the kernel has no such kfunc); None when none is kept
/// for that boot, or the file is not one [`keep_id`] writes.
fn kept_id(dir: &Path, boot: &str) -> Option<Option<u32>> {
    let text = std::fs::read_to_string(dir.join(KEPT)).ok()?;
    let mut fields = text.trim_end_matches('\n').split(' ');
    let (b, name, id) = (fields.next()?, fields.next()?, fields.next()?);
    if b != boot || name != KFUNC || fields.next().is_some() {
        return None;
    }
    match id {
        "none" => Some(None),
        id => id.parse().ok().map(Some),
    }
}

/// Keeps `id` for `boot` (failures are ignored: the cache only saves time).
fn keep_id(dir: &Path, boot: &str, id: Option<u32>) {
    use std::io::Write;
    let id = id.map_or_else(|| "none".to_string(), |id| id.to_string());
    rootline_image::cache_file::keep(dir, KEPT, 1, |w| writeln!(w, "{boot} {KFUNC} {id}"));
}

/// `object` with every placeholder call replaced: by a call of the kfunc `id`, or by `r0 = -1`
/// when None. Returned as 8-byte words (the ELF parser needs the bytes aligned). Errors when
/// the object has no placeholder in its code (it was built from another source).
pub(super) fn link(object: &[u8], id: Option<u32>) -> Result<Vec<u64>, String> {
    let file = object::File::parse(object).map_err(|e| format!("the program's object: {e}"))?;
    let mut bytes = object.to_vec();
    let insn = id.map_or(FAILED, kfunc_call);
    let mut found = 0;
    for section in file.sections() {
        if section.kind() != SectionKind::Text {
            continue;
        }
        let Some((offset, size)) = section.file_range() else {
            continue;
        };
        let (Ok(start), Ok(size)) = (usize::try_from(offset), usize::try_from(size)) else {
            continue;
        };
        let Some(code) = bytes.get_mut(start..start.saturating_add(size)) else {
            continue;
        };
        for slot in code.chunks_exact_mut(8) {
            if slot == PLACEHOLDER {
                slot.copy_from_slice(&insn);
                found += 1;
            }
        }
    }
    if found == 0 {
        return Err(format!("the program's object calls no {KFUNC} placeholder"));
    }
    bytes.resize(bytes.len().div_ceil(8) * 8, 0);
    Ok(bytes
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or_default()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_becomes_the_kfunc_call_or_a_failed_call() {
        let object: &[u8] = super::super::OBJECT;
        let count = |words: &[u64], insn: [u8; 8]| {
            bytemuck::cast_slice::<u64, [u8; 8]>(words)
                .iter()
                .filter(|w| **w == insn)
                .count()
        };
        let linked = link(object, Some(65923)).unwrap();
        assert_eq!(count(&linked, kfunc_call(65923)), 1);
        assert_eq!(count(&linked, PLACEHOLDER), 0);
        assert_eq!(
            bytemuck::cast_slice::<u64, u8>(&linked).len(),
            object.len().div_ceil(8) * 8
        );
        let unlinked = link(object, None).unwrap();
        assert_eq!(count(&unlinked, PLACEHOLDER), 0);
        assert!(count(&unlinked, FAILED) >= 1);
        assert!(link(b"not an object", None).is_err());
    }

    #[test]
    fn the_id_is_kept_for_the_boot_it_was_found_in() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(kept_id(dir.path(), "boot-a"), None);
        keep_id(dir.path(), "boot-a", Some(65923));
        assert_eq!(kept_id(dir.path(), "boot-a"), Some(Some(65923)));
        assert_eq!(kept_id(dir.path(), "boot-b"), None);
        keep_id(dir.path(), "boot-b", None);
        assert_eq!(kept_id(dir.path(), "boot-b"), Some(None));
        assert_eq!(kept_id(dir.path(), "boot-a"), None);
        for bad in [
            "",
            "boot-b",
            "boot-b other_kfunc 7",
            "boot-b bpf_task_work_schedule_resume_impl x",
            "boot-b bpf_task_work_schedule_resume_impl 7 8",
        ] {
            std::fs::write(dir.path().join(KEPT), bad).expect("written");
            assert_eq!(kept_id(dir.path(), "boot-b"), None, "{bad:?}");
        }
    }

    #[test]
    fn the_kept_id_is_the_one_the_kernels_btf_gives() {
        let Ok(btf) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipped: the kernel has no BTF");
            return;
        };
        let scanned = super::super::btf_scan::func_id(&btf, KFUNC);
        // Found (and kept), then read back.
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(kfunc_id_in(Some(dir.path())), scanned);
        assert_eq!(kfunc_id_in(Some(dir.path())), scanned);
        assert!(dir.path().join(KEPT).exists());
        // What is kept for this boot is what is used.
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
        keep_id(dir.path(), boot.trim(), Some(12345));
        assert_eq!(kfunc_id_in(Some(dir.path())), Some(12345));
    }
}

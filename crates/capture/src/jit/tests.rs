//! The JIT state's file checks and lookups, on files made here.
use super::*;
use std::os::unix::fs::{MetadataExt, symlink};

#[test]
fn only_regular_files_of_the_target_user_or_root_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let me = std::process::id();
    let good = dir.path().join("perf-1.map");
    std::fs::write(&good, "1000 10 f\n").unwrap();
    assert!(open_map(me, &good).is_ok());

    let link = dir.path().join("perf-2.map");
    symlink(&good, &link).unwrap();
    assert!(
        matches!(open_map(me, &link), Err(MapRefused::Open { .. })),
        "a symlink is not followed"
    );

    let fifo = dir.path().join("perf-3.map");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert!(matches!(
        open_map(me, &fifo),
        Err(MapRefused::NotRegular(_))
    ));

    // A file last written before the process started is a dead process's under the same pid
    // (node's and .NET's maps stay in /tmp after them).
    let stale = dir.path().join("perf-5.map");
    std::fs::write(&stale, "1000 10 f\n").unwrap();
    let file = std::fs::File::options().write(true).open(&stale).unwrap();
    let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    file.set_modified(long_ago).unwrap();
    assert!(matches!(open_map(me, &stale), Err(MapRefused::Stale(_))));
    file.set_modified(std::time::SystemTime::now()).unwrap();
    assert!(
        open_map(me, &stale).is_ok(),
        "rewritten since: the process's own"
    );

    // A file of another user (only testable as root, who may chown).
    let our_uid = std::fs::metadata(format!("/proc/{me}")).unwrap().uid();
    if our_uid == 0 {
        let other = dir.path().join("perf-4.map");
        std::fs::write(&other, "1000 10 f\n").unwrap();
        std::os::unix::fs::chown(&other, Some(4242), None).unwrap();
        assert!(matches!(
            open_map(me, &other),
            Err(MapRefused::WrongOwner { owner: 4242, .. })
        ));
    }
}

#[test]
fn perfinfo_images_are_used_only_where_the_process_maps_them() {
    let me = std::process::id();
    let maps = crate::process::read_maps(me).unwrap();
    let exe = maps
        .iter()
        .find(|m| m.offset == 0 && m.path.starts_with('/'))
        .expect("a file mapped from offset 0");
    // Below mmap_min_addr: never mapped.
    let unmapped = 0x1000u64;
    assert!(!maps.iter().any(|m| m.start <= unmapped && unmapped < m.end));
    let lines = format!(
        "ImageLoad;/nowhere/Stale.dll;{{1}};{unmapped:016X};\n\
         ImageLoad;/nowhere/Other.dll;{{2}};{:016X};\n\
         ImageLoad;{};{{3}};{:016X};\n\
         ImageLoad;/nowhere/IlOnly.dll;{{4}};0000000000000000;\n",
        exe.start, exe.path, exe.start
    );
    let path = format!("/tmp/perfinfo-{}.map", namespace_pid(me));
    std::fs::write(&path, lines).unwrap();
    let mut maps = JitMaps::new(rootline_image::ModuleBudget::new());
    let p = maps.process(me);
    p.refresh();
    let _ = std::fs::remove_file(&path);
    let errors = p.image_errors.clone();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[0].contains("not mapped at its perfinfo base"),
        "{errors:?}"
    );
    assert!(errors[1].contains("not this image"), "{errors:?}");
    assert!(errors[2].contains("not a 64-bit PE file"), "{errors:?}");
    assert!(p.images.is_empty());
}

#[test]
fn this_process_has_its_own_namespace_pid_and_map_path() {
    let me = std::process::id();
    // The test runs in the initial PID namespace or in a container: either way the last
    // NSpid entry is what the process itself sees as its pid.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let own: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last()?.parse().ok())
        .unwrap_or(me);
    assert_eq!(namespace_pid(me), own);
    assert_eq!(
        perf_map_path(me),
        PathBuf::from(format!("/proc/{me}/root/tmp/perf-{own}.map"))
    );
}

#[test]
fn code_read_at_the_sample_is_used_where_it_covers_the_bytes_asked() {
    let words = [
        (0x1000, u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8])),
        (0x2000, u64::from_le_bytes([9, 10, 11, 12, 13, 14, 15, 16])),
    ];
    assert_eq!(
        sample_code_at(&words, 0x1000, 8),
        Some(&[1, 2, 3, 4, 5, 6, 7, 8][..])
    );
    assert_eq!(
        sample_code_at(&words, 0x2003, 5),
        Some(&[12, 13, 14, 15, 16][..])
    );
    // Past a word's 8 bytes, before the first, or between two: not held.
    assert_eq!(sample_code_at(&words, 0x2004, 5), None);
    assert_eq!(sample_code_at(&words, 0xfff, 2), None);
    assert_eq!(sample_code_at(&words, 0x1800, 1), None);
    assert_eq!(sample_code_at(&[], 0x1000, 1), None);
}

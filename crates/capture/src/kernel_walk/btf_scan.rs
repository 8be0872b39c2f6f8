//! Finding one function's id in the kernel's BTF without parsing all of it. The loader (aya)
//! parses `/sys/kernel/btf/vmlinux` into its own structures, which it keeps private; the kfunc
//! id [`super::task_work`] needs is one lookup, and a second full parse cost as much as the
//! first (about 20 ms). This walks the type section record by record, reading only each
//! record's kind, name and length.

/// BTF's magic number (`BTF_MAGIC`), as the running (little-endian) kernel writes it.
const MAGIC: u16 = 0xeb9f;
/// `BTF_KIND_FUNC`.
const KIND_FUNC: u32 = 12;
/// Bytes of every type record's common part (`struct btf_type`).
const RECORD_HEAD: usize = 12;

/// The id of the `BTF_KIND_FUNC` type named `name` in BTF `data` (native byte order); None when
/// there is none, or when `data` is not BTF this reader knows (a kind it cannot step over,
/// sections out of bounds).
pub(super) fn func_id(data: &[u8], name: &str) -> Option<u32> {
    let u32_at = |at: usize| -> Option<u32> {
        let bytes = data.get(at..at.checked_add(4)?)?;
        Some(u32::from_ne_bytes(bytes.try_into().ok()?))
    };
    if u16::from_ne_bytes(data.get(0..2)?.try_into().ok()?) != MAGIC {
        return None;
    }
    let header_len = usize::try_from(u32_at(4)?).ok()?;
    let section = |off: usize| -> Option<&[u8]> {
        let start = header_len.checked_add(usize::try_from(u32_at(off)?).ok()?)?;
        let len = usize::try_from(u32_at(off + 4)?).ok()?;
        data.get(start..start.checked_add(len)?)
    };
    let (types, strings) = (section(8)?, section(16)?);
    let wanted = name.as_bytes();
    let name_is = |offset: u32| {
        let Some(rest) = usize::try_from(offset).ok().and_then(|o| strings.get(o..)) else {
            return false;
        };
        rest.len() > wanted.len() && rest.starts_with(wanted) && rest[wanted.len()] == 0
    };
    let mut at = 0usize;
    let mut id = 1u32;
    while at < types.len() {
        let word = |i: usize| -> Option<u32> {
            let bytes = types.get(at + 4 * i..at + 4 * i + 4)?;
            Some(u32::from_ne_bytes(bytes.try_into().ok()?))
        };
        let (name_off, info) = (word(0)?, word(1)?);
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        if kind == KIND_FUNC && name_is(name_off) {
            return Some(id);
        }
        let extra = match kind {
            // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
            2 | 7..=12 | 16 | 18 => 0,
            // INT, VAR, DECL_TAG
            1 | 14 | 17 => 4,
            // ARRAY
            3 => 12,
            // STRUCT, UNION, DATASEC, ENUM64
            4 | 5 | 15 | 19 => 12 * vlen,
            // ENUM, FUNC_PROTO
            6 | 13 => 8 * vlen,
            _ => return None,
        };
        at = at.checked_add(RECORD_HEAD + extra)?;
        id = id.checked_add(1)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: header, then `types`, then `strings`.
    fn blob(types: &[u32], strings: &[u8]) -> Vec<u8> {
        let type_len = (types.len() * 4) as u32;
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_ne_bytes());
        out.extend_from_slice(&[1, 0]); // version, flags
        for word in [24, 0, type_len, type_len, strings.len() as u32] {
            out.extend_from_slice(&u32::to_ne_bytes(word));
        }
        for word in types {
            out.extend_from_slice(&word.to_ne_bytes());
        }
        out.extend_from_slice(strings);
        out
    }

    #[test]
    fn finds_the_function_past_records_of_every_length() {
        let strings = b"\0int\0s\0f\0g\0";
        let types = [
            1,
            1 << 24,
            4,
            0x0100_0020, // 1: INT "int", 4 more bytes
            5,
            (4 << 24) | 2,
            8,
            0,
            1,
            0,
            0,
            1,
            32, // 2: STRUCT "s", two members
            0,
            (13 << 24) | 1,
            1,
            0,
            1, // 3: FUNC_PROTO, one parameter
            9,
            12 << 24,
            3, // 4: FUNC "g"
            7,
            12 << 24,
            3, // 5: FUNC "f"
        ];
        let data = blob(&types, strings);
        assert_eq!(func_id(&data, "f"), Some(5));
        assert_eq!(func_id(&data, "g"), Some(4));
        // A struct of that name is not a function; a prefix is not the name.
        assert_eq!(func_id(&data, "s"), None);
        assert_eq!(func_id(&data, "in"), None);
        // Cut anywhere, or with an unknown kind: no answer and no panic.
        for len in 0..data.len() {
            assert!(func_id(&data[..len], "f").is_none_or(|id| id == 5));
        }
        let mut unknown = types;
        unknown[1] = 31 << 24;
        assert_eq!(func_id(&blob(&unknown, strings), "f"), None);
    }

    #[test]
    fn agrees_with_the_loaders_parse_of_the_running_kernel() {
        let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipped: this kernel has no /sys/kernel/btf/vmlinux");
            return;
        };
        let btf = aya::Btf::from_sys_fs().expect("the loader parses the kernel's BTF");
        for name in [
            super::super::task_work::KFUNC,
            "bpf_get_current_task_btf",
            "vfs_read",
        ] {
            let theirs = btf
                .id_by_type_name_kind(name, aya_obj::btf::BtfKind::Func)
                .ok();
            assert_eq!(func_id(&data, name), theirs, "{name}");
        }
        assert_eq!(func_id(&data, "no_such_function_anywhere"), None);
    }
}

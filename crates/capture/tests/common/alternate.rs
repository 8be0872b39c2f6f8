//! Judging a recording of `tests/c/alternate.c`: outer frames that change under an unchanged
//! inner stack.

use rootline_profile::Profile;

/// Stacks in a leaf of `alternate.c` (recursing `depth` levels): whole and paired truly
/// (spin_a under outer_a, spin_b under outer_b), wrong (each described), and marked truncated.
#[derive(Debug, Default)]
pub struct Alternation {
    pub whole: u64,
    pub wrong: Vec<String>,
    pub truncated: u64,
}

/// Judges every stack of `p` that ends in spin_a or spin_b.
pub fn judge(p: &Profile, depth: usize) -> Alternation {
    let mut a = Alternation::default();
    let mut frames = Vec::new();
    for i in 0..p.samples().len() {
        p.stack_frames_root_first(p.samples().stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| p.frame_name(f)).collect();
        let Some(leaf) = names.iter().position(|&n| n == "spin_a" || n == "spin_b") else {
            continue;
        };
        if names[0].starts_with("[truncated") {
            a.truncated += 1;
            continue;
        }
        let outer = if names[leaf] == "spin_a" {
            "outer_a"
        } else {
            "outer_b"
        };
        let ok = names.get(3) == Some(&"main")
            && names.get(4) == Some(&outer)
            && leaf == 5 + depth
            && names[5..leaf].iter().all(|&n| n == "recurse");
        if ok {
            a.whole += 1;
        } else {
            let head: Vec<_> = names.iter().take(6).collect();
            a.wrong
                .push(format!("{head:?} … {} (at {leaf})", names[leaf]));
        }
    }
    a
}

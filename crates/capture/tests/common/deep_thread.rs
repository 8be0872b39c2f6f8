//! The verdict on a sample of `tests/c/deep.c` run on a second thread (`deep DEPTH SECONDS
//! thread`), for tests that record it (included by path).

use rootline_profile::Profile;

/// How a sample whose leaf is `spin` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeepStack {
    /// `clone3 … worker`, `recurse` × depth, `spin`: whole and true.
    Whole,
    /// Cut at an explicit `[truncated: …]` frame, with fewer `recurse` frames than the depth.
    Truncated,
    /// Anything else: a wrong stack.
    Wrong,
}

/// The verdict on a sample whose frames, root first, are `names`, of a recursion `depth` deep;
/// None when its leaf is not `spin`.
pub fn deep_stack(names: &[&str], depth: usize) -> Option<DeepStack> {
    if names.last() != Some(&"spin") {
        return None;
    }
    let rooted = names.first().is_some_and(|n| n.ends_with("clone3"));
    let recursion = names.iter().filter(|&&n| n == "recurse").count();
    let worker = names.iter().position(|&n| n == "worker");
    Some(
        if rooted && recursion == depth && worker.is_some_and(|w| names.len() == w + depth + 2) {
            DeepStack::Whole
        } else if names[0].starts_with("[truncated") && recursion < depth {
            DeepStack::Truncated
        } else {
            DeepStack::Wrong
        },
    )
}

/// Calls `each` with every sample's frame names, root first.
pub fn each_stack(profile: &Profile, mut each: impl FnMut(&[&str])) {
    let samples = profile.samples();
    let mut frames = Vec::new();
    for i in 0..samples.len() {
        profile.stack_frames_root_first(samples.stacks[i], &mut frames);
        let names: Vec<&str> = frames.iter().map(|&f| profile.frame_name(f)).collect();
        each(&names);
    }
}

/// The command line running the built `deep` program (through `launcher` first, when given)
/// `depth` levels deep on a second thread for `seconds`.
pub fn deep_command(
    launcher: Option<&std::path::Path>,
    deep: &std::path::Path,
    depth: usize,
    seconds: &str,
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = launcher.map(Into::into).into_iter().collect();
    args.extend([
        deep.into(),
        depth.to_string().into(),
        seconds.into(),
        "thread".into(),
    ]);
    args
}

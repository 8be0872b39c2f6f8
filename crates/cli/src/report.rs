//! `rootline report IN [--top N] [--tree] [--tiers]`: a text summary of a profile.
//!
//! Counts are taken from one value column (the first `samples` column by default). Self time goes to
//! the leaf-most frame that is real code (producer pseudo-frames such as `CPU_TIME` are skipped);
//! total time counts a function once per sample however often it recurses. Runs of recursion are
//! folded for display only (`f ×1000`); the profile itself is never shortened.
//!
//! The hottest paths are shown as they read: identical displayed paths (stacks that differ only by
//! thread or by address within the same functions) are one entry, and the language runtime's
//! start-up frames are left out unless asked for (see [`startup_len`]).
//!
//! Functions are counted by the name they show, so one .NET method compiled at several code tiers
//! is one line; `--tiers` splits the self time of the hottest such methods by tier
//! (`Calls::Spin(int32) [OptimizedTier1OSR]`).

// Keys are frame names, hashed once per frame of every distinct stack: a fast hash.
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{Result, bail};
use rootline_profile::{FrameId, FrameKind, Profile, StackId, StringId};

use crate::input;

/// Arguments of `rootline report`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The profile to summarise (any readable format).
    pub input: PathBuf,
    /// How many functions and hot paths to list.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Also print the call tree (recursion folded), hiding nodes under --min-percent.
    #[arg(long)]
    pub tree: bool,
    /// Smallest share of the total, in percent, that --tree shows.
    #[arg(long, default_value_t = 1.0, value_name = "PCT")]
    pub min_percent: f64,
    /// The value column to count (e.g. samples, cpu-ns, alloc-bytes; with `record --off-cpu`
    /// also off-cpu-ns, and wall-ns: on- plus off-CPU time); default: samples, else the first.
    #[arg(long, value_name = "NAME")]
    pub value: Option<String>,
    /// Input format, overriding the extension and content of INPUT.
    #[arg(long, value_name = "F")]
    pub input_format: Option<String>,
    /// Also list the functions whose share moved most since this earlier profile.
    #[arg(long, value_name = "BEFORE")]
    pub diff: Option<PathBuf>,
    /// Show the runtime's start-up frames (_start, __libc_start_main, std::rt::lang_start…,
    /// start_thread, clone3) at the root of the hottest paths; hidden by default.
    #[arg(long)]
    pub show_startup: bool,
    /// Also list the self time of the hottest functions per JIT code tier (.NET's QuickJitted,
    /// OptimizedTier1, OptimizedTier1OSR, ReadyToRun…).
    #[arg(long)]
    pub tiers: bool,
}

/// Runs `rootline report`.
pub fn run(args: Args) -> Result<()> {
    let profile = input::read_profile(&args.input, args.input_format.as_deref())?;
    let column = match &args.value {
        Some(name) => match input::find_column(&profile, name) {
            Some(c) => Some(c),
            None => bail!(
                "{} has no value column {name:?}; it has: {}",
                args.input.display(),
                input::column_names(&profile)
            ),
        },
        None => input::default_column(&profile),
    };
    let stdout = io::stdout();
    let mut out = stdout.lock();
    write_report(&profile, column, args.top, args.show_startup, &mut out)?;
    if args.tiers {
        writeln!(out)?;
        write_tiers(&profile, column, args.top, &mut out)?;
    } else if profile.functions().iter().any(|f| f.tier.is_some()) {
        writeln!(
            out,
            "\n(the profile records JIT code tiers; --tiers shows self time per tier)"
        )?;
    }
    if args.tree {
        writeln!(out)?;
        write_tree(&profile, column, args.min_percent, &mut out)?;
    }
    if let Some(before_path) = &args.diff {
        let before = input::read_profile(before_path, None)?;
        writeln!(out)?;
        crate::diff::write_text(
            &before,
            &profile,
            crate::diff::Labels::new(before_path, &args.input),
            args.value.as_deref(),
            args.top,
            &mut out,
        )?;
    }
    Ok(())
}

/// Sum of the counted value per distinct stack.
fn per_stack(profile: &Profile, column: Option<usize>) -> HashMap<StackId, i64> {
    let samples = profile.samples();
    let mut sums: HashMap<StackId, i64> = HashMap::new();
    for (i, &stack) in samples.stacks.iter().enumerate() {
        let value = column.map_or(1, |c| samples.values[c][i]);
        let sum = sums.entry(stack).or_default();
        *sum = sum.saturating_add(value);
    }
    sums
}

fn is_code(profile: &Profile, frame: FrameId) -> bool {
    !matches!(profile.frame(frame).kind, FrameKind::Pseudo)
}

fn percent(part: i64, whole: i64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Writes the header, the top functions by self and total, and the hottest paths (without the
/// runtime's start-up frames unless `show_startup`).
pub fn write_report(
    profile: &Profile,
    column: Option<usize>,
    top: usize,
    show_startup: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let meta = &profile.metadata;
    let unit = column.map_or_else(
        || "samples".to_owned(),
        |c| {
            let t = &profile.sample_types()[c];
            format!("{} ({})", t.name, t.unit)
        },
    );
    let sums = per_stack(profile, column);
    let grand: i64 = sums.values().copied().fold(0, i64::saturating_add);
    let producer = if meta.producer.is_empty() {
        "unknown producer"
    } else {
        &meta.producer
    };
    writeln!(out, "Profile from {producer}")?;
    writeln!(
        out,
        "  {} sample records on {} threads, {} distinct stacks; counting {unit}, total {grand}",
        profile.samples().len(),
        profile.threads().len(),
        sums.len(),
    )?;
    if meta.end_time_ns > meta.start_time_ns {
        let secs = (meta.end_time_ns - meta.start_time_ns) as f64 / 1e9;
        writeln!(out, "  duration {secs:.3} s")?;
    }
    let extra = |key: &str| meta.extra.get(key).map_or("0", String::as_str);
    if meta.extra.contains_key("off_cpu.switches") {
        let min_us = extra("off_cpu.min_ns").parse::<u64>().unwrap_or(0) / 1000;
        writeln!(
            out,
            "  off-CPU: {} switch-outs, {} intervals with stacks, {} under {min_us} µs counted \
             as [off-cpu: short, not unwound], {} over the rate cap ({}/s) counted as [off-cpu: \
             over the rate cap, not unwound], {} dropped unmatched; --value wall-ns counts \
             cpu + off_cpu",
            extra("off_cpu.switches"),
            extra("off_cpu.unwound"),
            extra("off_cpu.below_min"),
            extra("off_cpu.unsampled"),
            extra("off_cpu.max_rate"),
            extra("off_cpu.unmatched"),
        )?;
    }
    let ticks = extra("nettrace.allocation_ticks");
    if ticks != "0" {
        writeln!(
            out,
            "  allocations: {ticks} GC allocation ticks (the runtime sends one each time about \
             100 KB were allocated, with the stack and type of the allocation that crossed the \
             mark); --value alloc-bytes counts the bytes each tick stands for, alloc-count the \
             ticks"
        )?;
    }
    if meta.lost_samples + meta.dropped_samples + meta.truncated_samples > 0 {
        writeln!(
            out,
            "  lost {}, dropped {}, truncated {}",
            meta.lost_samples, meta.dropped_samples, meta.truncated_samples
        )?;
    }
    for (key, value) in meta
        .extra
        .iter()
        .filter(|(k, _)| k.starts_with("truncated."))
    {
        writeln!(out, "    {}: {value}", &key["truncated.".len()..])?;
    }

    // Self and total per function name (counted by the name's id: equal names share one).
    let mut self_by_id: HashMap<StringId, i64> = HashMap::new();
    let mut total_by_id: HashMap<StringId, i64> = HashMap::new();
    let mut seen: HashSet<StringId> = HashSet::new();
    for (&stack, &value) in &sums {
        seen.clear();
        let mut leaf_done = false;
        for frame in profile.stack_frames(stack) {
            if !is_code(profile, frame) {
                continue;
            }
            let name = profile.frame_name_id(frame);
            if !leaf_done {
                *self_by_id.entry(name).or_default() += value;
                leaf_done = true;
            }
            if seen.insert(name) {
                *total_by_id.entry(name).or_default() += value;
            }
        }
    }
    let by_name = |by_id: HashMap<StringId, i64>| -> HashMap<&str, i64> {
        by_id
            .into_iter()
            .map(|(id, value)| (profile.string(id), value))
            .collect()
    };
    let (self_time, total_time) = (by_name(self_by_id), by_name(total_by_id));
    write_top(
        out,
        "Top functions by self",
        &self_time,
        &total_time,
        grand,
        top,
        true,
    )?;
    write_top(
        out,
        "Top functions by total",
        &total_time,
        &self_time,
        grand,
        top,
        false,
    )?;

    // Identical displayed paths are one entry, found by their names' ids with recursion folded
    // (equal names share one id, so equal ids are equal displayed paths); only the paths shown
    // are written out. (folded path, value, fewest and most frames)
    let mut hot: Vec<(FoldedPath, i64, usize, usize)> = Vec::new();
    let mut index: HashMap<FoldedPath, usize> = HashMap::new();
    let mut frames = Vec::new();
    let mut path = FoldedPath::new();
    let mut startup_names: HashMap<StringId, bool> = HashMap::new();
    let mut stacks: Vec<(StackId, i64)> = sums.into_iter().collect();
    stacks.sort();
    for (stack, value) in stacks {
        profile.stack_frames_root_first(stack, &mut frames);
        let hidden = if show_startup {
            0
        } else {
            startup_len(profile, &frames, &mut startup_names)
        };
        let shown = &frames[hidden..];
        fold_recursion(profile, shown, &mut path);
        match index.get(path.as_slice()) {
            Some(&i) => {
                let entry = &mut hot[i];
                entry.1 = entry.1.saturating_add(value);
                entry.2 = entry.2.min(shown.len());
                entry.3 = entry.3.max(shown.len());
            }
            None => {
                index.insert(path.clone(), hot.len());
                hot.push((path.clone(), value, shown.len(), shown.len()));
            }
        }
    }
    let display = |path: &[(StringId, u32)]| {
        let mut out = String::new();
        for (i, &(name, run)) in path.iter().enumerate() {
            if i > 0 {
                out.push_str(" → ");
            }
            push_run(&mut out, profile.string(name), run, run);
        }
        out
    };
    // The `top` heaviest (those tied with the last of them too, ordered by their text below).
    hot.sort_by_key(|h| std::cmp::Reverse(h.1));
    let cut = top
        .checked_sub(1)
        .and_then(|last| hot.get(last))
        .map_or(i64::MIN, |h| h.1);
    let mut hot: Vec<(String, i64, usize, usize)> = hot
        .into_iter()
        .take_while(|h| top > 0 && h.1 >= cut)
        .map(|(p, v, fewest, most)| (display(&p), v, fewest, most))
        .collect();
    hot.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let startup = if show_startup {
        "start-up frames shown"
    } else {
        "runtime start-up frames hidden (the root up to the last of them), --show-startup shows them"
    };
    writeln!(
        out,
        "\nHottest paths (root → leaf, recursion folded for display, identical paths merged; {startup})"
    )?;
    for (rank, (path, value, fewest, most)) in hot.iter().take(top).enumerate() {
        let depth = if fewest == most {
            format!("{most}")
        } else {
            format!("{fewest}–{most}")
        };
        writeln!(
            out,
            "  {:>2}. {:6.2}%  {value}  [{depth} frames]\n      {path}",
            rank + 1,
            percent(*value, grand),
        )?;
    }
    Ok(())
}

/// Writes the self time of the `top` hottest functions that have code tiers, split by tier:
/// `Calls::Spin(int32) [OptimizedTier1OSR]`, hottest first.
pub fn write_tiers(
    profile: &Profile,
    column: Option<usize>,
    top: usize,
    out: &mut dyn Write,
) -> Result<()> {
    let sums = per_stack(profile, column);
    let grand: i64 = sums.values().copied().fold(0, i64::saturating_add);
    // Self time per (name, tier) and per name, of leaf frames that have a tier.
    let mut per_tier: HashMap<(&str, &str), i64> = HashMap::new();
    let mut per_name: HashMap<&str, i64> = HashMap::new();
    for (&stack, &value) in &sums {
        let Some(leaf) = profile.stack_frames(stack).find(|&f| is_code(profile, f)) else {
            continue;
        };
        let Some(tier) = profile.function(profile.frame(leaf).function).tier else {
            continue;
        };
        let name = profile.frame_name(leaf);
        *per_tier.entry((name, profile.string(tier))).or_default() += value;
        *per_name.entry(name).or_default() += value;
    }
    writeln!(
        out,
        "Self time by code tier (hottest functions that have tiers)"
    )?;
    if per_name.is_empty() {
        writeln!(out, "  (no function in this profile records a code tier)")?;
        return Ok(());
    }
    let mut names: Vec<(&str, i64)> = per_name.into_iter().collect();
    names.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    writeln!(out, "  {:>8}  function [tier]", "self%")?;
    for (name, _) in names.into_iter().take(top) {
        let mut tiers: Vec<(&str, i64)> = per_tier
            .iter()
            .filter(|((n, _), _)| *n == name)
            .map(|(&(_, t), &v)| (t, v))
            .collect();
        tiers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (tier, value) in tiers {
            writeln!(out, "  {:>7.2}%  {name} [{tier}]", percent(value, grand))?;
        }
    }
    Ok(())
}

/// Whether `name` is a frame of the language runtime's start-up: the C library's process and
/// thread entry (`_start`, `__libc_start_main`, `start_thread`, `clone3`, …) and Rust's chain from
/// there to the program's `main` or a thread's closure (`std::rt::lang_start…`, the thread
/// start-up in `std::sys`/`std::thread`, `__rust_begin_short_backtrace`, the unwinding guards and
/// `FnOnce::call_once` shims between them).
fn is_startup(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "_start",
        "__libc_start_main",
        "__libc_start_main_impl",
        "__libc_start_call_main",
        "start_thread",
        "clone",
        "clone3",
        "__clone",
        "__clone3",
        "thread_start",
        "__rust_try",
    ];
    const PREFIXES: &[&str] = &[
        "std::rt::",
        "std::sys::backtrace::__rust_begin_short_backtrace",
        "std::sys::pal::unix::thread::",
        "std::sys::thread::",
        "std::thread::Builder::spawn_unchecked_",
        "std::thread::lifecycle::",
        "std::thread::local::",
        "std::panicking::",
        "std::panic::catch_unwind",
        "core::ops::function::",
    ];
    // A closure or function called through the `FnOnce`/`Fn` traits by the runtime (`<&dyn Fn() as
    // FnOnce<()>>::call_once`, `<Box<F> as FnOnce>::call_once`).
    let call_shim = name.starts_with('<') && name.contains(" as core::ops::function::Fn");
    // glibc's internal aliases (`__GI___clone3`) are the same functions; a method's path may be
    // written `<Type>::method`.
    let name = name.strip_prefix("__GI_").unwrap_or(name);
    let path = name.trim_start_matches('<');
    EXACT.contains(&name) || PREFIXES.iter().any(|p| path.starts_with(p)) || call_shim
}

/// How many frames at the root of `frames` (root first) are the runtime's start-up: the leading
/// run of start-up frames (see [`is_startup`]; producer pseudo-frames within it do not end it),
/// up to and including the last start-up frame of that run. A `main` counts when the next frame
/// is start-up too (Rust's `main` calling `std::rt::lang_start`); a C program's `main` is its own
/// code and stays. At least the leaf is always kept.
/// `known` remembers each name's answer (a report asks about the same root frames for every
/// stack).
fn startup_len(
    profile: &Profile,
    frames: &[FrameId],
    known: &mut HashMap<StringId, bool>,
) -> usize {
    let mut startup = |frame: FrameId| {
        let id = profile.frame_name_id(frame);
        *known
            .entry(id)
            .or_insert_with(|| is_startup(profile.string(id)))
    };
    let mut hidden = 0;
    for (i, &frame) in frames.iter().enumerate() {
        if !is_code(profile, frame) {
            continue;
        }
        let next_is_startup = frames.get(i + 1).is_some_and(|&f| startup(f));
        if startup(frame) || (profile.frame_name(frame) == "main" && next_is_startup) {
            hidden = i + 1;
        } else {
            break;
        }
    }
    hidden.min(frames.len().saturating_sub(1))
}

fn write_top(
    out: &mut dyn Write,
    title: &str,
    primary: &HashMap<&str, i64>,
    secondary: &HashMap<&str, i64>,
    grand: i64,
    top: usize,
    primary_is_self: bool,
) -> Result<()> {
    let mut rows: Vec<(&str, i64)> = primary.iter().map(|(&n, &v)| (n, v)).collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    writeln!(out, "\n{title}")?;
    writeln!(out, "  {:>8} {:>8}  function", "self%", "total%")?;
    for (name, value) in rows.into_iter().take(top) {
        let other = secondary.get(name).copied().unwrap_or(0);
        let (self_v, total_v) = if primary_is_self {
            (value, other)
        } else {
            (other, value)
        };
        writeln!(
            out,
            "  {:>7.2}% {:>7.2}%  {name}",
            percent(self_v, grand),
            percent(total_v, grand)
        )?;
    }
    Ok(())
}

/// A path's functions, root first, as `(name's id, recursion run length)`.
type FoldedPath = Vec<(StringId, u32)>;

/// Collapses runs of the same function into `(name's id, run length)`, into `out`.
fn fold_recursion(profile: &Profile, frames: &[FrameId], out: &mut FoldedPath) {
    out.clear();
    for &frame in frames {
        let name = profile.frame_name_id(frame);
        match out.last_mut() {
            Some((last, run)) if *last == name => *run += 1,
            _ => out.push((name, 1)),
        }
    }
}

fn display_run(name: &str, min_run: u32, max_run: u32) -> String {
    let mut out = String::new();
    push_run(&mut out, name, min_run, max_run);
    out
}

/// Appends a function's name with its recursion run (`name ×3`, `name ×2–5`; no mark for 1).
fn push_run(out: &mut String, name: &str, min_run: u32, max_run: u32) {
    use std::fmt::Write as _;
    out.push_str(name);
    let _ = match (min_run, max_run) {
        (1, 1) => Ok(()),
        (a, b) if a == b => write!(out, " ×{a}"),
        (a, b) => write!(out, " ×{a}–{b}"),
    };
}

/// One node of the display call tree.
struct TreeNode<'p> {
    name: &'p str,
    total: i64,
    min_run: u32,
    max_run: u32,
    children: Vec<usize>,
}

/// Writes the call tree from the roots, children by descending total, recursion runs folded.
pub fn write_tree(
    profile: &Profile,
    column: Option<usize>,
    min_percent: f64,
    out: &mut dyn Write,
) -> Result<()> {
    let sums = per_stack(profile, column);
    let grand: i64 = sums.values().copied().fold(0, i64::saturating_add);
    let mut nodes: Vec<TreeNode> = vec![TreeNode {
        name: "(all)",
        total: 0,
        min_run: 1,
        max_run: 1,
        children: Vec::new(),
    }];
    let mut index: HashMap<(usize, StringId), usize> = HashMap::new();
    let mut frames = Vec::new();
    let mut path = FoldedPath::new();
    let mut stacks: Vec<(StackId, i64)> = sums.into_iter().collect();
    stacks.sort();
    for (stack, value) in stacks {
        profile.stack_frames_root_first(stack, &mut frames);
        nodes[0].total += value;
        let mut at = 0;
        fold_recursion(profile, &frames, &mut path);
        for &(name, run) in &path {
            let next = *index.entry((at, name)).or_insert_with(|| {
                nodes.push(TreeNode {
                    name: profile.string(name),
                    total: 0,
                    min_run: run,
                    max_run: run,
                    children: Vec::new(),
                });
                let id = nodes.len() - 1;
                nodes[at].children.push(id);
                id
            });
            let node = &mut nodes[next];
            node.total += value;
            node.min_run = node.min_run.min(run);
            node.max_run = node.max_run.max(run);
            at = next;
        }
    }
    writeln!(
        out,
        "Call tree (total%, recursion folded; nodes under {min_percent}% hidden)"
    )?;
    let mut todo: Vec<(usize, usize)> = Vec::new();
    let mut roots = nodes[0].children.clone();
    roots.sort_by(|&a, &b| nodes[a].total.cmp(&nodes[b].total));
    todo.extend(roots.into_iter().map(|r| (r, 0)));
    while let Some((id, depth)) = todo.pop() {
        let node = &nodes[id];
        let share = percent(node.total, grand);
        if share < min_percent {
            continue;
        }
        writeln!(
            out,
            "{:>7.2}%  {}{}",
            share,
            "  ".repeat(depth),
            display_run(node.name, node.min_run, node.max_run)
        )?;
        let mut children = node.children.clone();
        children.sort_by(|&a, &b| nodes[a].total.cmp(&nodes[b].total));
        todo.extend(children.into_iter().map(|c| (c, depth + 1)));
    }
    Ok(())
}

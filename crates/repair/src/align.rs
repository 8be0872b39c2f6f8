//! Aligning one truncated stack against its neighbours: the core of repair, on plain frame arrays.
//!
//! Stacks here are code frames only, root first, as `u32` keys (the engine passes the frames'
//! function ids: the same method at another address still matches). A truncated stack `t` is the
//! leaf end of a longer stack whose base was cut. A donor `d` (a complete or already repaired sample
//! of the same thread) offers a base: with offset `k` the repaired stack is `d[..k] ++ t`.
//!
//! **Which offsets.** For every `k >= 1`, `overlap(k)` is the number of frames from `d[k]` on that
//! agree with `t` from its root end. The candidate offsets of a donor are those with the *largest*
//! overlap, provided it is at least `min_overlap`. Recursion (`R R R …` in both stacks) gives several
//! offsets with the same largest overlap; so can a donor that happens to repeat frames. All overlaps
//! come from one Z-function pass over `t ++ # ++ d`, O(|t| + |d|).
//!
//! **Which candidate.** Candidates of both donors are scored by *minimal change*: for each neighbour
//! `n` (previous and next donor), the frames that differ between the repaired stack `r` and `n` —
//! `|r| + |n| - 2·lcp(r, n)`, i.e. the spans that would end and begin between the two samples in a
//! timeline view. The candidate with the smallest sum wins; ties go to the smaller offset (fewer
//! re-attached frames), then to the previous donor. Each score is O(1) from the overlaps.
//!
//! **Confidence.** The repair is *exact* when all candidates give one and the same stack and the cut
//! did not fall inside a repetition. It is *ambiguous* (the least-change stack is still used, and
//! flagged as a guess) when candidates disagree, or when the cut stack's root end is a repeated unit
//! (`t[..q] == t[q..2q]`) or repeats the last frames of the re-attached base (`d[k-q..k] == t[..q]`),
//! for periods `q` up to 16: then the cut fell inside a recursion, and how many repetitions it hid is
//! something no neighbour can reveal — a neighbour's count is only the least-change guess.

/// Which neighbour gave the chosen base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The nearest complete or repaired sample before.
    Prev,
    /// The nearest complete (or, in the second pass, repaired) sample after.
    Next,
}

/// The chosen alignment of a truncated stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Alignment {
    /// The donor whose base is re-attached.
    pub side: Side,
    /// Number of donor frames re-attached below the truncated stack.
    pub offset: usize,
    /// Number of distinct repaired stacks the candidates would give.
    pub distinct: usize,
    /// The cut fell inside a repetition (recursion), so the count of hidden repetitions is a guess.
    pub inside_repetition: bool,
}

impl Alignment {
    /// True when the repaired stack is the only one the data allows.
    pub fn is_exact(&self) -> bool {
        self.distinct == 1 && !self.inside_repetition
    }
}

/// Longest repeating unit looked for at a cut.
const MAX_PERIOD: usize = 16;

/// True when `t` starts with two copies of a unit, or `base` ends with a copy of `t`'s first unit,
/// for a unit of up to [`MAX_PERIOD`] frames.
fn inside_repetition(t: &[u32], base: &[u32]) -> bool {
    (1..=MAX_PERIOD).any(|q| {
        let unit = &t[..q.min(t.len())];
        unit.len() == q
            && (t.get(q..2 * q) == Some(unit) || base.len() >= q && &base[base.len() - q..] == unit)
    })
}

const SEPARATOR: u64 = u64::MAX;

/// Scratch buffers reused across samples so alignment allocates nothing in steady state.
#[derive(Default)]
pub(crate) struct Aligner {
    joined: Vec<u64>,
    z: Vec<u32>,
    overlap_prev: Vec<u32>,
    overlap_next: Vec<u32>,
    candidates_prev: Vec<usize>,
    candidates_next: Vec<usize>,
}

impl Aligner {
    /// Aligns `t` against the donors; `None` when neither donor offers an overlap of at least
    /// `min_overlap` frames.
    pub fn align(
        &mut self,
        t: &[u32],
        prev: Option<&[u32]>,
        next: Option<&[u32]>,
        min_overlap: usize,
    ) -> Option<Alignment> {
        let min_overlap = min_overlap.max(1);
        let prev = prev.unwrap_or(&[]);
        let next = next.unwrap_or(&[]);
        let mut overlap_prev = std::mem::take(&mut self.overlap_prev);
        let mut overlap_next = std::mem::take(&mut self.overlap_next);
        self.overlaps(t, prev, &mut overlap_prev);
        self.overlaps(t, next, &mut overlap_next);
        candidates(&overlap_prev, min_overlap, &mut self.candidates_prev);
        candidates(&overlap_next, min_overlap, &mut self.candidates_next);
        let result = self.choose(t, prev, next, &overlap_prev, &overlap_next);
        self.overlap_prev = overlap_prev;
        self.overlap_next = overlap_next;
        result
    }

    /// `out[k] = lcp(d[k..], t)` for `k in 0..d.len()`, by the Z-function of `t ++ # ++ d`.
    fn overlaps(&mut self, t: &[u32], d: &[u32], out: &mut Vec<u32>) {
        out.clear();
        if d.is_empty() {
            return;
        }
        self.joined.clear();
        self.joined.extend(t.iter().map(|&f| u64::from(f)));
        self.joined.push(SEPARATOR);
        self.joined.extend(d.iter().map(|&f| u64::from(f)));
        z_function(&self.joined, &mut self.z);
        out.extend_from_slice(&self.z[t.len() + 1..]);
    }

    fn choose(
        &self,
        t: &[u32],
        prev: &[u32],
        next: &[u32],
        overlap_prev: &[u32],
        overlap_next: &[u32],
    ) -> Option<Alignment> {
        let common = lcp(prev, next);
        // |r| + |n| - 2 lcp(r, n), summed over the neighbours that exist.
        let cost = |side: Side, k: usize| -> usize {
            let r_len = k + t.len();
            let (own, own_overlap, other, other_overlap) = match side {
                Side::Prev => (prev, overlap_prev, next, overlap_next),
                Side::Next => (next, overlap_next, prev, overlap_prev),
            };
            let own_lcp = k + own_overlap[k] as usize;
            let mut cost = r_len + own.len() - 2 * own_lcp;
            if !other.is_empty() {
                let other_lcp = if common >= k {
                    k + other_overlap.get(k).map_or(0, |&o| o as usize)
                } else {
                    common
                };
                cost += r_len + other.len() - 2 * other_lcp;
            }
            cost
        };
        let prev_candidates = self.candidates_prev.iter().map(|&k| (Side::Prev, k));
        let next_candidates = self.candidates_next.iter().map(|&k| (Side::Next, k));
        let best = prev_candidates
            .chain(next_candidates)
            .min_by_key(|&(side, k)| (cost(side, k), k, side == Side::Next))?;
        // A next-donor candidate at k gives the same stack as a previous-donor one at k when the two
        // donors share their first k frames.
        let duplicates = self
            .candidates_next
            .iter()
            .filter(|&&k| common >= k && self.candidates_prev.binary_search(&k).is_ok())
            .count();
        let distinct = self.candidates_prev.len() + self.candidates_next.len() - duplicates;
        let base = match best.0 {
            Side::Prev => &prev[..best.1],
            Side::Next => &next[..best.1],
        };
        Some(Alignment {
            side: best.0,
            offset: best.1,
            distinct,
            inside_repetition: inside_repetition(t, base),
        })
    }
}

/// Offsets `k >= 1` whose overlap is the largest and at least `min_overlap`, ascending.
fn candidates(overlap: &[u32], min_overlap: usize, out: &mut Vec<usize>) {
    out.clear();
    let Some(&best) = overlap.iter().skip(1).max() else {
        return;
    };
    if (best as usize) < min_overlap {
        return;
    }
    out.extend(
        overlap
            .iter()
            .enumerate()
            .skip(1)
            .filter(|&(_, &o)| o == best)
            .map(|(k, _)| k),
    );
}

/// Length of the common prefix of two slices.
pub(crate) fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `z[i]` = length of the longest common prefix of `s` and `s[i..]` (`z[0] = 0`). Linear time.
fn z_function(s: &[u64], z: &mut Vec<u32>) {
    let n = s.len();
    z.clear();
    z.resize(n, 0);
    let (mut left, mut right) = (0usize, 0usize);
    for i in 1..n {
        let mut len = if i < right {
            (right - i).min(z[i - left] as usize)
        } else {
            0
        };
        while i + len < n && s[len] == s[i + len] {
            len += 1;
        }
        z[i] = len as u32;
        if i + len > right {
            left = i;
            right = i + len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn align(t: &[u32], prev: Option<&[u32]>, next: Option<&[u32]>) -> Option<Alignment> {
        Aligner::default().align(t, prev, next, 2)
    }

    #[test]
    fn z_function_matches_naive_overlaps() {
        let t = [3u32, 4, 3, 4, 5];
        let d = [1u32, 2, 3, 4, 3, 4, 3, 4, 5, 9, 3];
        let mut a = Aligner::default();
        let mut out = Vec::new();
        a.overlaps(&t, &d, &mut out);
        let naive: Vec<u32> = (0..d.len()).map(|k| lcp(&d[k..], &t) as u32).collect();
        assert_eq!(out, naive);
    }

    #[test]
    fn unique_offset_is_exact() {
        // whole: 1 2 3 4 5 6 7 8; cut to 4 5 6 7 8 (leaf 8); donor 1 2 3 4 5 6 9.
        let t = [4, 5, 6, 7, 8];
        let prev = [1, 2, 3, 4, 5, 6, 9];
        let a = align(&t, Some(&prev), None).unwrap();
        assert_eq!((a.side, a.offset, a.distinct), (Side::Prev, 3, 1));
        assert!(a.is_exact());
    }

    #[test]
    fn recursion_gives_several_offsets_and_least_change_wins() {
        // base 1 2, recursion 7 x5 in both neighbours, leaf 9; t = 7 7 7 8 (cut, leaf 8).
        let prev = [1, 2, 7, 7, 7, 7, 7, 9];
        let next = [1, 2, 7, 7, 7, 7, 7, 9];
        let t = [7, 7, 7, 8];
        let a = align(&t, Some(&prev), Some(&next)).unwrap();
        assert!(a.distinct > 1 && !a.is_exact());
        // Keeping five 7s, as both neighbours have, changes the least: offset 2 + 2 = 4.
        assert_eq!(a.offset, 4);
    }

    #[test]
    fn no_overlap_means_no_alignment() {
        assert_eq!(align(&[5, 6, 7], Some(&[1, 2, 3]), Some(&[1, 4])), None);
        assert_eq!(align(&[5, 6, 7], None, None), None);
        // A single agreeing frame is below the default minimum overlap of 2.
        assert_eq!(align(&[5, 6, 7], Some(&[1, 5, 9]), None), None);
    }

    #[test]
    fn donors_that_agree_give_one_distinct_stack() {
        let t = [4, 5, 6];
        let prev = [1, 2, 3, 4, 5, 9];
        let next = [1, 2, 3, 4, 5, 6, 10];
        let a = align(&t, Some(&prev), Some(&next)).unwrap();
        assert_eq!((a.offset, a.distinct), (3, 1));
        assert!(a.is_exact());
    }

    #[test]
    fn a_cut_inside_recursion_is_never_exact() {
        // The donor's run of 7s is shorter than the cut stack's: only one offset has the largest
        // overlap, but the number of 7s hidden below the cut is unknown.
        let prev = [1, 2, 7, 7, 9];
        let t = [7, 7, 7, 8];
        let a = align(&t, Some(&prev), None).unwrap();
        assert_eq!((a.offset, a.distinct), (2, 1));
        assert!(a.inside_repetition && !a.is_exact());
        // Mutual recursion (period 2) with a single visible unit: the base ends with the same unit.
        let prev = [1, 5, 6, 5, 6, 9];
        let t = [5, 6, 9, 4];
        let a = align(&t, Some(&prev), None).unwrap();
        assert_eq!(a.offset, 3);
        assert!(a.inside_repetition && !a.is_exact());
    }

    #[test]
    fn donors_that_disagree_are_ambiguous() {
        let t = [4, 5, 6];
        let prev = [1, 2, 3, 4, 5, 9];
        let next = [1, 8, 3, 4, 5, 6, 10];
        let a = align(&t, Some(&prev), Some(&next)).unwrap();
        assert_eq!(a.distinct, 2);
        assert_eq!(a.offset, 3);
    }
}

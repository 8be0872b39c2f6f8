//! Off-CPU intervals: each thread's switch-outs paired with the switch-in that ends them, and
//! with the kernel's sample of the switch-out when it took one.
//!
//! `PERF_RECORD_SWITCH` records say when a thread left the CPU (and whether it was preempted,
//! i.e. still runnable) and when it entered a CPU again: every interval, exactly. The
//! context-switch event samples a thread as it leaves the CPU (its user registers and stack as
//! they stay while it is off, and with the tracepoint the state it left in), just before the
//! switch-out record in the same ring. A thread leaves and enters in strict alternation, so the
//! switch-out at `t` is ended by the thread's first switch-in after `t`. Records of one thread
//! come from several CPUs' rings and may arrive in either order across passes, so samples and
//! records queue per thread until they pair.
//!
//! Cost is bounded: an interval shorter than the minimum is counted (and its time added to the
//! thread's `[off-cpu: short, not unwound]` frame) but its stack is not unwound; a switch the
//! kernel did not sample (the event's rate cap) is counted and its time added to the thread's
//! `[off-cpu: over the rate cap, not unwound]` frame.

use std::collections::VecDeque;

use foldhash::{HashMap as FastMap, HashMapExt};

use crate::perf_event::SwitchState;

/// Most switch-out samples kept per thread while they wait for their switch records (past it
/// the oldest go, counted as unmatched: their records were lost).
const MAX_QUEUED: usize = 64;
/// Most switch records kept per thread between two settlements: a pass over the rings may bring
/// thousands of a thread that switches often (records are small; its samples are capped).
const MAX_QUEUED_RECORDS: usize = 1 << 16;

/// Why a thread was off the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum OffReason {
    /// It left while still runnable (its time slice ended, a more urgent task woke, it yielded).
    Preempted,
    /// It slept, interruptibly: a sleep, a pipe or socket, a futex (a lock), poll.
    Sleeping,
    /// It waited uninterruptibly (disk I/O, a page read in, `vfork`, a kernel lock).
    Uninterruptible,
    /// It was stopped by a signal or a tracer.
    Stopped,
    /// It left of its own accord, in a state not told (no tracepoint) or not one of the above.
    Blocked,
    /// The sum of this thread's intervals below the minimum, not unwound.
    Short,
    /// The sum of this thread's intervals the kernel did not sample (over the rate cap), not
    /// unwound.
    Unsampled,
}

impl OffReason {
    /// The pseudo frame that marks the reason at the leaf of an off-CPU stack.
    pub fn frame_name(self) -> &'static str {
        use rootline_profile::pseudo;
        match self {
            OffReason::Preempted => pseudo::OFF_CPU_PREEMPTED,
            OffReason::Sleeping => pseudo::OFF_CPU_SLEEPING,
            OffReason::Uninterruptible => pseudo::OFF_CPU_UNINTERRUPTIBLE,
            OffReason::Stopped => pseudo::OFF_CPU_STOPPED,
            OffReason::Blocked => pseudo::OFF_CPU_BLOCKED,
            OffReason::Short => pseudo::OFF_CPU_SHORT,
            OffReason::Unsampled => pseudo::OFF_CPU_UNSAMPLED,
        }
    }

    /// The reason: from the state the kernel reported when there is one, else from the
    /// switch-out record's preempted flag.
    fn of(state: Option<SwitchState>, preempted: bool) -> OffReason {
        match (state, preempted) {
            (Some(SwitchState::Runnable), _) | (None, true) => OffReason::Preempted,
            (Some(SwitchState::Sleeping), _) => OffReason::Sleeping,
            (Some(SwitchState::Uninterruptible), _) => OffReason::Uninterruptible,
            (Some(SwitchState::Stopped), _) => OffReason::Stopped,
            (Some(SwitchState::Other), _) | (None, false) => OffReason::Blocked,
        }
    }
}

/// What an off-CPU sample weighs: nanoseconds off the CPU, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffWeight {
    pub nanos: i64,
    pub reason: OffReason,
}

/// Counts of off-CPU recording.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffCpuStats {
    /// Switch-outs seen (`PERF_RECORD_SWITCH` out records).
    pub switches: u64,
    /// Switch-out samples received (the kernel's stack copies).
    pub sampled: u64,
    /// Intervals weighed and unwound.
    pub unwound: u64,
    /// Nanoseconds off the CPU in unwound intervals.
    pub unwound_ns: u64,
    /// Intervals below the minimum: counted, not unwound.
    pub below_min: u64,
    /// Nanoseconds off the CPU in intervals below the minimum.
    pub below_min_ns: u64,
    /// Intervals at or above the minimum whose switch the kernel did not sample (over the rate
    /// cap, or throttled): their stacks are dropped, their time kept.
    pub unsampled: u64,
    /// Nanoseconds off the CPU in those intervals.
    pub unsampled_ns: u64,
    /// Switch-outs (and their samples) that never paired with a switch-in (the thread exited,
    /// or a record was lost): dropped.
    pub unmatched: u64,
    /// Intervals still open when recording ended, weighed until the end.
    pub open_at_end: u64,
}

/// A switch-out sample ready to unwind, with its weight.
pub(crate) struct Ready {
    pub raw: Vec<u8>,
    pub weight: OffWeight,
}

/// A thread's intervals that are counted without a stack since the last batch.
#[derive(Default, Clone, Copy)]
struct Unstacked {
    count: u64,
    nanos: u64,
    last: u64,
}

impl Unstacked {
    fn add(&mut self, start: u64, nanos: u64) {
        self.count += 1;
        self.nanos += nanos;
        self.last = start;
    }
}

#[derive(Default)]
struct ThreadSwitches {
    pid: u32,
    /// Switch-out records `(time, preempted)`.
    outs: VecDeque<(u64, bool)>,
    /// Switch-in times.
    ins: VecDeque<u64>,
    /// Switch-out samples `(time, raw record, state it left in)`.
    samples: VecDeque<(u64, Vec<u8>, Option<SwitchState>)>,
    /// When the thread exited, if it did.
    exited: Option<u64>,
    /// Intervals below the minimum since the last batch.
    short: Unstacked,
    /// Intervals the kernel did not sample since the last batch.
    unsampled: Unstacked,
    /// Time of the last switch-out settled: a sample this old arriving late has lost its records.
    settled: u64,
}

/// Pairs switch-outs with switch-ins and with their samples, per thread. See the module
/// documentation.
pub(crate) struct OffCpu {
    /// Intervals shorter than this are not unwound.
    pub min_ns: u64,
    threads: FastMap<u32, ThreadSwitches>,
    pub stats: OffCpuStats,
}

impl OffCpu {
    /// Nothing seen yet; intervals under `min_ns` are counted but not unwound.
    pub fn new(min_ns: u64) -> OffCpu {
        OffCpu {
            min_ns,
            threads: FastMap::new(),
            stats: OffCpuStats::default(),
        }
    }

    fn thread(&mut self, pid: u32, tid: u32) -> &mut ThreadSwitches {
        let t = self.threads.entry(tid).or_default();
        t.pid = pid;
        t
    }

    /// A `PERF_RECORD_SWITCH` of thread `tid` at `time`.
    pub fn switch(&mut self, pid: u32, tid: u32, time: u64, out: bool, preempt: bool) {
        if out {
            self.stats.switches += 1;
        }
        let t = self.thread(pid, tid);
        // Records of one thread come from several CPUs' rings: keep each queue in time order.
        if out {
            let at = t.outs.partition_point(|o| o.0 <= time);
            t.outs.insert(at, (time, preempt));
            if t.outs.len() > MAX_QUEUED_RECORDS {
                t.outs.pop_front();
                self.stats.unmatched += 1;
            }
        } else {
            let at = t.ins.partition_point(|&i| i <= time);
            t.ins.insert(at, time);
            if t.ins.len() > MAX_QUEUED_RECORDS {
                t.ins.pop_front();
            }
        }
    }

    /// A switch-out sample of thread `tid` taken at `time`, recorded as `raw`, with the state the
    /// thread left in when the kernel said.
    pub fn sample(
        &mut self,
        pid: u32,
        tid: u32,
        time: u64,
        raw: &[u8],
        state: Option<SwitchState>,
    ) {
        self.stats.sampled += 1;
        let t = self.thread(pid, tid);
        if time <= t.settled {
            self.stats.unmatched += 1;
            return;
        }
        // Samples of one thread come from several CPUs' rings: keep them in time order.
        let at = t.samples.partition_point(|s| s.0 <= time);
        t.samples.insert(at, (time, raw.to_vec(), state));
        if t.samples.len() > MAX_QUEUED {
            t.samples.pop_front();
            self.stats.unmatched += 1;
        }
    }

    /// Thread `tid` exited at `time`: its switch-outs that no switch-in ends are dropped.
    pub fn exited(&mut self, tid: u32, time: u64) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.exited = Some(time);
        }
    }

    /// Settles every switch-out whose interval is known: unwound (into `ready`) when the kernel
    /// sampled it, else counted into its thread's unsampled total; below the minimum, into its
    /// short total. With `end` (recording ends), what is still missing will not come: intervals
    /// still open are weighed until `end`, switch-outs whose switch-in was lost are dropped.
    ///
    /// A switch-out at `t` is ended by the thread's first switch-in after `t` (before its next
    /// switch-out). Its sample, if the kernel took one, was written just before the record, in
    /// the same ring: it is the last sample at or before `t`. A switch-in may still be on its way
    /// in another CPU's ring: then the switch-out waits.
    pub fn settle(&mut self, end: Option<u64>, ready: &mut Vec<Ready>) {
        let min_ns = self.min_ns;
        let stats = &mut self.stats;
        self.threads.retain(|_, t| {
            let forced = end.is_some() || t.exited.is_some();
            while let Some(&(out, preempt)) = t.outs.front() {
                let next = t.outs.get(1).map(|o| o.0);
                while t.ins.front().is_some_and(|&i| i <= out) {
                    t.ins.pop_front();
                }
                let tin = t
                    .ins
                    .front()
                    .copied()
                    .filter(|&i| next.is_none_or(|n| i < n));
                let tin = match (tin, end) {
                    (Some(tin), _) => {
                        t.ins.pop_front();
                        Some(tin)
                    }
                    // The next switch-out follows its switch-in in the same ring: that was lost.
                    (None, _) if next.is_some() => None,
                    // Still off the CPU when recording ends.
                    (None, Some(end)) if t.exited.is_none() && end > out => {
                        stats.open_at_end += 1;
                        Some(end)
                    }
                    (None, _) if forced => None,
                    (None, _) => break, // its switch-in is on its way, or still to come
                };
                t.outs.pop_front();
                t.settled = out;
                let mut sample = None;
                while t.samples.front().is_some_and(|s| s.0 <= out) {
                    if sample.replace(t.samples.pop_front()).is_some() {
                        stats.unmatched += 1; // its switch-out record was lost
                    }
                }
                let sample = sample.flatten();
                let Some(tin) = tin else {
                    stats.unmatched += 1;
                    continue;
                };
                let nanos = tin - out;
                if nanos < min_ns {
                    stats.below_min += 1;
                    stats.below_min_ns += nanos;
                    t.short.add(out, nanos);
                    continue;
                }
                let Some((_, raw, state)) = sample else {
                    stats.unsampled += 1;
                    stats.unsampled_ns += nanos;
                    t.unsampled.add(out, nanos);
                    continue;
                };
                stats.unwound += 1;
                stats.unwound_ns += nanos;
                ready.push(Ready {
                    raw,
                    weight: OffWeight {
                        nanos: nanos as i64,
                        reason: OffReason::of(state, preempt),
                    },
                });
            }
            if forced && t.outs.is_empty() {
                // Samples whose switch-out records were lost.
                stats.unmatched += t.samples.len() as u64;
                t.samples.clear();
            }
            // An exited thread is forgotten once nothing of it waits.
            !(t.exited.is_some()
                && t.outs.is_empty()
                && t.short.count == 0
                && t.unsampled.count == 0)
        });
    }

    /// Each thread's intervals counted without a stack since the previous call:
    /// `(pid, tid, last time, nanos, reason)` with reason [`OffReason::Short`] or
    /// [`OffReason::Unsampled`].
    pub fn take_unstacked(&mut self) -> Vec<(u32, u32, u64, i64, OffReason)> {
        let mut out = Vec::new();
        for (&tid, t) in &mut self.threads {
            for (u, reason) in [
                (&mut t.short, OffReason::Short),
                (&mut t.unsampled, OffReason::Unsampled),
            ] {
                if u.count > 0 {
                    out.push((t.pid, tid, u.last, u.nanos as i64, reason));
                    *u = Unstacked::default();
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(ready: &[Ready]) -> Vec<(i64, OffReason, &[u8])> {
        ready
            .iter()
            .map(|r| (r.weight.nanos, r.weight.reason, &r.raw[..]))
            .collect()
    }

    #[test]
    fn a_switch_out_pairs_with_the_next_switch_in_whatever_the_arrival_order() {
        let mut off = OffCpu::new(100);
        let mut ready = Vec::new();
        // The switch-in arrives first (another CPU's ring), with a stale one before it.
        off.switch(1, 2, 500, false, false);
        off.switch(1, 2, 2_000, false, false);
        off.settle(None, &mut ready);
        assert!(ready.is_empty());
        // The sample, then its switch-out record, from the same ring.
        off.sample(1, 2, 999, b"raw", None);
        off.switch(1, 2, 1_000, true, true);
        off.settle(None, &mut ready);
        assert_eq!(
            weights(&ready),
            [(1_000, OffReason::Preempted, &b"raw"[..])]
        );
        // The tracepoint's state says more than the preempted flag.
        off.sample(1, 2, 2_500, b"s", Some(SwitchState::Sleeping));
        off.switch(1, 2, 2_500, true, false);
        off.switch(1, 2, 2_800, false, false);
        // A short interval is counted, not unwound; an open one waits, then ends at the end.
        off.sample(1, 2, 3_000, b"a", Some(SwitchState::Sleeping));
        off.switch(1, 2, 3_000, true, false);
        off.switch(1, 2, 3_050, false, false);
        off.sample(1, 2, 4_000, b"b", Some(SwitchState::Uninterruptible));
        off.switch(1, 2, 4_001, true, false);
        off.settle(None, &mut ready);
        assert_eq!(ready.len(), 2);
        assert_eq!(ready[1].weight.reason, OffReason::Sleeping);
        assert_eq!(off.stats.below_min, 1);
        assert_eq!(
            off.take_unstacked(),
            vec![(1, 2, 3_000, 50, OffReason::Short)]
        );
        off.settle(Some(9_001), &mut ready);
        assert_eq!(
            weights(&ready)[2],
            (5_000, OffReason::Uninterruptible, &b"b"[..])
        );
        assert_eq!(off.stats.open_at_end, 1);
        assert_eq!((off.stats.switches, off.stats.sampled), (4, 4));
    }

    #[test]
    fn a_switch_the_kernel_did_not_sample_keeps_its_time_without_a_stack() {
        let mut off = OffCpu::new(0);
        let mut ready = Vec::new();
        off.sample(1, 2, 100, b"a", Some(SwitchState::Sleeping));
        off.switch(1, 2, 100, true, false);
        off.switch(1, 2, 300, false, false);
        // Two switches over the rate cap: records only.
        off.switch(1, 2, 400, true, false);
        off.switch(1, 2, 1_400, false, false);
        off.switch(1, 2, 1_500, true, true);
        off.switch(1, 2, 1_600, false, false);
        off.sample(1, 2, 2_000, b"b", Some(SwitchState::Runnable));
        off.switch(1, 2, 2_000, true, true);
        off.switch(1, 2, 2_010, false, false);
        off.settle(None, &mut ready);
        assert_eq!(
            weights(&ready),
            [
                (200, OffReason::Sleeping, &b"a"[..]),
                (10, OffReason::Preempted, &b"b"[..])
            ]
        );
        assert_eq!((off.stats.unsampled, off.stats.unsampled_ns), (2, 1_100));
        assert_eq!(
            off.take_unstacked(),
            vec![(1, 2, 1_500, 1_100, OffReason::Unsampled)]
        );
        assert!(off.take_unstacked().is_empty());
    }

    #[test]
    fn a_switch_in_still_on_its_way_is_waited_for_not_replaced_by_a_later_one() {
        let mut off = OffCpu::new(0);
        let mut ready = Vec::new();
        // Two intervals; the first one's switch-in has not arrived, the second's has.
        off.sample(1, 2, 1_000, b"a", None);
        off.switch(1, 2, 1_000, true, true);
        off.settle(None, &mut ready);
        assert!(ready.is_empty());
        off.switch(1, 2, 2_000, false, false);
        off.sample(1, 2, 3_000, b"b", None);
        off.switch(1, 2, 3_000, true, false);
        off.switch(1, 2, 5_000, false, false);
        off.settle(None, &mut ready);
        assert_eq!(
            weights(&ready),
            [
                (1_000, OffReason::Preempted, &b"a"[..]),
                (2_000, OffReason::Blocked, &b"b"[..])
            ]
        );
        // A switch-in lost: the next switch-out (same ring, later) shows it will not come.
        off.sample(1, 2, 6_000, b"c", None);
        off.switch(1, 2, 6_000, true, false);
        off.switch(1, 2, 7_000, true, false);
        off.switch(1, 2, 7_500, false, false);
        off.settle(None, &mut ready);
        assert_eq!(ready.len(), 2);
        assert_eq!(off.stats.unmatched, 1);
        assert_eq!(off.stats.unsampled_ns, 500);
    }

    #[test]
    fn an_exited_thread_s_last_switch_out_is_dropped_and_counted() {
        let mut off = OffCpu::new(0);
        let mut ready = Vec::new();
        off.sample(1, 3, 100, b"x", None);
        off.switch(1, 3, 100, true, false);
        off.exited(3, 150);
        off.settle(Some(1_000), &mut ready);
        assert!(ready.is_empty());
        assert_eq!(off.stats.unmatched, 1);
        // A sample whose switch-out record never came is dropped at the end.
        off.sample(1, 4, 100, b"y", None);
        off.settle(Some(1_000), &mut ready);
        assert!(ready.is_empty());
        assert_eq!(off.stats.unmatched, 2);
    }
}

//! Off-CPU intervals: each thread's switch-out samples paired with the switch-in that ends them.
//!
//! The context-switch event samples a thread as it leaves the CPU (its user registers and stack
//! as they stay while it is off); `PERF_RECORD_SWITCH` records say when it left (and whether it
//! was preempted, i.e. still runnable) and when it entered a CPU again. A thread leaves and
//! enters in strict alternation, so the sample taken at `t` is ended by the thread's first
//! switch-in after `t`, and the switch-out record just before that switch-in gives its reason.
//! Records of one thread come from several CPUs' rings and may arrive in either order across
//! passes, so samples and records queue per thread until they pair.
//!
//! Cost is bounded: an interval shorter than the minimum is counted (and its time added to the
//! thread's `[off-cpu: short, not unwound]` frame) but its stack is not unwound.

use std::collections::VecDeque;

use foldhash::{HashMap as FastMap, HashMapExt};

use crate::perf_event::SwitchState;

/// Most switch-out samples or switch records kept per thread while they wait for their pair
/// (past it the oldest go, counted as unmatched: their partner record was lost).
const MAX_QUEUED: usize = 64;

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
    /// The switch-out record that says why was lost.
    Unknown,
    /// The sum of this thread's intervals below the minimum, not unwound.
    Short,
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
            OffReason::Unknown => pseudo::OFF_CPU_UNKNOWN,
            OffReason::Short => pseudo::OFF_CPU_SHORT,
        }
    }

    /// The reason: from the state the kernel reported when there is one, else from the
    /// switch-out record's preempted flag (None: the record was lost).
    fn of(state: Option<SwitchState>, preempted: Option<bool>) -> OffReason {
        match (state, preempted) {
            (Some(SwitchState::Runnable), _) => OffReason::Preempted,
            (Some(SwitchState::Sleeping), _) => OffReason::Sleeping,
            (Some(SwitchState::Uninterruptible), _) => OffReason::Uninterruptible,
            (Some(SwitchState::Stopped), _) => OffReason::Stopped,
            (Some(SwitchState::Other), _) | (None, Some(false)) => OffReason::Blocked,
            (None, Some(true)) => OffReason::Preempted,
            (None, None) => OffReason::Unknown,
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
    /// Switch-out samples received.
    pub switches: u64,
    /// Intervals weighed and unwound.
    pub unwound: u64,
    /// Nanoseconds off the CPU in unwound intervals.
    pub unwound_ns: u64,
    /// Intervals below the minimum: counted, not unwound.
    pub below_min: u64,
    /// Nanoseconds off the CPU in intervals below the minimum.
    pub below_min_ns: u64,
    /// Switch-out samples that never paired with a switch-in (the thread exited, or a record
    /// was lost): dropped.
    pub unmatched: u64,
    /// Intervals still open when recording ended, weighed until the end.
    pub open_at_end: u64,
}

/// A switch-out sample ready to unwind, with its weight.
pub(crate) struct Ready {
    pub raw: Vec<u8>,
    pub weight: OffWeight,
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
    /// Intervals below the minimum since the last batch: count, nanoseconds, last time.
    short: (u64, u64, u64),
    /// Time of the last sample settled: an older one arriving late has lost its records.
    settled: u64,
}

/// Pairs switch-out samples with switch-ins, per thread. See the module documentation.
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
        let t = self.thread(pid, tid);
        // Records of one thread come from several CPUs' rings: keep each queue in time order.
        if out {
            let at = t.outs.partition_point(|o| o.0 <= time);
            t.outs.insert(at, (time, preempt));
            if t.outs.len() > MAX_QUEUED {
                t.outs.pop_front();
            }
        } else {
            let at = t.ins.partition_point(|&i| i <= time);
            t.ins.insert(at, time);
            if t.ins.len() > MAX_QUEUED {
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
        self.stats.switches += 1;
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

    /// Thread `tid` exited at `time`: its samples that no switch-in ends are dropped.
    pub fn exited(&mut self, tid: u32, time: u64) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.exited = Some(time);
        }
    }

    /// Moves every sample whose interval is known into `ready` (or into its thread's short
    /// total); with `end` (recording ends), what is still missing will not come: intervals
    /// still open are weighed until `end`, samples whose records were lost are dropped.
    ///
    /// The sample at `ts` pairs with a switch-in after `ts` and before the thread's next
    /// switch-out sample, and takes its reason from a switch-out record between the two. Either
    /// record may still be on its way in another CPU's ring: then the sample waits.
    pub fn settle(&mut self, end: Option<u64>, ready: &mut Vec<Ready>) {
        let min_ns = self.min_ns;
        let stats = &mut self.stats;
        self.threads.retain(|_, t| {
            let forced = end.is_some() || t.exited.is_some();
            while let Some(&(ts, _, state)) = t.samples.front() {
                let next = t.samples.get(1).map(|s| s.0);
                while t.ins.front().is_some_and(|&i| i <= ts) {
                    t.ins.pop_front();
                }
                let tin = t
                    .ins
                    .front()
                    .copied()
                    .filter(|&i| next.is_none_or(|n| i < n));
                let (tin, preempt) = match tin {
                    Some(tin) => {
                        let out = t.outs.iter().find(|o| o.0 >= ts && o.0 < tin).map(|o| o.1);
                        if out.is_none() && !forced {
                            break; // its switch-out record is on its way
                        }
                        t.ins.pop_front();
                        while t.outs.front().is_some_and(|o| o.0 < tin) {
                            t.outs.pop_front();
                        }
                        (tin, out)
                    }
                    None => match end {
                        // The last sample of a thread still off the CPU at the end.
                        Some(end) if next.is_none() && t.exited.is_none() && end > ts => {
                            stats.open_at_end += 1;
                            let out = t.outs.iter().find(|o| o.0 >= ts).map(|o| o.1);
                            (end, out)
                        }
                        _ if forced => {
                            t.samples.pop_front();
                            stats.unmatched += 1;
                            continue;
                        }
                        _ => break, // its switch-in is on its way, or still to come
                    },
                };
                t.settled = ts;
                let Some((_, raw, _)) = t.samples.pop_front() else {
                    break;
                };
                let nanos = tin - ts;
                if nanos < min_ns {
                    stats.below_min += 1;
                    stats.below_min_ns += nanos;
                    t.short.0 += 1;
                    t.short.1 += nanos;
                    t.short.2 = ts;
                    continue;
                }
                stats.unwound += 1;
                stats.unwound_ns += nanos;
                let reason = OffReason::of(state, preempt);
                ready.push(Ready {
                    raw,
                    weight: OffWeight {
                        nanos: nanos as i64,
                        reason,
                    },
                });
            }
            // An exited thread is forgotten once nothing of it waits.
            !(t.exited.is_some() && t.samples.is_empty() && t.short.0 == 0)
        });
    }

    /// Each thread's short intervals since the previous call: `(pid, tid, last time, nanos)`.
    pub fn take_short(&mut self) -> Vec<(u32, u32, u64, i64)> {
        let mut out = Vec::new();
        for (&tid, t) in &mut self.threads {
            if t.short.0 > 0 {
                out.push((t.pid, tid, t.short.2, t.short.1 as i64));
                t.short = (0, 0, 0);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_pairs_with_the_next_switch_in_whatever_the_arrival_order() {
        let mut off = OffCpu::new(100);
        let mut ready = Vec::new();
        // The switch-in arrives first (another CPU's ring), with a stale one before it.
        off.switch(1, 2, 500, false, false);
        off.switch(1, 2, 2_000, false, false);
        off.switch(1, 2, 1_001, true, true);
        off.settle(None, &mut ready);
        assert!(ready.is_empty());
        off.sample(1, 2, 1_000, b"raw", None);
        off.settle(None, &mut ready);
        assert_eq!(ready.len(), 1);
        assert_eq!(
            ready[0].weight,
            OffWeight {
                nanos: 1_000,
                reason: OffReason::Preempted
            }
        );
        // A short interval is counted, not unwound; an open one waits, then ends at the end.
        off.sample(1, 2, 3_000, b"a", None);
        off.switch(1, 2, 3_001, true, false);
        off.switch(1, 2, 3_050, false, false);
        off.sample(1, 2, 4_000, b"b", None);
        off.switch(1, 2, 4_001, true, false);
        off.settle(None, &mut ready);
        assert_eq!(ready.len(), 1);
        assert_eq!(off.stats.below_min, 1);
        assert_eq!(off.take_short(), vec![(1, 2, 3_000, 50)]);
        off.settle(Some(9_000), &mut ready);
        assert_eq!(ready[1].weight.nanos, 5_000);
        assert_eq!(ready[1].weight.reason, OffReason::Blocked);
        assert_eq!(off.stats.open_at_end, 1);
    }

    #[test]
    fn a_switch_in_still_on_its_way_is_waited_for_not_replaced_by_a_later_one() {
        let mut off = OffCpu::new(0);
        let mut ready = Vec::new();
        // Two intervals; the first one's switch-in has not arrived, the second's has.
        off.sample(1, 2, 1_000, b"a", None);
        off.switch(1, 2, 1_001, true, true);
        off.sample(1, 2, 3_000, b"b", None);
        off.switch(1, 2, 3_001, true, false);
        off.switch(1, 2, 5_000, false, false);
        off.settle(None, &mut ready);
        assert!(ready.is_empty());
        off.switch(1, 2, 2_000, false, false);
        off.settle(None, &mut ready);
        let weights: Vec<_> = ready.iter().map(|r| r.weight).collect();
        assert_eq!(
            weights,
            [
                OffWeight {
                    nanos: 1_000,
                    reason: OffReason::Preempted
                },
                OffWeight {
                    nanos: 2_000,
                    reason: OffReason::Blocked
                }
            ]
        );
        // A switch-out record still on its way holds the sample back until the end.
        off.sample(1, 2, 6_000, b"c", None);
        off.switch(1, 2, 7_000, false, false);
        off.settle(None, &mut ready);
        assert_eq!(ready.len(), 2);
        off.settle(Some(8_000), &mut ready);
        assert_eq!(ready[2].weight.reason, OffReason::Unknown);
        assert_eq!(ready[2].weight.nanos, 1_000);
    }

    #[test]
    fn an_exited_thread_s_last_sample_is_dropped_and_counted() {
        let mut off = OffCpu::new(0);
        let mut ready = Vec::new();
        off.sample(1, 3, 100, b"x", None);
        off.exited(3, 150);
        off.settle(Some(1_000), &mut ready);
        assert!(ready.is_empty());
        assert_eq!(off.stats.unmatched, 1);
    }
}

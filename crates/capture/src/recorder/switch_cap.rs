//! The off-CPU rate cap: the kernel's stack copy at every switch-out is the cost of off-CPU
//! recording, so past a number of switch-out samples per window the context-switch events are
//! disabled until the window ends. The switch records (a separate event) go on, so every
//! interval's time is still exact: those of the switches not sampled are counted under
//! `[off-cpu: over the rate cap, not unwound]` (see [`super::off_cpu`]).
//!
//! `PERF_EVENT_IOC_DISABLE`/`ENABLE` on an event reach the events its threads inherited, so the
//! cap covers threads created later too. It is checked after every pass over the rings, and the
//! context-switch rings wake the reader every few samples, so a window overshoots by at most a
//! few samples per ring.

use std::time::{Duration, Instant};

use crate::perf_event::PerfEvent;

/// The window the rate is counted over.
const WINDOW: Duration = Duration::from_millis(100);

/// Disables the context-switch events for the rest of a window once it has its samples.
pub(crate) struct SwitchCap {
    per_window: u64,
    start: Instant,
    /// Samples counted when the window started.
    at_start: u64,
    paused: bool,
    /// Windows cut short.
    pub pauses: u64,
}

impl SwitchCap {
    /// At most `max_rate` switch-out samples a second; None for 0 (no cap).
    pub fn new(max_rate: u32) -> Option<SwitchCap> {
        (max_rate > 0).then(|| SwitchCap {
            per_window: (u64::from(max_rate) * WINDOW.as_millis() as u64 / 1000).max(1),
            start: Instant::now(),
            at_start: 0,
            paused: false,
            pauses: 0,
        })
    }

    /// After a pass over the rings that brought the count of switch-out samples to `sampled`:
    /// starts a new window when the current one is over (enabling the events if paused), pauses
    /// the events once this window has its samples. Returns how long until the window ends
    /// while paused (the reader must wake then).
    pub fn after_round(&mut self, sampled: u64, events: &[PerfEvent]) -> Option<Duration> {
        let now = Instant::now();
        if now.duration_since(self.start) >= WINDOW {
            self.start = now;
            self.at_start = sampled;
            if self.paused {
                self.paused = false;
                toggle(events, true);
            }
        }
        if !self.paused && sampled - self.at_start >= self.per_window {
            self.paused = true;
            self.pauses += 1;
            toggle(events, false);
        }
        self.paused
            .then(|| WINDOW.saturating_sub(now.duration_since(self.start)))
    }
}

/// Enables or disables every context-switch sampling event (not the switch records' events).
fn toggle(events: &[PerfEvent], on: bool) {
    for e in events.iter().filter(|e| e.switches().is_some()) {
        // A thread gone since: its event no longer matters.
        let _ = if on { e.enable() } else { e.disable() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_pauses_once_it_has_its_samples_and_resumes_after() {
        let mut cap = SwitchCap::new(100).unwrap();
        assert_eq!(cap.per_window, 10);
        assert_eq!(cap.after_round(9, &[]), None);
        let wait = cap.after_round(10, &[]).expect("paused");
        assert!(wait <= WINDOW);
        assert_eq!(cap.pauses, 1);
        // Still paused within the window, whatever arrives late.
        assert!(cap.after_round(12, &[]).is_some());
        assert_eq!(cap.pauses, 1);
        cap.start -= WINDOW;
        assert_eq!(cap.after_round(12, &[]), None);
        assert_eq!(cap.at_start, 12);
        assert!(SwitchCap::new(0).is_none());
        assert_eq!(SwitchCap::new(1).unwrap().per_window, 1);
    }
}

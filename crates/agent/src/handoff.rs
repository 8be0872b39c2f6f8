//! The hand-off between the capture thread and the exporter thread: the two sample buffers, who
//! holds which, and the counters both update.

use std::sync::atomic::AtomicBool;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::buffer::SampleBuffer;
use crate::stats::Counters;

/// Hand-off state between the two threads.
pub(crate) struct Hand {
    /// The buffer the capture thread writes into.
    pub active: SampleBuffer,
    /// When `active` began (Unix nanoseconds).
    pub active_since_ns: u64,
    /// The empty buffer, unless the exporter holds it.
    pub spare: Option<SampleBuffer>,
    /// A full buffer waiting for the exporter, with the period it covers.
    pub ready: Option<(SampleBuffer, u64, u64)>,
    /// The capture thread has ended.
    pub capture_done: bool,
}

/// What both threads share.
pub(crate) struct Shared {
    /// The buffers.
    pub hand: Mutex<Hand>,
    /// Wakes the exporter (a full buffer, the end of capture).
    pub wake: Condvar,
    /// A stop was requested.
    pub stop: AtomicBool,
    /// When the final export must be over, set when a stop is requested.
    pub deadline: Mutex<Option<Instant>>,
    /// The counters both threads update.
    pub counters: Counters,
}

impl Shared {
    /// The buffers, locked.
    pub fn lock(&self) -> MutexGuard<'_, Hand> {
        // A poisoned lock means the other thread panicked; the data is still consistent enough to
        // count and flush, so keep going.
        self.hand.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ensures the active buffer has room, swapping in the spare when it has not. False when both
/// buffers are full (the escape hatch).
pub(crate) fn make_room(shared: &Shared, hand: &mut Hand, records: usize, bytes: usize) -> bool {
    if hand.active.has_room(records, bytes) {
        return true;
    }
    let Some(spare) = hand.spare.take() else {
        return false;
    };
    let now = crate::now_ns();
    let full = std::mem::replace(&mut hand.active, spare);
    let since = std::mem::replace(&mut hand.active_since_ns, now);
    hand.ready = Some((full, since, now));
    shared.wake.notify_all();
    // A record larger than a whole empty buffer can never fit; it is dropped like any other.
    hand.active.has_room(records, bytes)
}

/// Takes the active buffer for export, putting the spare in its place (the exporter holds no
/// buffer while it waits, so the spare is there unless a full buffer is ready).
pub(crate) fn take_active(hand: &mut Hand) -> Option<(SampleBuffer, u64, u64)> {
    let spare = hand.spare.take()?;
    let now = crate::now_ns();
    let buffer = std::mem::replace(&mut hand.active, spare);
    let since = std::mem::replace(&mut hand.active_since_ns, now);
    Some((buffer, since, now))
}

//! One of the two sample buffers between the capture thread and the exporter thread.
//!
//! A buffer is a preallocated list of [`Record`]s with a byte budget. Records come in stream order:
//! a stack [`Record::Define`] always precedes the first sample that refers to its key, and a
//! [`Record::Evict`] retires a key after its last use. Memory is bounded: the record slots are
//! allocated once, and the frames of defined stacks are counted against the same budget (a
//! definition names its stack in the source's shared table; it does not copy it).

use std::sync::Arc;

use crate::cache::{StackKey, stack_cost};
use crate::process::ProcessInfo;
use crate::stacks::StackRef;

/// One sample, referring to its stack by key.
#[derive(Debug, Clone)]
pub struct SampleRecord {
    /// The stack's key (defined earlier in this buffer or in an earlier one).
    pub key: StackKey,
    /// The sampled process.
    pub process: Arc<ProcessInfo>,
    /// Thread id.
    pub tid: u32,
    /// Time of the sample, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// CPU time the sample stands for, nanoseconds (off-CPU time for an off-CPU sample).
    pub weight_ns: u64,
    /// Bytes allocated, for an allocation sample; 0 for a CPU sample.
    pub alloc_bytes: u64,
    /// An off-CPU sample ([`crate::source::RawSample::off_cpu`]).
    pub off_cpu: bool,
}

/// An entry of the sample stream.
#[derive(Debug, Clone)]
pub enum Record {
    /// A stack enters the cache under `key`.
    Define {
        /// The new key.
        key: StackKey,
        /// The stack, in its source's table.
        stack: StackRef,
    },
    /// The stack under `key` left the cache; the key is not used again.
    Evict {
        /// The retired key.
        key: StackKey,
    },
    /// The source replaced its stack table: every key of a table other than `table` left the
    /// cache and is not used again.
    Retire {
        /// The id of the table still in use ([`crate::StackTable::id`]).
        table: u64,
    },
    /// A sample.
    Sample(SampleRecord),
}

/// Bytes one record slot costs.
pub const RECORD_COST: usize = std::mem::size_of::<Record>();

/// Bytes a definition of a stack of `frames` frames costs in a buffer (slot plus frames).
pub fn define_cost(frames: usize) -> usize {
    RECORD_COST + stack_cost(frames)
}

/// A bounded list of records. See the module documentation.
#[derive(Debug)]
pub struct SampleBuffer {
    records: Vec<Record>,
    slots: usize,
    bytes: usize,
    budget: usize,
    samples: u64,
}

impl SampleBuffer {
    /// An empty buffer with a budget of `budget` bytes (at least a few records).
    pub fn new(budget: usize) -> SampleBuffer {
        let budget = budget.max(RECORD_COST * 4);
        let slots = budget / RECORD_COST;
        SampleBuffer {
            records: Vec::with_capacity(slots),
            slots,
            bytes: 0,
            budget,
            samples: 0,
        }
    }

    /// True when `bytes` more bytes in `records` more records fit.
    pub fn has_room(&self, records: usize, bytes: usize) -> bool {
        self.records.len() + records <= self.slots && self.bytes + bytes <= self.budget
    }

    /// Appends a record; the caller has checked [`SampleBuffer::has_room`] for it.
    pub fn push(&mut self, record: Record) {
        self.bytes += match &record {
            Record::Define { stack, .. } => define_cost(stack.depth as usize),
            Record::Evict { .. } | Record::Retire { .. } => RECORD_COST,
            Record::Sample(_) => {
                self.samples += 1;
                RECORD_COST
            }
        };
        self.records.push(record);
    }

    /// The records, in stream order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Number of sample records.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// True when the buffer holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes used, as counted against the budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Empties the buffer, keeping its allocation.
    pub fn clear(&mut self) {
        self.records.clear();
        self.bytes = 0;
        self.samples = 0;
    }
}
